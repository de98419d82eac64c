"""The size of the Arrow batches Spark hands to Python workers while a write runs.

Spark bounds those batches by rows (``spark.sql.execution.arrow.maxRecordsPerBatch``) and by bytes
(``spark.sql.execution.arrow.maxBytesPerBatch``, 64 MiB by default). It checks the byte bound by
measuring the batch under construction after *every row* it adds, walking all its vectors: a large share
of the JVM's work of moving rows to Python (a Java Flight Recorder profile of ``bench/spark_write.py``
shows it), itself a cost of the order of Spark's own parquet write of the same rows. Spark skips the check
only when the byte bound is exactly ``Int.MaxValue``.

So while a write runs, :class:`ArrowBatches` sets the byte bound to that value and bounds batches by
rows instead: the session's row bound, lowered for wide rows to what the session's byte bound holds at
the write's estimated size per row (:meth:`ArrowBatches.fit`). Both settings are restored afterwards.
Writes running at once on one session (threads) share the change; the last to finish restores the
settings the first one found.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from cowrite.process import keep

MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
MAX_RECORDS = "spark.sql.execution.arrow.maxRecordsPerBatch"
UNCHECKED_BYTES = str(2**31 - 1)  # the one value at which Spark does not measure batches row by row
DEFAULT_MAX_BYTES = 64 << 20
DEFAULT_MAX_RECORDS = 10_000
# a row takes about this many times its size in a base file in memory (estimate_record_bytes's ratio)
ARROW_BYTES_PER_PARQUET_BYTE = 3


def size_in_bytes(size: str, default: int) -> int:
    """A Spark size setting ("10485760b", "10m", "-1") in bytes; -1 (disabled) stays -1."""
    text = size.strip().lower().removesuffix("b")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(text[-1:], 1)
    try:
        return int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        return default


class _Saved:
    """The settings the first of the running writes found, and how many writes are running."""

    def __init__(self, spark: Any) -> None:
        conf = spark.conf
        self.explicit = {key: conf.get(key, None) for key in (MAX_BYTES, MAX_RECORDS)}
        self.max_bytes = size_in_bytes(conf.get(MAX_BYTES) or "", DEFAULT_MAX_BYTES)
        try:
            self.max_records = int(conf.get(MAX_RECORDS) or DEFAULT_MAX_RECORDS)
        except ValueError:
            self.max_records = DEFAULT_MAX_RECORDS
        self.writes = 0

    def restore(self, spark: Any) -> None:
        for key, value in self.explicit.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


_LOCK = threading.Lock()
_RUNNING: dict[int, _Saved] = {}  # id of the SparkSession -> its saved settings, while writes run
keep(
    f"{__name__}._RUNNING",
    "one entry per SparkSession with a write running",
    "writes of one session share its Arrow batch settings and restore them when the last one ends",
    size=lambda: len(_RUNNING),
    clear=None,
)


class ArrowBatches:
    """``with ArrowBatches(spark) as batches:`` — batches bounded by rows only, restored at the end."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._saved: _Saved | None = None

    def __enter__(self) -> ArrowBatches:
        with _LOCK:
            saved = _RUNNING.get(id(self.spark))
            if saved is None:
                saved = _RUNNING[id(self.spark)] = _Saved(self.spark)
            saved.writes += 1
            self._saved = saved
            self.spark.conf.set(MAX_BYTES, UNCHECKED_BYTES)
            self.spark.conf.set(MAX_RECORDS, str(saved.max_records))
        return self

    def fit(self, row_bytes: float) -> int:
        """Bound batches of rows of about ``row_bytes`` (Arrow, in memory) by the session's byte bound.

        Returns the rows per batch now in force.
        """
        saved = self._saved
        if saved is None:
            raise RuntimeError("ArrowBatches.fit outside its with block")
        rows = saved.max_records if saved.max_records > 0 else 2**31 - 1
        if saved.max_bytes > 0 and row_bytes > 0:
            rows = min(rows, max(1, int(saved.max_bytes / row_bytes)))
        with _LOCK:
            self.spark.conf.set(MAX_RECORDS, str(rows))
        return rows

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        with _LOCK:
            saved.writes -= 1
            if saved.writes == 0:
                _RUNNING.pop(id(self.spark), None)
                saved.restore(self.spark)
