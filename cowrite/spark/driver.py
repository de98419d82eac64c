"""What both write pipelines of the driver share: the table, the session, the settings, the metrics,
and how a Spark job is run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pyspark.sql import DataFrame, SparkSession

from cowrite.errors import ConfigError, TxnAlreadyCommittedError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.table import Table
from cowrite.protocol.transaction import WriteOptions
from cowrite.spark.batching import ARROW_BYTES_PER_PARQUET_BYTE, ArrowBatches
from cowrite.spark.executor import TableSpec, stamp
from cowrite.spark.frames import bytes_per_row, translated
from cowrite.spark.operations import SparkOperation, WriteMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")


class Driver:
    """A :class:`~.engine.SparkWriter`'s state; the pipelines (:mod:`.inserts`, :mod:`.merging`) extend it."""

    def __init__(
        self, table: Table, spark: SparkSession, options: WriteOptions | None = None, source: str = "input"
    ) -> None:
        if table.uri.startswith("memory://"):
            raise ConfigError(
                f"{table.uri}: Spark executors are separate processes and cannot reach an in-memory table; "
                "use a local path or s3://"
            )
        self.table = table
        self.spark = spark
        self.options = options or WriteOptions(config=table.config)
        self.config = self.options.config
        self.source = source
        self.spec = TableSpec.of(table, self.config, source)
        self.metrics = WriteMetrics()
        self.refused: TxnAlreadyCommittedError | None = None  # why the last write committed nothing
        self._read: Any = None  # accumulators of index files read and pruned, while a write runs
        self._pruned: Any = None
        self._batches = ArrowBatches(spark)  # the Arrow batch settings of the running write

    def _metadata(
        self,
        operation: SparkOperation,
        stats: Sequence[Any],
        replaced: dict[str, tuple[str, ...]],
        schema: str,
    ) -> CommitMetadata:
        return CommitMetadata(operation.value, tuple(stats), replaced, schema)

    def _parallelism(self, key: keys.ConfigKey[int]) -> int:
        configured = self.config.get(key)
        if configured > 0:
            return configured
        return int(self.spark.conf.get("spark.sql.shuffle.partitions") or 200)

    def _run(self, name: str, job: Callable[[], T]) -> T:
        """Run one Spark job, its failure translated (see :func:`.errors.translate`)."""
        started = time.monotonic()
        with translated():
            result = job()
        log.debug("%s on %s: %.2f s", name, self.table.name, time.monotonic() - started)
        return result

    def _write_tasks(self) -> int:
        """At most this many tasks write routed file groups: one per core of the cluster.

        Route keys spread file groups evenly over the tasks; a second task per core balanced nothing
        more on the benchmark and cost its fixed share.
        """
        return max(1, self.spark.sparkContext.defaultParallelism)

    def _fit_batches(self, df: DataFrame, record_bytes: float | None) -> None:
        """Arrow batches fitted to the rows' size: from the table's files, else from what Spark knows of
        a cached input, else from a sample of the input (a small job; only a table without files and an
        input Spark does not hold can need it)."""
        if record_bytes is not None:
            self._batches.fit(record_bytes * ARROW_BYTES_PER_PARQUET_BYTE)
            return
        in_memory = bytes_per_row(df)
        if in_memory is None:
            sample = stamp(self._run("sample", lambda: df.limit(1000).toArrow()), self.spec)
            in_memory = sample.nbytes / max(sample.num_rows, 1)
        self._batches.fit(in_memory)
