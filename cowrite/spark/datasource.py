"""The ``cowrite`` Spark data source (Spark 4's Python data source API), with Hudi's option names.

::

    register(spark)  # once per session
    (df.write.format("cowrite").mode("append")
       .option("hoodie.datasource.write.recordkey.field", "id")
       .option("hoodie.datasource.write.partitionpath.field", "region")
       .option("hoodie.datasource.write.precombine.field", "ts")
       .save("s3://bucket/orders"))
    spark.read.format("cowrite").load(path)                                       # snapshot
    spark.read.format("cowrite").option("as.of.instant", "20261121093000000").load(path)  # time travel
    (spark.read.format("cowrite").option("hoodie.datasource.query.type", "incremental")
       .option("hoodie.datasource.read.begin.instanttime", checkpoint).load(path))  # by completion time
    spark.readStream.format("cowrite").load(path)                                 # a stream (.source)

Writes are ``insert`` (the default here) and ``bulk_insert``: each task writes its own rows as new file
groups of the target size. What a data source write cannot do — shuffle rows to the file group that
holds their key — rules out upsert, delete and insert_overwrite, and filling small file groups: use
:class:`~cowrite.spark.engine.SparkWriter` for those. Only ``mode("append")`` is accepted
(Spark's Python data sources know append and overwrite; overwrite would need insert_overwrite).
The first write creates the table from the write options (record key required). With Delta's
``txnAppId`` / ``txnVersion`` options a write is idempotent (:mod:`cowrite.protocol.txn`): a version of
the application already committed, or older than one committed, writes and commits nothing.
``df.writeStream.format("cowrite")`` takes the same options and appends each micro-batch as one
instant, exactly once across restarts (:mod:`.sink`). ``spark.readStream.format("cowrite").load(path)``
reads the table as a stream: offsets are completion times, each micro-batch holds the rows of the commits
completed since the previous one, every commit read once however writers interleave (:mod:`.source`).

How one write commits, across the processes Spark uses:

1. ``DataSource.writer`` (a Python process on the driver) validates the schema exactly as the local
   engine does, then begins the transaction. That process does not live until the commit, so the
   heartbeat thread stops there; the heartbeat file stays and the writing tasks renew it.
2. Each task writes new file groups. Its driver cannot know the file names in advance, so before each
   base file the task creates a marker (:mod:`cowrite.format.markers`): a crash leaves files that the
   rollback still finds.
3. ``commit`` (another driver-side process) takes over the instant (``Transaction.adopt``) if its
   lease is still live, deletes files of failed task attempts (marked but not reported), publishes the
   plan and commits; ``abort`` deletes every marked file and marks the instant failed. The tasks' writer
   and the driver's cleanup are :mod:`.append`'s, shared with ``SparkWriter``'s inserts.

Reads return Hudi's meta columns (as Hudi's data source does). Partition pruning takes its filters
from the ``cowrite.read.filters`` option (JSON), not from Spark's filter pushdown (``pushFilters``):
Spark 4.3 keeps the read plan that pushdown produced on the *relation*, so every later query of the same
DataFrame would read only the first query's partitions — a ``df.where(p = 'a')`` followed by
``df.count()`` counts partition ``a`` only (checked against Spark 4.3.0). An option is part of the
relation itself, so it cannot leak into other queries. ``SparkWriter``'s readers
(:func:`~cowrite.spark.reader.snapshot`) take the same filters as a Python argument.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

import cowrite.spark.options as spark_keys
from cowrite.engine.commit import complete
from cowrite.engine.contract import current_schema, fit
from cowrite.engine.operations import Operation, prepare
from cowrite.errors import (
    ConfigError,
    TxnAlreadyCommittedError,
)
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action
from cowrite.format.table import Table
from cowrite.protocol.heartbeat import Heartbeat
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.spark.append import (
    delete_markers,
    delete_unreported,
    discard,
    record_bytes_of,
    write_new_file_groups,
)
from cowrite.spark.executor import TableSpec, stat_from_json, stat_to_json
from cowrite.spark.filters import Predicate, predicates
from cowrite.spark.handover import WRITE_OPERATIONS, Settings, Ticket, adopt, open_or_create, txn_of
from cowrite.spark.reader import FileToRead, Scan, file_partitions, plan_incremental, plan_snapshot
from cowrite.spark.sink import stream_writer
from cowrite.spark.source import stream_reader

log = logging.getLogger(__name__)

NAME = "cowrite"


def register(spark: SparkSession) -> None:
    """Make ``format("cowrite")`` known to ``spark``."""
    spark.dataSource.register(CowriteDataSource)


class CowriteDataSource(DataSource):
    """``format("cowrite")``: reads (snapshot, time travel, incremental), appending writes, and both
    as streams."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        settings = Settings.of(self.options)
        rules = predicates(settings.config.get(spark_keys.READ_FILTERS))
        return from_arrow_schema(_plan(settings, settings.table(), rules).schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        settings = Settings.of(self.options)
        return CowriteReader(settings, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The write's writer; with ``txnAppId`` / ``txnVersion`` of a version already committed (or
        older than one committed) a writer that writes and commits nothing, as Delta does."""
        return _begin_write(Settings.of(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        """``writeStream.format("cowrite")``: each micro-batch one instant, exactly once (:mod:`.sink`)."""
        return stream_writer(Settings.of(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        """``readStream.format("cowrite")``: micro-batches of the commits completed between two
        watermarks, each commit read once (:mod:`.source`)."""
        return stream_reader(Settings.of(self.options), schema)


# -- reading -----------------------------------------------------------------------------------------------
def _plan(settings: Settings, table: Table, rules: Sequence[Predicate]) -> Scan:
    config = settings.config
    query = config.get(spark_keys.QUERY_TYPE).lower()
    if query in ("snapshot", "read_optimized"):
        as_of = config.get(spark_keys.AS_OF_INSTANT) or None
        return plan_snapshot(table, as_of=as_of, filters=rules, with_meta=True)
    if query == "incremental":
        since = config.get(spark_keys.READ_BEGIN_INSTANTTIME) or None
        until = config.get(spark_keys.READ_END_INSTANTTIME) or None
        return plan_incremental(table, since, until, filters=rules, with_meta=True)
    raise ConfigError(f"{spark_keys.QUERY_TYPE.key}={query}: use snapshot, read_optimized or incremental")


class CowriteReader(DataSourceReader):
    """Plans the scan on the driver (one input partition per base file); tasks read their file."""

    def __init__(self, settings: Settings, schema: StructType) -> None:
        self.settings = settings
        self.schema = to_arrow_schema(schema, timezone="UTC")
        self.rules: tuple[Predicate, ...] = predicates(settings.config.get(spark_keys.READ_FILTERS))

    def partitions(self) -> Sequence[InputPartition]:
        table = self.settings.table()
        return file_partitions(table, _plan(self.settings, table, self.rules), self.schema)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FileToRead)
        yield from partition.reading.read([0])


# -- writing -----------------------------------------------------------------------------------------------
@dataclass
class CommitStats(WriterCommitMessage):
    """What one task wrote: write stats as JSON."""

    stats: tuple[str, ...] = ()


def _begin_write(settings: Settings, schema: StructType, overwrite: bool) -> DataSourceWriter:
    operation = settings.config.get(spark_keys.WRITE_OPERATION).lower()
    if operation not in WRITE_OPERATIONS:
        raise ConfigError(
            f"{spark_keys.WRITE_OPERATION.key}={operation}: the data source writes "
            f"{' or '.join(WRITE_OPERATIONS)}; an upsert, delete or insert_overwrite needs a shuffle "
            "first: use "
            "cowrite.spark.SparkWriter(table, spark).upsert(df) (or .delete, .insert_overwrite)"
        )
    if overwrite:
        raise ConfigError(
            'the cowrite data source appends: use .mode("append"); to replace partitions use '
            "SparkWriter(table, spark).insert_overwrite(df)"
        )
    txn = txn_of(settings)
    table = open_or_create(settings)
    config = table.config.with_values(settings.values)
    options = WriteOptions(config=config, txn=txn)
    current = current_schema(table)
    fitted = fit(to_arrow_schema(schema, timezone="UTC"), current, table)
    prepare(table, fitted.target.empty_table(), Operation.INSERT, "input", current)
    try:
        transaction = Transaction.begin(table, operation, Action.COMMIT, options)
    except TxnAlreadyCommittedError as exc:  # a replayed batch: nothing begun, nothing to write
        log.info("nothing written: %s", exc)
        return NothingToWrite()
    transaction.share_lease()  # the tasks renew it from now on
    assert transaction.heartbeat is not None
    transaction.heartbeat.stop(delete=False)  # this process may be gone before the commit
    ticket = Ticket(
        uri=settings.uri,
        storage_options=table.storage.portable_options(),  # the tasks run where the driver's env is not
        config=config.raw(),
        instant=transaction.instant_time,
        operation=operation,
        seen=transaction.begin_timeline.completed().requested_times,
        owner=transaction.holder.owner,
        txn=txn,
    )
    return CowriteWriter(
        ticket=ticket,
        spec=TableSpec.of(table, config),
        target=fitted.target,
        commit_schema=fitted.table_schema,
        record_bytes=record_bytes_of(table, transaction.begin_timeline),
        max_file_bytes=config.get(keys.PARQUET_MAX_FILE_SIZE),
    )


@dataclass
class CowriteWriter(DataSourceArrowWriter):
    """Tasks write new file groups; the driver side commits or aborts the begun instant."""

    ticket: Ticket
    spec: TableSpec
    target: pa.Schema  # every batch is conformed to the table's schema (see ..contract)
    commit_schema: str
    record_bytes: float | None
    max_file_bytes: int

    # -- on executors --------------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> CommitStats:
        ticket = self.ticket
        stats = write_new_file_groups(
            self.spec,
            ticket.instant,
            ticket.owner,
            self.target,
            self.max_file_bytes,
            self.record_bytes,
            iterator,
        )
        return CommitStats(tuple(stat_to_json(s) for s in stats))

    # -- on the driver -------------------------------------------------------------------------------
    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        ticket = self.ticket
        table = ticket.table()
        stats = _stats(messages)
        delete_unreported(table.storage, ticket.instant, stats)
        metadata = CommitMetadata(ticket.operation, tuple(stats), {}, self.commit_schema)
        try:
            complete(adopt(table, ticket, metadata), metadata)
        except TxnAlreadyCommittedError as exc:  # committed meanwhile by another process; files deleted
            log.info("nothing written: %s", exc)
        delete_markers(table.storage, ticket.instant)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        ticket = self.ticket
        table = ticket.table()
        Heartbeat(table.storage, ticket.instant, ticket.policy, ticket.owner).mark_aborted("error")
        discard(table.storage, ticket.instant, _stats(messages))


class NothingToWrite(DataSourceArrowWriter):
    """The writer of a write whose txn is already committed: its tasks read nothing and write nothing."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> CommitStats:
        return CommitStats()

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


def _stats(messages: Sequence[WriterCommitMessage | None]) -> list[WriteStat]:
    return [
        stat_from_json(text)
        for message in messages
        if isinstance(message, CommitStats)
        for text in message.stats
    ]
