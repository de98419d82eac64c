"""The ``cowrite`` streaming source: ``spark.readStream.format("cowrite").load(path)``.

::

    register(spark)
    (spark.readStream.format("cowrite")
       .option("hoodie.datasource.streaming.startOffset", "earliest")  # or latest, or a completion time
       .load("s3://bucket/orders"))

Offsets are completion times (``{"completion_time": "20261121093000123"}``; ``null`` before the first
commit). A micro-batch ``(start, end]`` holds the rows written by the data commits completed after
``start`` and at or before ``end`` — what an incremental read of that range returns
(``hoodie.datasource.query.type=incremental``): each commit's own rows, not the rows it copied. ``end`` is
a watermark (:func:`cowrite.local.read.watermark`): the newest completion time of a data commit in one
look at the timeline, or of the daemon's END_COMMIT_TIME overlay when it is fresh. Every commit completed
at or before it is on the timeline the batch is planned from (unless archived meanwhile: data loss,
below), and a write still pending then completes after it. So a slow commit that completes after a
faster one that began later lands in a later batch, not in none, and not in two. Spark writes each
batch's ``(start, end)`` to its checkpoint before running it; a restarted query plans the same range again
and gets the same commits and rows.

Options:

- ``hoodie.datasource.streaming.startOffset`` (Hudi's name): ``earliest`` (default: after the newest
  commit archival already moved out of the timeline, if any; an incremental read cannot return those),
  ``latest`` (what completes after the query starts: its first micro-batch runs at once, empty when
  nothing completed, so that Spark records where the query stands and a restart does not move past what
  completed meanwhile) or a completion time (what completed after it). It counts for a new query only; a
  restarted one resumes from its checkpoint.
- ``failOnDataLoss`` (Spark's name, default true): commits of a batch that archival moved out of the
  timeline, or whose base files the cleaner deleted, before the batch was read cannot be read. By default
  the query fails with :class:`StreamDataLossError`, naming them. With ``false`` the batch reads every
  commit of its range still readable, whole, and skips the lost ones, logged as a warning.
- ``cowrite.streaming.overlay.max.age.ms`` (default 0: never): take the watermark from the daemon's
  overlay when the daemon wrote it at most that long ago (by the storage's clock against this one), and
  from a listing of the timeline otherwise. Either is a correct watermark; the overlay lags the timeline
  by up to two of the daemon's polls and saves a listing per trigger.
- ``cowrite.read.filters``: as for batch reads, pruning partitions and filtering rows.

The stream's schema is the table's current one when the query starts (the batch reader's, meta columns
included); files written before a column existed read it as null.

Spark runs the driver-side calls (offsets, planning) in a Python process of their own and the reads in
tasks, each from a pickle of the reader: between calls the reader keeps its options, and the last offset
of a ``Trigger.AvailableNow`` run, nothing else.

A batch's driver-side cost: a listing of the timeline and of the archive, the commit files not read
before (each is read once per process), and a listing of each partition the batch reads, to find cleaned
files before the tasks do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

import cowrite.spark.options as spark_keys
from cowrite.errors import BaseFileGoneError, ConfigError, CowriteError, StreamDataLossError
from cowrite.format.instant import check_time
from cowrite.format.overlay import CommitEntry, Head, head
from cowrite.format.table import Table
from cowrite.format.timeline import InstantRange, archived
from cowrite.local.read import watermark
from cowrite.spark.filters import Predicate, predicates
from cowrite.spark.handover import Settings
from cowrite.spark.reader import FileToRead, Scan, completed_between, file_partitions, plan_commits
from cowrite.storage.backend import Storage

log = logging.getLogger(__name__)

FAIL_ON_DATA_LOSS_OPTION = "failOnDataLoss"  # as users spell it (Spark's Kafka source)
OFFSET_KEY = "completion_time"
UNRECORDED = "unrecorded"  # marks the initial offset of a query started at the latest commit


def stream_reader(settings: Settings, schema: StructType) -> CowriteStreamReader:
    """The reader of ``readStream.format("cowrite")``; ``schema`` is the table's (the data source's)."""
    if not schema.fields:
        raise ConfigError(
            f"the table at {settings.uri} has no commit yet, so no schema: start the stream once it has one"
        )
    return CowriteStreamReader(settings, to_arrow_schema(schema, timezone="UTC"))


def offset(completion_time: str | None) -> dict[str, Any]:
    return {OFFSET_KEY: completion_time}


def time_of(position: dict[str, Any]) -> str | None:
    value = position.get(OFFSET_KEY)
    return None if value is None else check_time(str(value))


def _later(a: str | None, b: str | None) -> str | None:
    return max(a, b) if a is not None and b is not None else a or b


class CowriteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets from watermarks, micro-batches planned as incremental reads, one input partition per file."""

    def __init__(self, settings: Settings, schema: pa.Schema) -> None:
        config = settings.config
        self.settings = settings
        self.schema = schema
        self.start = config.get(spark_keys.START_OFFSET)
        self.fail_on_data_loss = config.get(spark_keys.FAIL_ON_DATA_LOSS)
        self.overlay_max_age = config.get(spark_keys.OVERLAY_MAX_AGE_MS) / 1000
        self.rules: tuple[Predicate, ...] = predicates(config.get(spark_keys.READ_FILTERS))
        self.available_now: tuple[str | None] | None = None  # (the last offset) of a Trigger.AvailableNow run

    # -- on the driver ------------------------------------------------------------------------------
    def initialOffset(self) -> dict[str, Any]:
        table = self.settings.table()
        if self.start == spark_keys.LATEST:
            # Spark records an offset only with the batch that ends there: a query stopped before its
            # first batch would take "latest" anew when restarted, past what completed meanwhile. This
            # offset differs from every later one, so the first trigger runs a batch (empty when nothing
            # completed since) and Spark records where the query stands.
            return {**offset(self.watermark(table)), UNRECORDED: True}
        if self.start == spark_keys.EARLIEST:
            return offset(earliest(table))
        return offset(self.start)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        """The newest watermark, never before ``start``; under Trigger.AvailableNow, the one taken when the
        run began. Only Spark's default read limit (everything available) is known: no option sets another."""
        newest = self.available_now[0] if self.available_now else self.watermark(self.settings.table())
        return offset(_later(time_of(start) if start else None, newest))

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now = (self.watermark(self.settings.table()),)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        table = self.settings.table()
        scan = plan_micro_batch(
            table, time_of(start), time_of(end), self.rules, self.schema, self.fail_on_data_loss
        )
        return file_partitions(table, scan, self.schema)

    def watermark(self, table: Table) -> str | None:
        fresh = self.fresh_log(table)
        return fresh.watermark if fresh is not None else watermark(table)

    def fresh_log(self, table: Table) -> Head | None:
        """The head of the daemon's END_COMMIT_TIME log if the daemon wrote it within the allowed age;
        otherwise (or if it is unreadable: a warning) None, and the watermark comes from the timeline."""
        if self.overlay_max_age <= 0:
            return None
        try:
            found = head(table.storage)
        except CowriteError as exc:
            log.warning("the END_COMMIT_TIME log of %s is of no use (%s); listing the timeline", table, exc)
            return None
        if found is None or time.time() - found.written > self.overlay_max_age:
            return None
        return found

    # -- in the tasks -------------------------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FileToRead)
        try:
            yield from partition.reading.read([0])
        except BaseFileGoneError as exc:
            raise StreamDataLossError(
                f"{exc}. It went while a micro-batch read it: restart the query, which plans the batch "
                f"again and finds the loss ({FAIL_ON_DATA_LOSS_OPTION}=false skips what is lost)"
            ) from exc


