"""The ``cowrite`` streaming sink: ``df.writeStream.format("cowrite")`` appends each micro-batch as one
instant, exactly once across restarts.

::

    register(spark)
    (df.writeStream.format("cowrite")
       .option("checkpointLocation", checkpoint)
       .option("hoodie.datasource.write.recordkey.field", "id")   # the data source's options
       .start("s3://bucket/orders"))

Each micro-batch is an ``insert`` (or ``bulk_insert``) carrying the txn (query id, batch id)
(:mod:`cowrite.protocol.txn`): a restarted query keeps its id (Spark keeps it in the checkpoint), so a
batch replayed after its commit landed but before Spark recorded it commits nothing the second time.

What Spark 4.3 does, found by experiment, and what the sink makes of it:

- ``streamWriter`` runs in a driver-side Python process when a micro-batch is planned, and again in
  another one to commit or abort it; no process lives from a batch's tasks to its commit, and the commit
  learns the batch id only. The tasks learn the query id and the batch id from their local properties.
- So the tasks begin the instant. The first task of a micro-batch begins it and claims the batch by
  creating ``.hoodie/.cowrite/streams/<query id>/<batch id>.<attempt>`` only if absent (the instant, its
  owner and the completed instants it began on); the other tasks, and Spark's retries of tasks, join the
  claimed instant while it is live. A claim whose instant is gone, aborted, past its lease or already
  being committed is claimed anew (the next attempt); one whose instant completed means the batch was
  committed: the tasks write nothing.
- Tasks write new file groups with markers (:class:`~.append.NewFileGroups`) and report their stats.
- ``commit`` takes the instant over (``Transaction.adopt``) and commits it through the one commit path;
  ``abort`` deletes what the markers name and marks the instant failed. Either deletes the query's claims.

A micro-batch that loses a write conflict is written again as a new instant by the committing process
(its rows read back from the lost instant's files), up to ``hoodie.write.num.retries.on.conflict.failures``
times; then, or on any other failure to commit, ``commit`` raises and the query stops with that error
(Spark calls ``abort``). New file groups conflict with nobody under the default file-group strategy, so
only a stricter strategy makes a sink lose. A crash leaves the instant's markers and heartbeat (the lazy
rollback's work) and the batch's claim, which the query's next commit deletes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

import cowrite.spark.options as spark_keys
from cowrite.engine.commit import complete, write_instant
from cowrite.engine.contract import current_schema, fit
from cowrite.engine.operations import Operation, prepare
from cowrite.errors import (
    CommitFailedError,
    ConfigError,
    CowriteError,
    LeaseLostError,
    TxnAlreadyCommittedError,
    WriteConflictError,
)
from cowrite.format import claims
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.config import Config
from cowrite.format.fs_view import open_base_file
from cowrite.format.instant import Action, State
from cowrite.format.table import Table
from cowrite.protocol.heartbeat import Heartbeat, abort_reason, heartbeat_path
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.protocol.txn import Txn
from cowrite.spark.append import (
    delete_markers,
    delete_unreported,
    discard,
    record_bytes_of,
    write_new_file_groups,
)
from cowrite.spark.executor import TableSpec, check_lease, stat_from_json, stat_to_json
from cowrite.spark.handover import WRITE_OPERATIONS, Settings, Ticket, adopt, open_or_create, txn_of
from cowrite.storage.backend import Storage

log = logging.getLogger(__name__)

# The local properties Spark gives the tasks of a micro-batch (StreamExecution.QUERY_ID_KEY and
# MicroBatchExecution.BATCH_ID_KEY): the query's id, kept across restarts from one checkpoint, and the batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
CLAIMS_DIR = ".hoodie/.cowrite/streams"


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of one streaming query: the sink's txn is (query id, batch id)."""

    query_id: str
    batch_id: int

    @classmethod
    def current(cls) -> MicroBatch:
        """The micro-batch this Spark task belongs to; :class:`CowriteError` outside a streaming query."""
        from pyspark import TaskContext

        context = TaskContext.get()
        query = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
        batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
        if not query or batch is None:
            raise CowriteError(
                "the cowrite stream writer runs in the tasks of a micro-batch only (no streaming query id "
                "or batch id in this task's local properties)"
            )
        return cls(query, int(batch))

    @property
    def txn(self) -> Txn:
        return Txn(self.query_id, self.batch_id)

    def claim_path(self, attempt: int) -> str:
        return f"{CLAIMS_DIR}/{self.query_id}/{self.batch_id}.{attempt}"


