"""The local engine: one process writes Arrow tables with pyarrow, no Spark; the operations and their
semantics are every engine's (:mod:`cowrite.engine.operations`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import cached_property, partial

import pyarrow as pa
import pyarrow.compute as pc

from cowrite.engine.commit import retry_on_conflict, write_instant
from cowrite.engine.contract import commit_schema, schema_of
from cowrite.engine.file_group import FileGroupWrite, RecentFiles, write_file_group
from cowrite.engine.operations import Operation, prepare
from cowrite.engine.planning import (
    FILE_ID,
    Bucket,
    SizingPolicy,
    estimate_record_bytes,
    index_keys,
    plan_buckets,
    planned_stat,
    tag_locations,
    to_work,
)
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY
from cowrite.errors import CowriteError, InstantGoneError, TxnAlreadyCommittedError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.fs_view import EarlyListing, FileSystemView, timeline_start
from cowrite.format.instant import Action, Instant, State
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.key_summary import INSERTED_KEYS, KeySummary
from cowrite.protocol.sketch import Sketch, leaves_alone, noted_sketches
from cowrite.protocol.table_schema import latest_schema
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.protocol.txn import committing_instant
from cowrite.steps import Step, reached
from cowrite.storage.together import beside

log = logging.getLogger(__name__)


class LocalWriter:
    """Writes Arrow tables into one table from this process.

    With ``options.txn`` (an application id and version, :class:`~cowrite.protocol.txn.Txn`) every
    write is idempotent: when that version, or a newer one of the application, is already committed,
    it commits nothing and returns the instant that committed the application's last version (None if
    that instant is no longer on the timeline nor in the archive); :attr:`refused` then says why.
    """

    def __init__(self, table: Table, options: WriteOptions | None = None) -> None:
        self.table = table
        self.options = options or WriteOptions(config=table.config)
        self._recent = RecentFiles()
        self._list_early = True  # whether the next write lists its partitions beside its claim
        self._alone = False  # the last write's listing showed no other write pending, nor a commit unknown
        self._listed: EarlyListing | None = None  # the files of the last write's partitions, after it
        self.records = 0  # records of the last write, after deduplication where the operation merges
        self.refused: TxnAlreadyCommittedError | None = None  # why the last write committed nothing

    def insert(self, data: pa.Table) -> Instant | None:
        return self.write(data, Operation.INSERT)

    def upsert(self, data: pa.Table) -> Instant | None:
        return self.write(data, Operation.UPSERT)

    def delete(self, data: pa.Table) -> Instant | None:
        return self.write(data, Operation.DELETE)

    def insert_overwrite(self, data: pa.Table) -> Instant | None:
        return self.write(data, Operation.INSERT_OVERWRITE)

    def write(self, data: pa.Table, operation: Operation | str, source: str = "input") -> Instant | None:
        """Write ``data`` as one instant and return it; on a conflict retry as configured, each time a
        new instant.

        ``data`` is held to the table's schema first (:mod:`.contract`): what does not fit raises
        :class:`SchemaError` before anything is written. A write whose txn is already committed (see the
        class) returns the instant that committed it instead, having written nothing — or, when another
        process of the application committed it meanwhile, having deleted what it wrote.
        """
        operation = Operation(operation)
        self.refused = None
        held = HeldInput.of(self.table, data, operation, source)
        self.records = held.prepared.num_rows
        try:
            return retry_on_conflict(self.options.config, lambda: self._write_once(held))
        except TxnAlreadyCommittedError as exc:
            log.info("nothing written: %s", exc)
            self.refused = exc
            self.records = 0
            return committing_instant(self.table, exc)

    # -- one instant -----------------------------------------------------------------------------
    def _write_once(self, held: HeldInput) -> Instant:
        knew = self.table.known_timeline()  # the plan is drafted from it; nothing is listed before the claim
        known = knew.completed_times
        early: list[EarlyListing] = []
        drafts: dict[str, Draft] = {}  # by the instant time each names
        ahead: dict[str, list[WriteStat]] = {}  # the files written ahead of the listing, by instant time
        written: list[tuple[CommitMetadata, Draft, frozenset[str], frozenset[str]]] = []
        kept = self._listed  # the files of these partitions as this process's last write left them
        if kept is not None and (held.partitions is None or kept.partitions != tuple(held.partitions)):
            kept = None

        def list_early() -> None:  # beside the claim; a failure only costs the listing after it
            if kept is not None:
                early.append(kept)  # what this process knows needs no request: the timeline confirms it
                return
            try:
                early.append(EarlyListing.take(self.table, held.named_partitions, known))
            except CowriteError as exc:
                log.info("listing %s before the timeline failed: %s", held.partitions, exc)

        def draft(instant: str) -> CommitMetadata | None:
            # beside the claim (before it, where the write goes ahead), from the timeline this process knew;
            # written beside the listing after it, it stands if that shows the same commits (a lone writer),
            # else the write plans again on it
            if not early:
                return None
            claim = Instant(instant, held.operation.action, State.REQUESTED)  # as the listing shows it
            expected = knew.adding([claim])
            try:
                drafts[instant] = self._draft(instant, held, expected, early[0])
            except Exception as exc:  # the claim must not fail for it: it costs the plan after
                log.info("planning %s before the timeline failed: %s", instant, exc)
                return None
            return drafts[instant].plan

        def write_ahead(instant: str) -> None:  # beside the listing after the claim that carries the plan
            draft = drafts[instant]
            ahead[instant] = [
                self._write_group(draft, task, work, instant) for task, work in enumerate(draft.works)
            ]

        def write(transaction: Transaction) -> CommitMetadata:
            # Listing early serves when the commits completed since this process last looked wrote
            # nothing in these partitions (a lone writer, or writers of other partitions whose notes say
            # so): else they are listed again, and the next write lists them after the timeline only.
            begun, mine = transaction.begin_timeline, transaction.instant_time
            listed = early[0] if early else kept
            apart, commits = self._apart(begun, listed), completed(begun)
            self._list_early = commits <= known | apart
            others = [i for i in begun.pending() if i.action.writes_data and i.requested_time != mine]
            self._alone = commits <= known and not others
            ready = drafts.get(mine) if transaction.planned is not None else None
            holding = replace(listed, known=listed.known | apart) if listed else None
            made = self._write_files(transaction, held, holding, ready, apart, ahead.get(mine))
            written.append((*made, apart, commits))
            return written[0][0]

        listing = held.partitions is not None and self._list_early
        # A process writing alone knows the files of the partitions it wrote last, and the listing after its
        # claim will confirm its plan: the plan is drafted before the claim and carried by it, and the write
        # goes ahead of that listing. With others writing, that listing would often show a commit it did not
        # know, and writers that went ahead made fewer commits (bench/README.md).
        going = self._alone and listing and kept is not None and kept.holds(knew, held.partitions)
        if going:
            list_early()
        done = write_instant(
            self.table,
            held.operation.value,
            held.operation.action,
            self.options,
            write,
            alongside=list_early if listing and not going else None,
            draft=draft if listing else None,
            write_ahead=write_ahead if going else None,
        )
        self._listed = None
        if not written:
            return done
        metadata, used, apart, shown = written[0]
        if used.listing is not None:  # what the next write of these partitions needs not list
            # what it knows of commits no longer on the timeline (archived) is dropped: it stays small
            after = replace(used.listing, known=(used.listing.known | apart) & shown)
            self._listed = after.after(done, metadata.write_stats)
        return done

    def _apart(self, begun: Timeline, listing: EarlyListing | None) -> frozenset[str]:
        """The commits completed on ``begun`` that ``listing`` does not know of and that wrote nothing in
        its partitions (replacecommits are never counted): by the sketches their notes name, or else, on
        an object store, by the commits themselves, read at once. There reading them is one round trip,
        where a commit not known apart costs the write a listing of its partitions and its plan made
        again, one after the other, and the newest is read for the table's schema all the same; on local
        disk a listing costs less than parsing commits. A commit that cannot be read is not apart."""
        if listing is None:
            return frozenset()
        unknown = [
            i
            for i in begun.data_commits()
            if i.action is Action.COMMIT and i.requested_time not in listing.known
        ]
        storage = self.table.storage
        sketches = noted_sketches(storage, unknown)
        unnoted = [i for i, noted in sketches.items() if noted is None] if storage.round_trips else []
        try:
            sketches |= zip(unnoted, map(Sketch.of, self.table.commit_metadata_of(unnoted)), strict=True)
        except CowriteError as exc:  # archived or rolled back meanwhile: its partitions are listed again
            log.info("reading the commits completed since %s was listed failed: %s", listing.partitions, exc)
        groups = [f"{f.partition}/{f.file_id}" for f in listing.files]
        return frozenset(
            i.requested_time
            for i, sketch in sketches.items()
            if sketch is not None and leaves_alone(sketch, listing.partitions, groups)
        )

    def _draft(self, instant: str, held: HeldInput, begun: Timeline, early: EarlyListing | None) -> Draft:
        """What ``held`` writes as ``instant`` on the table as of ``begun``: its rows by file group, and the
        plan naming every base file it may create."""
        table, operation, partitions = self.table, held.operation, held.partitions
        views: list[FileSystemView] = []
        listings: list[EarlyListing | None] = []
        if early is not None and not early.holds(begun, partitions):
            early = None  # listed afresh, once the timeline was: kept for the next write

        def build() -> None:
            listing = early
            if listing is None and partitions is not None:
                listing = EarlyListing.take(table, partitions, completed(begun))
            views.append(
                FileSystemView.build(table, begun, partitions=partitions, for_write=True, early=listing)
            )
            listings.append(listing)

        # the files are listed beside reading the schema as of begin: one round trip for both
        current = beside(table.storage, partial(held.at, table, begun), build)
        view, incoming, lookup_all = views[0], current.prepared, current.lookup_all
        known_partitions = current.named_partitions
        replaced: dict[str, tuple[str, ...]] = {}
        if operation is Operation.INSERT_OVERWRITE:
            replaced = {p: tuple(g.file_id for g in view.in_partition(p)) for p in known_partitions}
            replaced = {p: ids for p, ids in replaced.items() if ids}
            view = FileSystemView(())
            tagged = incoming
        elif operation is Operation.INSERT:
            tagged = incoming
        else:
            wanted = incoming.column(RECORD_KEY).combine_chunks()
            index = index_keys(table.storage, view.latest_base_files(), self._recent, among=wanted)
            if lookup_all:  # deletes without partition columns: the key decides the partition
                incoming = incoming.drop_columns([PARTITION_PATH]).join(
                    index.select([RECORD_KEY, PARTITION_PATH]), keys=RECORD_KEY, join_type="inner"
                )
            tagged = tag_locations(incoming, index)
            if operation is Operation.DELETE:
                tagged = tagged.filter(pc.is_valid(tagged.column(FILE_ID)))
        sizing = SizingPolicy(
            max_file_bytes=self.options.config.get(keys.PARQUET_MAX_FILE_SIZE),
            small_file_bytes=self.options.config.get(keys.PARQUET_SMALL_FILE_LIMIT),
            record_bytes=estimate_record_bytes(view, table.storage, incoming, known_partitions, self._recent),
        )
        buckets = plan_buckets(tagged, view, sizing)
        merge = operation is not Operation.INSERT
        works = [to_work(bucket, instant, task, merge) for task, bucket in enumerate(buckets)]
        schema = commit_schema(
            table,
            current.schema,
            incoming.drop_columns([RECORD_KEY, PARTITION_PATH]).schema,
            delete=operation is Operation.DELETE,
        )
        plan = self._metadata(operation, [planned_stat(w) for w in works], replaced, schema)
        basis = Draft.basis_of(table, begun)
        return Draft(basis, operation, tagged, buckets, works, replaced, schema, plan, listings[0])

    def _write_files(
        self,
        transaction: Transaction,
        held: HeldInput,
        early: EarlyListing | None = None,
        ready: Draft | None = None,
        apart: frozenset[str] = frozenset(),
        ahead: list[WriteStat] | None = None,
    ) -> tuple[CommitMetadata, Draft]:
        """Plan the write on the timeline it begins on, unless ``ready`` (the plan written beside that
        timeline's listing) was made on one with the same basis, but for the commits ``apart`` from its
        partitions; then write its files, unless ``ready`` stands and they were written ``ahead`` of that
        listing. Files written ahead on a plan that does not stand, and not written again, are deleted
        first. Returns what it wrote, and the plan it followed."""
        table, instant = self.table, transaction.instant_time
        draft = ready
        if draft is None or not draft.stands_on(table, transaction.begin_timeline, apart):
            draft = self._draft(instant, held, transaction.begin_timeline, early)
            transaction.plan(draft.plan)
            # before the commit, which would make them visible: their names carry its time
            for path in {s.path for s in ahead or ()} - {s.path for s in draft.plan.write_stats}:
                table.storage.delete(path)
            ahead = None
        if ahead is not None:
            stats = list(ahead)
        else:
            stats = []
            for task, work in enumerate(draft.works):
                transaction.check_alive()
                write = partial(self._write_group, draft, task, work, instant)
                # the last file is written beside taking the lock for the commit that follows
                stats.append(transaction.beside_the_lock(write) if task == len(draft.works) - 1 else write())
        done = self._metadata(draft.operation, stats, draft.replaced, draft.schema)
        tagged = draft.tagged
        if self.options.config.get(keys.CONFLICT_ON_RECORD_KEYS) and draft.operation is not Operation.DELETE:
            new = tagged if FILE_ID not in tagged.column_names else tagged.filter(pc.is_null(tagged[FILE_ID]))
            pairs = zip(new[PARTITION_PATH].to_pylist(), new[RECORD_KEY].to_pylist(), strict=True)
            done = replace(done, extra={INSERTED_KEYS: KeySummary.of(pairs).to_json()})
        return done, draft

    def _write_group(self, draft: Draft, task: int, work: FileGroupWrite, instant: str) -> WriteStat:
        """Write the new base file of ``draft``'s file group ``task``."""
        tagged, bucket = draft.tagged, draft.buckets[task]
        rows = pa.chunked_array(bucket.rows, pa.uint64()) if bucket.rows else pa.array([], pa.uint64())
        rows_in_group = tagged.take(rows).drop_columns([c for c in (FILE_ID,) if c in tagged.column_names])
        deleted_keys = None
        if draft.operation is Operation.DELETE:
            deleted_keys = rows_in_group.column(RECORD_KEY).combine_chunks()
            rows_in_group = rows_in_group.select([RECORD_KEY, PARTITION_PATH]).slice(0, 0)
        stat = write_file_group(
            self.table.storage,
            work,
            instant,
            rows_in_group,
            deleted_keys=deleted_keys,
            ordering=self.table.ordering_fields,
            compression=self.options.config.get(keys.PARQUET_COMPRESSION),
            task=task,
            recent=self._recent,
        )
        reached(Step.FILE_GROUP_WRITTEN, instant)
        return stat

    def _metadata(
        self, operation: Operation, stats: list[WriteStat], replaced: dict[str, tuple[str, ...]], schema: str
    ) -> CommitMetadata:
        return CommitMetadata(operation.value, tuple(stats), replaced, schema)


@dataclass(frozen=True)
class Draft:
    """A write's plan, made on one timeline: the rows of each file group it writes, and the plan itself.
    ``basis``: what of that timeline the plan rests on (:meth:`basis_of`); on another timeline with the
    same basis the write would plan the same."""

    basis: tuple[frozenset[str], str | None, str]
    operation: Operation
    tagged: pa.Table
    buckets: list[Bucket]
    works: list[FileGroupWrite]
    replaced: dict[str, tuple[str, ...]]
    schema: str
    plan: CommitMetadata
    listing: EarlyListing | None  # the files of its partitions its view was built from

    @staticmethod
    def basis_of(
        table: Table, timeline: Timeline, apart: frozenset[str] = frozenset()
    ) -> tuple[frozenset[str], str | None, str]:
        """The completed commits, whose files a write's view shows, but those ``apart`` from its
        partitions; where the timeline starts (files before it count as committed, archived); and the
        table's schema."""
        commits = completed(timeline) - apart
        return commits, timeline_start(table, timeline), latest_schema(table, timeline)

    def stands_on(self, table: Table, timeline: Timeline, apart: frozenset[str]) -> bool:
        """Whether the write would plan the same on ``timeline``: the same basis, but for the commits
        ``apart`` from its partitions on either side. The timeline a draft was made on may hold such a commit
        that the files it was planned from do not know of: one its process published for a waiter in its
        last turn, or listed since (a read of the table, a listing under the lock)."""
        commits, start, schema = self.basis
        return (commits - apart, start, schema) == Draft.basis_of(table, timeline, apart)


def completed(timeline: Timeline) -> frozenset[str]:
    """The requested times of ``timeline``'s completed data commits."""
    return timeline.data_commits().completed_times


@dataclass
class HeldInput:
    """One write's input, held to the table's schema ``schema`` (Avro JSON, "" for none)."""

    data: pa.Table
    operation: Operation
    source: str
    schema: str
    prepared: pa.Table

    @cached_property
    def named_partitions(self) -> list[str]:
        return [p for p in pc.unique(self.prepared.column(PARTITION_PATH)).to_pylist() if p is not None]

    @property
    def lookup_all(self) -> bool:
        """Whether it is a delete that leaves some partitions to the key: every partition is looked up."""
        return self.operation is Operation.DELETE and self.prepared.column(PARTITION_PATH).null_count > 0

    @property
    def partitions(self) -> list[str] | None:
        """The partitions the write looks at; None for all."""
        return None if self.lookup_all else self.named_partitions

    @classmethod
    def of(cls, table: Table, data: pa.Table, operation: Operation, source: str = "input") -> HeldInput:
        """``data`` held to the schema of the last timeline this process listed (or of one listed now):
        bad input is refused before anything is written, without a listing on every write. Nothing rests
        on that timeline: the write holds the input again to the timeline it begins on (:meth:`at`)."""
        try:
            schema = latest_schema(table, Timeline.last_listed(table.storage) or table.timeline())
        except InstantGoneError:  # its newest commit was archived since: list afresh
            schema = latest_schema(table, table.timeline())
        prepared = prepare(table, data, operation, source, schema_of(table, schema))
        return cls(data, operation, source, schema, prepared)

    def at(self, table: Table, begun: Timeline) -> HeldInput:
        """This input held to ``table``'s schema as of ``begun``: itself, unless another writer changed the
        schema since; raises :class:`SchemaError` when the input no longer fits (the write then aborts)."""
        schema = latest_schema(table, begun)
        if schema == self.schema:
            return self
        prepared = prepare(table, self.data, self.operation, self.source, schema_of(table, schema))
        return replace(self, schema=schema, prepared=prepared)
