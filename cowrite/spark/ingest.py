"""Continuous ingestion of the files arriving in a directory (``cowrite stream``), in the spirit of Hudi's
HoodieStreamer: a Structured Streaming query whose every micro-batch is one instant, exactly once across
restarts from one checkpoint.

The query's source is Spark's file source over the directory in format ``binaryFile``, used for what it
remembers rather than for what it reads: each trigger it lists the directory, takes up to
``maxFilesPerTrigger`` new files, oldest first, and records in the checkpoint which files make micro-batch
N before running it, so a restarted query hands batch N the same files. A file counts once, by its name,
if the name ends as the format's do (``.json``/``.jsonl``/``.ndjson``, ``.csv``, ``.parquet``) and does
not start with ``.`` or ``_`` (Spark skips those): write a file under a hidden name and rename it into
place, so that no micro-batch reads half of it. Changing a file after it was read changes nothing.

Each micro-batch's files are read as ``cowrite write`` reads its input (:func:`.command.write`):
parquet by Spark (once its footers showed no column of an Arrow extension type, which Spark would read as
its storage type), CSV and JSON Lines by cowrite's reader with the table's column types as the batch
begins. So a file is held to the table's schema exactly as a ``cowrite write`` of it would be — a column
the table lacks is added, a value that does not fit is refused naming its column and line — and not by
Spark's JSON and CSV readers with a schema fixed when the query started, which drop the columns they do
not know and read a value that does not parse as null.

The batch is then written by an :class:`~.each_batch.EachBatch`, the ``foreachBatch`` helpers' writer: one
instant carrying the txn (query id, batch id), so a batch replayed after its commit landed but before Spark
recorded it commits nothing. An empty batch (a file without records) writes no instant, as Hudi does. A batch
that fails (its input refused, a conflict lost past the retries, a lost lease) stops the query and
:meth:`Ingestion.run` raises that error; nothing of the batch is visible, and the next run from the checkpoint
tries it again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from cowrite.engine.contract import current_schema
from cowrite.engine.inputs import parquet_footers, read_input
from cowrite.errors import SchemaError, TxnAlreadyCommittedError
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.spark.each_batch import EachBatch
from cowrite.spark.errors import translate
from cowrite.spark.operations import SparkOperation

__all__ = ["FORMATS", "Ingested", "Ingestion", "Summary"]

# The input formats: how cowrite's reader names each, and the names of the files that count.
FORMATS = {
    "json": ("jsonl", "*.{json,jsonl,ndjson}"),
    "csv": ("csv", "*.csv"),
    "parquet": ("parquet", "*.parquet"),
}
_FILES = "path string, modificationTime timestamp, length long, content binary"  # binaryFile's own
_WAIT = 1  # seconds between looks at a stop request while the query runs
_RECORD_WAIT = 30.0  # seconds Spark has, at a stop, to record the micro-batch just written
# Where Spark logs a query's failure, with the stack trace of every layer: the command says it in one line.
_QUERY_LOGGERS = ("org.apache.spark.sql.execution.streaming",)


@dataclass(frozen=True)
class Ingested:
    """What one micro-batch did: ``instant`` is the commit it made (None: nothing written), ``refused``
    why nothing was written when the batch had been committed before."""

    batch_id: int
    operation: str
    files: tuple[str, ...]
    records: int
    instant: Instant | None
    refused: TxnAlreadyCommittedError | None


@dataclass
class Summary:
    """The micro-batches of one run."""

    batches: int = 0
    commits: int = 0
    records: int = 0
    committed_before: int = 0

    def add(self, batch: Ingested) -> None:
        self.batches += 1
        if batch.refused is not None:
            self.committed_before += 1
        elif batch.instant is not None:
            self.commits += 1
            self.records += batch.records


class _StopRequested(Exception):
    """Raised by a micro-batch that Spark starts after a stop was requested: it begins nothing, and Spark,
    which records a batch only once its function returned, hands it to the next run."""


class Ingestion:
    """The ``foreachBatch`` function of ``cowrite stream`` and the query around it.

    ``operation`` is ``upsert``, ``insert`` or ``delete``; ``input_format`` a key of :data:`FORMATS`;
    ``settings`` override the table's write settings; ``on_batch`` hears of every micro-batch written
    (from the thread that wrote it).
    """

    def __init__(
        self,
        table: Table,
        operation: str,
        input_format: str,
        settings: dict[str, str] | None = None,
        on_batch: Callable[[Ingested], None] = lambda batch: None,
    ) -> None:
        self.table = table
        self.reader_format, self.file_names = FORMATS[input_format]
        self.operation = SparkOperation(operation)
        self.writes = EachBatch(table, self.operation, settings=dict(settings or {}))
        self.on_batch = on_batch
        self.summary = Summary()
        self.error: BaseException | None = None  # what stopped the query, raised by a micro-batch
        self._writing = threading.Lock()  # held while a micro-batch is written
        self._stopping = False
        self._last_written: int | None = None  # the last micro-batch written, maybe not yet recorded

    def start(
        self,
        spark: SparkSession,
        directory: str,
        checkpoint: str,
        max_files_per_trigger: int = 1,
        once: bool = False,
        interval: float = 1.0,
    ) -> StreamingQuery:
        """Start the query on ``directory`` with its progress in ``checkpoint``: with ``once``, it writes
        the files present now (``Trigger.AvailableNow``) and ends; otherwise it looks at the directory
        every ``interval`` seconds until stopped. Raises what Spark raises for a checkpoint it cannot use,
        as a cowrite error."""
        files = (
            spark.readStream.format("binaryFile")
            .schema(_FILES)
            .option("pathGlobFilter", self.file_names)
            .option("maxFilesPerTrigger", max_files_per_trigger)
            .load(directory)
            .select("path")  # the file's content is not read: the batch reads the files itself
        )
        writer = files.writeStream.foreachBatch(self).option("checkpointLocation", checkpoint)
        trigger = {"availableNow": True} if once else {"processingTime": f"{interval} seconds"}
        writer = writer.trigger(**trigger)
        try:
            return writer.start()
        except (PySparkException, Py4JError) as exc:
            raise translate(exc) from None

    def run(self, query: StreamingQuery, stop: threading.Event) -> Summary:
        """Wait until ``query`` ends (``Trigger.AvailableNow``: once the files present at its start are
        written) or ``stop`` is set; then stop it cleanly (:meth:`stop`).

        Returns what this run wrote; raises the error of the micro-batch that stopped the query, or of
        the query itself, as a cowrite error (nothing of the failed batch is visible).
        """
        failure: BaseException | None = None
        try:
            while not stop.is_set() and not query.awaitTermination(_WAIT):
                pass
        except (PySparkException, Py4JError) as exc:
            failure = exc
        if stop.is_set():
            try:
                self.stop(query)
            except (PySparkException, Py4JError) as exc:
                failure = failure or exc
        stopped_here = isinstance(self.error, _StopRequested)
        if self.error is not None and not stopped_here:
            raise translate(self.error)
        if failure is not None and not stopped_here:
            raise translate(failure) from None
        return self.summary

    def stop(self, query: StreamingQuery) -> None:
        """Stop ``query`` between two micro-batches: the one being written, if any, is finished first
        (committed or failed) and, once written, recorded by Spark (else the next run would write it
        again, committing nothing); a micro-batch Spark starts later begins nothing."""
        with self._writing:
            self._stopping = True
        deadline = time.monotonic() + _RECORD_WAIT
        while query.isActive and time.monotonic() < deadline and not self._recorded(query):
            time.sleep(0.05)
        query.stop()

    def _recorded(self, query: StreamingQuery) -> bool:
        """Whether Spark finished the last micro-batch written (its progress is reported after its commit)."""
        if self._last_written is None:
            return True
        progress = query.lastProgress
        return progress is not None and progress.batchId >= self._last_written

    def __call__(self, files: DataFrame, batch_id: int) -> None:
        """Write micro-batch ``batch_id``; raises (stopping the query) whatever its write raised."""
        with self._writing:
            if self._stopping:
                self.error = _StopRequested()
                raise self.error
            try:
                batch = self._write(files, batch_id)
            except BaseException as exc:
                self.error = exc
                raise
            self._last_written = batch_id
            self.summary.add(batch)
            self.on_batch(batch)

    def _write(self, files: DataFrame, batch_id: int) -> Ingested:
        paths = tuple(sorted(local_path(row.path) for row in files.collect()))
        spark = files.sparkSession
        if self.reader_format == "parquet":
            records = sum(footer.num_rows for footer in parquet_footers(paths))
            frame = spark.read.parquet(*paths) if records else None
        else:
            data = read_text(paths, self.reader_format, current_schema(self.table))
            records = data.num_rows
            frame = spark.createDataFrame(data) if records else None
        if frame is None:
            return Ingested(batch_id, self.operation.value, paths, 0, None, None)
        self.writes(frame, batch_id, source=", ".join(Path(p).name for p in paths))
        return Ingested(batch_id, self.operation.value, paths, records, self.writes.last, self.writes.refused)


def read_text(paths: Sequence[str], reader_format: str, schema: pa.Schema | None) -> pa.Table:
    """The records of CSV or JSON Lines files, parsed with ``schema``'s types (the table's) as ``cowrite
    write`` parses them; raises :class:`SchemaError` for a file or a value that does not fit."""
    tables = [read_input(path, reader_format, schema) for path in paths]
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        problem = str(exc).strip().splitlines()[0]
        names = ", ".join(paths)
        raise SchemaError(f"the files {names} do not share their columns' types: {problem}") from None


def local_path(uri: str) -> str:
    """A path of the local file system from the URI Spark's file source gives (``file:/dir/name``)."""
    if not uri.startswith("file:"):
        raise SchemaError(f"{uri}: cowrite stream reads files of the local file system only")
    path = uri.removeprefix("file:")
    return path.removeprefix("//") if path.startswith("///") else path


def quiet(spark: SparkSession) -> None:
    """Keep Spark's log to errors, and without the query's own: what stops the query, the command says in
    one line (:meth:`Ingestion.run` raises it)."""
    spark.sparkContext.setLogLevel("ERROR")
    jvm: Any = spark.sparkContext._jvm  # noqa: SLF001 (log4j is reached through the gateway only)
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    off = jvm.org.apache.logging.log4j.Level.OFF
    for name in _QUERY_LOGGERS:
        configurator.setLevel(name, off)