@dataclass(frozen=True)
class Claim:
    """The instant an attempt at a micro-batch writes under, as its claim file records it."""

    attempt: int
    instant: str
    owner: str
    seen: frozenset[str]  # requested times of the instants completed when it began

    def to_bytes(self) -> bytes:
        return json.dumps({"instant": self.instant, "owner": self.owner, "seen": sorted(self.seen)}).encode()

    @classmethod
    def read(cls, storage: Storage, batch: MicroBatch, attempt: int) -> Claim:
        found = json.loads(storage.read(batch.claim_path(attempt)))
        return cls(attempt, found["instant"], found["owner"], frozenset(found["seen"]))


def claim_attempts(storage: Storage, batch: MicroBatch) -> list[int]:
    """The attempts claimed for ``batch``, in order."""
    prefix = f"{batch.batch_id}."
    names = storage.names(f"{CLAIMS_DIR}/{batch.query_id}")
    return sorted(int(n[len(prefix) :]) for n in names if n.startswith(prefix) and n[len(prefix) :].isdigit())


def forget_claims(storage: Storage, query_id: str, up_to: int) -> None:
    """Delete the claims of ``query_id``'s micro-batches up to ``up_to``: they are committed or given up."""
    for name in storage.names(f"{CLAIMS_DIR}/{query_id}"):
        batch = name.split(".", 1)[0]
        if batch.isdigit() and int(batch) <= up_to:
            storage.delete(f"{CLAIMS_DIR}/{query_id}/{name}")


@dataclass
class BatchReport(WriterCommitMessage):
    """What one task of a micro-batch did: wrote ``stats`` (JSON) under ``instant`` (claimed by
    ``attempt``), or nothing because ``committed_by`` committed the batch before."""

    query_id: str
    batch_id: int
    instant: str | None = None
    attempt: int = 0
    stats: tuple[str, ...] = ()
    committed_by: str | None = None


def stream_writer(settings: Settings, schema: StructType, overwrite: bool) -> CowriteStreamWriter:
    """The sink's writer; :class:`ConfigError` for options it cannot honour (as the batch writer's)."""
    operation = settings.config.get(spark_keys.WRITE_OPERATION).lower()
    if operation not in WRITE_OPERATIONS:
        raise ConfigError(
            f"{spark_keys.WRITE_OPERATION.key}={operation}: the streaming sink writes "
            f"{' or '.join(WRITE_OPERATIONS)}; for upserts and deletes use "
            "writeStream.foreachBatch(cowrite.spark.upsert_each_batch(table)) (or delete_each_batch)"
        )
    if overwrite:
        raise ConfigError('the cowrite streaming sink appends: use outputMode("append")')
    if txn_of(settings) is not None:
        raise ConfigError(
            "txnAppId / txnVersion are for batch writes: the streaming sink makes each micro-batch "
            "idempotent by the query's id and the batch id"
        )
    table = open_or_create(settings)
    config = table.config.with_values(settings.values)
    current = current_schema(table)
    fitted = fit(to_arrow_schema(schema, timezone="UTC"), current, table)
    prepare(table, fitted.target.empty_table(), Operation.INSERT, "input", current)
    return CowriteStreamWriter(
        settings=settings,
        operation=operation,
        spec=TableSpec.of(table, config),
        config=config.raw(),
        target=fitted.target,
        commit_schema=fitted.table_schema,
        record_bytes=record_bytes_of(table, table.timeline()),
        max_file_bytes=config.get(keys.PARQUET_MAX_FILE_SIZE),
    )


