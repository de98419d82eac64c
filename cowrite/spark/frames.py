"""Spark helpers of the driver: statistics Spark knows without a job, job failures as cowrite errors,
and the small DataFrame steps both write pipelines use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from cowrite.errors import CowriteError
from cowrite.format.table import Table
from cowrite.spark.append import discard
from cowrite.spark.errors import translate
from cowrite.spark.executor import STAT, TASK

log = logging.getLogger(__name__)

T = TypeVar("T")


def discard_marked(table: Table, instant: str, stats: Sequence[Any]) -> None:
    """The marked files of a failed write, deleted; what cannot be deleted now the rollback finds."""
    try:
        discard(table.storage, instant, stats)
    except CowriteError as exc:
        log.warning("could not delete the files of failed instant %s of %s: %s", instant, table.name, exc)


def known_size(df: DataFrame) -> tuple[int, int] | None:
    """(rows, bytes in memory) of ``df`` if Spark knows them without running a job — the statistics of
    a cached input's plan — else None. Statistics are a hint: a plan that cannot give them gives none."""
    try:
        stats = df._jdf.queryExecution().optimizedPlan().stats()
        count = stats.rowCount()
        if not count.isDefined():
            return None
        return int(str(count.get())), int(str(stats.sizeInBytes()))
    except Exception:  # a plan without statistics, a gateway that cannot answer
        return None


def row_count(df: DataFrame) -> int | None:
    """The rows of ``df`` if Spark knows them without a job (see :func:`known_size`), else None."""
    known = known_size(df)
    return known[0] if known else None


def bytes_per_row(df: DataFrame) -> float | None:
    """Bytes per row of ``df`` in memory if Spark knows them without a job, else None."""
    known = known_size(df)
    return known[1] / known[0] if known and known[0] > 0 else None


class LazySample:
    """Stands in for the prepared input in ``estimate_record_bytes``: sampled only if it is consulted."""

    def __init__(self, load: Callable[[], pa.Table]) -> None:
        self._load = load
        self._table: pa.Table | None = None

    def _get(self) -> pa.Table:
        if self._table is None:
            self._table = self._load()
        return self._table

    @property
    def nbytes(self) -> int:
        return int(self._get().nbytes)

    @property
    def num_rows(self) -> int:
        return int(self._get().num_rows)


def with_task(frame: DataFrame) -> DataFrame:
    """``frame`` with the Spark task that holds each row in ``TASK``."""
    return frame.withColumn(TASK, F.spark_partition_id())


def carried(frame: DataFrame) -> list[str]:
    """The ``STAT`` texts the tasks behind ``frame`` reported (see :func:`.executor.carrying`)."""
    return [r[0] for r in frame.where(F.col(STAT).isNotNull()).select(STAT).collect()]


def is_persisted(df: DataFrame) -> bool:
    level = df.storageLevel
    return bool(level.useMemory or level.useDisk)


@contextmanager
def translated() -> Iterator[None]:
    """Spark job failures as cowrite errors (see :func:`.errors.translate`)."""
    try:
        yield
    except CowriteError:
        raise
    except PySparkException as exc:
        raise translate(exc) from exc
    except Exception as exc:  # py4j errors of a broken gateway and the like
        if type(exc).__module__.startswith(("py4j", "pyspark")):
            raise translate(exc) from exc
        raise