def earliest(table: Table) -> str | None:
    """Where ``earliest`` starts: after the newest completion time archival moved out of the timeline.

    Archival moves the oldest instants by requested time, so a commit may stay on the timeline with an
    earlier completion time than an archived one: it is not read, and a warning names it.
    """
    gone = max((i.completion_time or "" for i in archived(table.storage).data_commits()), default="") or None
    if gone is not None:
        passed = [
            i.requested_time for i in table.timeline().data_commits().completed_in(InstantRange.until(gone))
        ]
        if passed:
            log.warning(
                "the stream from %s starts after %s, the newest completion time archival moved out of the "
                "timeline; commits %s completed before it and are not read",
                table,
                gone,
                ", ".join(passed),
            )
    return gone


# -- planning a micro-batch -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lost:
    """A commit of a micro-batch's range that cannot be read, and why."""

    requested_time: str
    completion_time: str
    why: str

    def __str__(self) -> str:
        return f"{self.requested_time} (completed {self.completion_time}; {self.why})"


def plan_micro_batch(
    table: Table,
    since: str | None,
    until: str | None,
    rules: Sequence[Predicate],
    schema: pa.Schema,
    fail_on_data_loss: bool = True,
) -> Scan:
    """The scan of micro-batch ``(since, until]``: the rows its commits wrote, into ``schema``.

    Commits of the range that archival moved away, or whose base files (those the scan reads) the
    cleaner deleted, are lost: :class:`StreamDataLossError` names them, or, without ``fail_on_data_loss``,
    the scan skips them whole and a warning names them. A file deleted after this check fails the task
    reading it (:meth:`CowriteStreamReader.read`).
    """
    entries = completed_between(table, since, until)
    listed = {e.requested_time for e in entries}
    window = InstantRange.within(since, until)
    lost = [
        Lost(i.requested_time, i.completion_time or "", "archived")
        for i in archived(table.storage).data_commits()
        if i.completion_time in window and i.requested_time not in listed
    ]
    while True:  # skipping a commit may make an older, cleaned file the newest of its group
        scan = plan_commits(table, entries, rules, schema=schema)
        cleaned = _cleaned(table.storage, entries, scan.files)
        if not cleaned:
            break
        lost += cleaned
        gone = {c.requested_time for c in cleaned}
        entries = [e for e in entries if e.requested_time not in gone]
    if not lost:
        return scan
    lost.sort(key=lambda c: c.completion_time)
    if fail_on_data_loss:
        shown = ", ".join(map(str, lost[:5])) + (f" (+{len(lost) - 5} more)" if len(lost) > 5 else "")
        raise StreamDataLossError(
            f"micro-batch ({since}, {until}] of the stream from table {table.name} ({table.uri}) cannot be "
            f"read: commits {shown} were lost before the stream read them. {FAIL_ON_DATA_LOSS_OPTION}=true "
            f"(the default) stops the query here; set {FAIL_ON_DATA_LOSS_OPTION}=false to skip what is lost "
            "and read on (each skipped commit is logged), or start a new query. Keep more commits "
            "(hoodie.keep.min.commits, hoodie.cleaner.commits.retained) for consumers that fall behind"
        )
    log.warning(
        "micro-batch (%s, %s] of the stream from %s skips commits it can no longer read (%s=false): %s",
        since,
        until,
        table,
        FAIL_ON_DATA_LOSS_OPTION,
        ", ".join(map(str, lost)),
    )
    return scan


def _cleaned(storage: Storage, entries: Sequence[CommitEntry], files: Iterable[str]) -> list[Lost]:
    """The commits among ``entries`` that wrote to a file group whose file in ``files`` is gone."""
    missing = _missing(storage, files)
    if not missing:
        return []
    groups = {(p, f) for e in entries for p, f, path in e.written if path in missing}
    return [
        Lost(e.requested_time, e.completion_time, "base files cleaned")
        for e in entries
        if any((p, f) in groups for p, f, _ in e.written)
    ]


def _missing(storage: Storage, files: Iterable[str]) -> set[str]:
    """Those of ``files`` no longer on storage: one listing per partition rather than one request per file."""
    wanted = set(files)
    present = {info.path for d in {p.rpartition("/")[0] for p in wanted} for info in storage.list(d)}
    return wanted - present