@dataclass
class CowriteStreamWriter(DataSourceStreamArrowWriter):
    """Tasks claim the micro-batch's instant and write new file groups; the driver side commits it."""

    settings: Settings
    operation: str
    spec: TableSpec
    config: dict[str, str]
    target: pa.Schema
    commit_schema: str
    record_bytes: float | None
    max_file_bytes: int
    _table: Table | None = field(default=None, repr=False)

    def table(self) -> Table:
        if self._table is None:
            self._table = Table.load(self.settings.uri, **dict(self.settings.storage_options))
        return self._table

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_table": None}  # a table holds clients; each process opens its own

    def options(self, txn: Txn | None) -> WriteOptions:
        return WriteOptions(config=Config(self.config), txn=txn)

    # -- on executors --------------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> BatchReport:
        return self.write_batch(iterator, MicroBatch.current())

    def write_batch(self, iterator: Iterator[pa.RecordBatch], batch: MicroBatch) -> BatchReport:
        """A task's work: claim or join the micro-batch's instant and write the rows as new file groups
        (nothing if the batch was committed before); raises what writing raises (the batch aborts)."""
        claimed = self._claim(batch)
        if isinstance(claimed, str):
            return BatchReport(batch.query_id, batch.batch_id, committed_by=claimed)
        written = write_new_file_groups(
            self.spec,
            claimed.instant,
            claimed.owner,
            self.target,
            self.max_file_bytes,
            self.record_bytes,
            iterator,
        )
        stats = tuple(stat_to_json(s) for s in written)
        return BatchReport(batch.query_id, batch.batch_id, claimed.instant, claimed.attempt, stats)

    def _claim(self, batch: MicroBatch) -> Claim | str:
        """The live claim of ``batch`` (made now if there is none), or the instant that committed it."""
        table = self.table()
        storage = table.storage
        while True:
            attempts = claim_attempts(storage, batch)
            attempt = attempts[-1] + 1 if attempts else 0
            if attempts:
                claim = Claim.read(storage, batch, attempts[-1])
                state = self._state(table, claim)
                if state is State.COMPLETED:
                    return claim.instant
                if state is State.REQUESTED:
                    return claim
            try:
                transaction = Transaction.begin(table, self.operation, Action.COMMIT, self.options(batch.txn))
            except TxnAlreadyCommittedError as exc:
                return exc.committed_by
            assert transaction.instant is not None and transaction.heartbeat is not None
            mine = Claim(
                attempt,
                transaction.instant_time,
                transaction.holder.owner,
                transaction.begin_timeline.completed().requested_times,
            )
            transaction.share_lease()  # before the claim: whoever joins judges the instant by it
            transaction.heartbeat.stop(delete=False)  # the tasks renew it; this one may end first
            if storage.create_if_absent(batch.claim_path(attempt), mine.to_bytes()):
                return mine
            # another task claimed this attempt first: nothing was written under ours
            storage.delete(heartbeat_path(mine.instant))
            claims.withdraw(
                table, transaction.instant, f"another task claimed micro-batch {batch.batch_id} first"
            )

    def _state(self, table: Table, claim: Claim) -> State | None:
        """COMPLETED if the claim's instant committed, REQUESTED if tasks may still join it, else None."""
        instant = table.timeline().get(claim.instant)
        if instant is None or instant.state is not State.REQUESTED:
            return instant.state if instant is not None and instant.is_completed else None
        try:
            check_lease(table.storage, claim.instant, self.spec.heartbeat)
        except LeaseLostError:
            return None
        return State.REQUESTED

    # -- on the driver -------------------------------------------------------------------------------
    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Commit the micro-batch's instant (or nothing, for a batch committed before). Raises
        :class:`CommitFailedError` when it cannot: the query stops with that error."""
        reports = _reports(messages, batchId)
        if not reports:
            return
        table = self.table()
        batch = MicroBatch(reports[0].query_id, batchId)
        written = {r.instant: r.attempt for r in reports if r.instant is not None}
        if not written:
            log.info("micro-batch %d of query %s was committed before", batchId, batch.query_id)
        elif len(written) > 1:
            raise CommitFailedError(
                f"the tasks of micro-batch {batchId} of query {batch.query_id} wrote under instants "
                f"{', '.join(sorted(written))} of table {table.name} (a claim lost its lease while tasks "
                "wrote): nothing committed; the restarted query writes the batch again"
            )
        else:
            ((instant, attempt),) = written.items()
            stats = [stat_from_json(text) for r in reports for text in r.stats]
            self._commit(table, batch, Claim.read(table.storage, batch, attempt), stats)
        forget_claims(table.storage, batch.query_id, batchId)

    def _commit(self, table: Table, batch: MicroBatch, claim: Claim, stats: list[WriteStat]) -> None:
        storage = table.storage
        delete_unreported(storage, claim.instant, stats)
        ticket = Ticket(
            uri=self.settings.uri,
            storage_options=self.settings.storage_options,
            config=self.config,
            instant=claim.instant,
            operation=self.operation,
            seen=claim.seen,
            owner=claim.owner,
            txn=batch.txn,
        )
        # the plan names no file, the markers name them all: a lost conflict leaves the files to retry from
        plan = CommitMetadata(self.operation, (), {}, self.commit_schema)
        try:
            complete(adopt(table, ticket, plan), replace(plan, write_stats=tuple(stats)))
        except TxnAlreadyCommittedError as exc:  # committed meanwhile by another attempt of the batch
            log.info("nothing written: %s", exc)
            discard(storage, claim.instant, stats)
        except WriteConflictError as lost:
            self._retry(table, batch, claim.instant, stats, lost)
        delete_markers(storage, claim.instant)

    def _retry(
        self, table: Table, batch: MicroBatch, lost: str, stats: list[WriteStat], why: WriteConflictError
    ) -> None:
        """Write the micro-batch again as a new instant after instant ``lost`` lost the conflict ``why``,
        as often as configured; raises :class:`CommitFailedError` naming the last conflict when no retry
        is left (nothing committed then)."""
        retries = Config(self.config).get(keys.RETRIES_ON_CONFLICT)
        rows = self._rows_of(table.storage, stats) if retries else self.target.empty_table()
        discard(table.storage, lost, stats)
        for attempt in range(retries):
            log.warning(
                "micro-batch %d of query %s: retrying as a new instant (%d of %d): %s",
                batch.batch_id, batch.query_id, attempt + 1, retries, why,
            )  # fmt: skip
            try:
                self._write_again(table, batch, rows)
                return
            except WriteConflictError as exc:
                why = exc
        raise CommitFailedError(
            f"micro-batch {batch.batch_id} of query {batch.query_id} lost a write conflict on table "
            f"{table.name} after {retries} retries ({keys.RETRIES_ON_CONFLICT.key}): {why}"
        ) from why

    def _write_again(self, table: Table, batch: MicroBatch, rows: pa.Table) -> None:
        """One retry: ``rows`` written and committed as a new instant, from this process."""
        began: list[str] = []
        try:
            write_instant(
                table,
                self.operation,
                Action.COMMIT,
                self.options(batch.txn),
                lambda transaction: self._rewrite(transaction, rows, began),
            )
        except BaseException as exc:  # the abort deleted the planned files; what the markers name goes too
            for instant in began:
                discard(table.storage, instant)
            if not isinstance(exc, TxnAlreadyCommittedError):
                raise
            log.info("nothing written: %s", exc)  # committed meanwhile by another attempt of the batch
            return
        for instant in began:
            delete_markers(table.storage, instant)

    def _rows_of(self, storage: Storage, stats: Sequence[WriteStat]) -> pa.Table:
        """The micro-batch's records, read back from the base files its tasks wrote."""
        columns = list(self.target.names)
        parts = []
        for stat in stats:
            with open_base_file(storage, stat.path) as stream:
                parts.append(pq.read_table(stream, columns=columns))
        return pa.concat_tables(parts) if parts else self.target.empty_table()

    def _rewrite(self, transaction: Transaction, rows: pa.Table, began: list[str]) -> CommitMetadata:
        """Write ``rows`` as new file groups of ``transaction`` (in this process) and plan them."""
        began.append(transaction.instant_time)
        transaction.share_lease()  # the writer checks it before each file
        stats = tuple(
            write_new_file_groups(
                self.spec,
                transaction.instant_time,
                transaction.holder.owner,
                self.target,
                self.max_file_bytes,
                self.record_bytes,
                rows.to_batches(),
                renew=False,
            )
        )
        metadata = CommitMetadata(self.operation, stats, {}, self.commit_schema)
        transaction.plan(metadata)  # an abort deletes them from the plan
        return metadata

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Give the micro-batch up: every instant its tasks wrote under, unless it completed, is marked
        failed and its marked files deleted (a task without a message left markers)."""
        reports = _reports(messages, batchId)
        table = self.table()
        storage = table.storage
        timeline = table.timeline()
        queries = {r.query_id for r in reports}
        instants = {r.instant for r in reports if r.instant is not None}
        for query in queries:  # the failed tasks' claims too
            batch = MicroBatch(query, batchId)
            instants |= {Claim.read(storage, batch, a).instant for a in claim_attempts(storage, batch)}
        for instant in sorted(instants):
            found = timeline.get(instant)
            if found is not None and found.is_completed:
                continue  # committed (by this batch's commit, which failed afterwards): nothing to undo
            if abort_reason(storage, instant) is None:  # a failed commit has told why already
                Heartbeat(storage, instant, self.spec.heartbeat, "").mark_aborted("error")
            reported = [stat_from_json(t) for r in reports if r.instant == instant for t in r.stats]
            discard(storage, instant, reported)
        for query in queries:
            forget_claims(storage, query, batchId)


def _reports(messages: Sequence[WriterCommitMessage | None], batch_id: int) -> list[BatchReport]:
    reports = [m for m in messages if isinstance(m, BatchReport)]
    strays = sorted({r.batch_id for r in reports} - {batch_id})
    if strays:  # Spark handed this batch's writer to another batch's tasks: nothing can be trusted
        raise CommitFailedError(f"micro-batch {batch_id} received the reports of micro-batches {strays}")
    return reports
