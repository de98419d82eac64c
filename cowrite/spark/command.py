"""``cowrite write --engine spark``: the CLI's write through a SparkSession.

Parquet inputs are read by Spark itself: a directory of parquet files never passes through the driver,
which reads only their footers. CSV and JSON Lines go through the CLI's own reader so that they are
parsed with the table's column types exactly as for ``--engine local``. Settings whose name starts with
``spark.`` configure the session this command creates (``-o spark.driver.memory=2g``); an already active
session (a caller that made one) is used as it is and left running.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from cowrite.engine.contract import current_schema
from cowrite.engine.inputs import input_files, parquet_footers, read_input
from cowrite.errors import TxnAlreadyCommittedError
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.protocol.transaction import WriteOptions
from cowrite.spark.engine import SparkWriter


def session(master: str, settings: Mapping[str, str]) -> tuple[SparkSession, bool]:
    """The active session, or a new one for ``master`` (True: this call created it)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    if master.startswith("local"):
        # executors are children of this machine: the same Python, and no public interface to bind
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName("cowrite write")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for name, value in settings.items():
        if name.startswith("spark."):
            builder = builder.config(name, value)
    return builder.getOrCreate(), True


def write(
    table: Table,
    options: WriteOptions,
    input_path: str,
    input_format: str | None,
    operation: str,
    master: str,
) -> tuple[Instant | None, int, TxnAlreadyCommittedError | None]:
    """Write the input as one instant with the Spark engine; returns the instant, the records written and,
    for a write whose txn was already committed, why nothing was (:meth:`SparkWriter.write`). A parquet
    input with a column of an Arrow extension type is refused before Spark starts (Spark would read the
    column as its storage type)."""
    files = input_files(input_path)
    parquet = input_format == "parquet" or input_format is None and all(f.suffix == ".parquet" for f in files)
    if parquet:
        parquet_footers(files)  # read for their check alone: it raises before Spark starts
    spark, created = session(master, options.config.raw())
    try:
        writer = SparkWriter(table, spark, options, source=input_path)
        if parquet:
            frame = spark.read.parquet(*(str(f) for f in files))
        else:  # text is parsed with the table's types
            frame = spark.createDataFrame(read_input(input_path, input_format, current_schema(table)))
        instant = writer.write(frame, operation)
        return instant, writer.metrics.input_rows, writer.refused
    finally:
        if created:
            spark.stop()
