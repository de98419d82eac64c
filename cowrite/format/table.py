"""A table's identity: where it lives, its ``hoodie.properties``, and reading its timeline.

Layout under the base path (everything cowrite adds of its own stays under ``.hoodie/``, where readers
ignore it):

============================================  =====================================================
``.hoodie/hoodie.properties``                 table configuration (java-properties)
``.hoodie/timeline/``                         instants (Hudi timeline layout 2)
``.hoodie/.heartbeat/<instant>``              a live writer's heartbeat
``.hoodie/locks/lock<id>.acquired|released``  the filesystem table lock
``<partition path>/<fileId>_<token>_<t>.parquet``  base files
============================================  =====================================================
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar

from cowrite.errors import (
    ConfigError,
    InstantGoneError,
    InvalidTablePropertiesError,
    TableExistsError,
    TableNotFoundError,
)
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.config import Config
from cowrite.format.instant import Action, Instant, State, from_millis, to_millis
from cowrite.format.properties import format_properties, parse_properties
from cowrite.format.service_metadata import CleanPlan, RollbackPlan
from cowrite.format.timeline import TIMELINE_DIR, Timeline
from cowrite.process import keep_mapping, memo
from cowrite.storage.backend import Storage
from cowrite.storage.together import together

log = logging.getLogger(__name__)

T = TypeVar("T")

PROPERTIES_FILE = ".hoodie/hoodie.properties"
TABLE_SERVICE_OPERATIONS = frozenset({"cluster"})
SUPPORTED_VERSION = 8
SUPPORTED_LAYOUT = 2


class Table:
    """An existing table. Cheap to create; :meth:`timeline` lists the timeline each call."""

    def __init__(self, storage: Storage, config: Config) -> None:
        self.storage = storage
        self.config = config

    # -- opening ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, uri: str, **storage_options: Any) -> Table:
        return cls.open(Storage.for_uri(uri, **storage_options))

    @classmethod
    def open(cls, storage: Storage) -> Table:
        path = storage.full_path(PROPERTIES_FILE)
        try:
            data = storage.read(PROPERTIES_FILE)
        except FileNotFoundError:
            raise TableNotFoundError(
                f"{storage.uri} is not a cowrite/Hudi table: {path} does not exist. "
                "Check the path, or create a table there with `cowrite init`"
            ) from None
        values = parse_properties(data, path)
        strategy = values.get(keys.CONFLICT_STRATEGY.key)
        if strategy is not None and strategy.strip() not in keys.BUILTIN_CONFLICT_STRATEGIES:
            # A dotted path is imported and called by every writer: code chosen by whoever can write the
            # table's files. Only a writer's own options may name one.
            log.warning(
                "ignoring %s=%s in %s: a custom conflict strategy is taken from write options only",
                keys.CONFLICT_STRATEGY.key,
                strategy,
                path,
            )
            del values[keys.CONFLICT_STRATEGY.key]
        table = cls(storage, Config(values))
        table._validate(path)
        return table

    @classmethod
    def create(
        cls,
        uri: str,
        *,
        name: str,
        record_key_fields: Sequence[str],
        partition_fields: Sequence[str] = (),
        ordering_fields: Sequence[str] = (),
        hive_style_partitioning: bool = False,
        properties: Mapping[str, str] | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> Table:
        """Create a new empty table; raises :class:`TableExistsError` if one is there already."""
        storage = Storage.for_uri(uri, **dict(storage_options or {}))
        if not record_key_fields:
            raise ConfigError("a table needs at least one record key field")
        values = {
            keys.TABLE_NAME.key: name,
            keys.TABLE_TYPE.key: "COPY_ON_WRITE",
            keys.TABLE_VERSION.key: str(SUPPORTED_VERSION),
            keys.TIMELINE_LAYOUT_VERSION.key: str(SUPPORTED_LAYOUT),
            keys.RECORD_KEY_FIELDS.key: ",".join(record_key_fields),
            keys.PARTITION_FIELDS.key: ",".join(partition_fields),
            keys.HIVE_STYLE_PARTITIONING.key: str(hive_style_partitioning).lower(),
            keys.BASE_FILE_FORMAT.key: keys.BASE_FILE_FORMAT.default,
            keys.POPULATE_META_FIELDS.key: "true",
            keys.METADATA_ENABLE.key: "false",
            keys.TIMELINE_TIMEZONE.key: "UTC",
            keys.KEY_GENERATOR_CLASS.key: keys.KEY_GENERATOR_CLASS.default,
            **({keys.ORDERING_FIELDS.key: ",".join(ordering_fields)} if ordering_fields else {}),
            **({keys.PRECOMBINE_FIELD.key: ordering_fields[0]} if ordering_fields else {}),
            **dict(properties or {}),
        }
        table = cls(storage, Config(values))
        table._validate(storage.full_path(PROPERTIES_FILE))
        if not storage.create_if_absent(PROPERTIES_FILE, format_properties(values)):
            raise TableExistsError(f"a table already exists at {storage.uri}; choose another path")
        return table

    def _validate(self, path: str) -> None:
        try:
            if not self.config.get(keys.TABLE_NAME):
                raise InvalidTablePropertiesError(f"{path} has no {keys.TABLE_NAME.key}")
            if self.config.get(keys.TABLE_TYPE) != "COPY_ON_WRITE":
                raise InvalidTablePropertiesError(
                    f"{path}: table type {self.config.get(keys.TABLE_TYPE)} is not supported; "
                    "cowrite serves COPY_ON_WRITE tables"
                )
            version = self.config.require(keys.TABLE_VERSION)
            layout = self.config.get(keys.TIMELINE_LAYOUT_VERSION)
            if version != SUPPORTED_VERSION or layout != SUPPORTED_LAYOUT:
                raise InvalidTablePropertiesError(
                    f"{path}: table version {version} with timeline layout {layout} is not supported; "
                    f"cowrite serves version {SUPPORTED_VERSION}, layout {SUPPORTED_LAYOUT} "
                    "(upgrade the table with Hudi 1.x first)"
                )
            if not self.record_key_fields:
                raise InvalidTablePropertiesError(f"{path} has no {keys.RECORD_KEY_FIELDS.key}")
            for name in self.config.raw():  # a bad value fails now, not halfway through a write
                if name in keys.REGISTRY:
                    self.config.get(keys.REGISTRY[name])
        except ConfigError as exc:
            raise InvalidTablePropertiesError(f"{path}: {exc}") from None

    # -- properties ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.config.get(keys.TABLE_NAME)

    @property
    def uri(self) -> str:
        return self.storage.uri

    @property
    def record_key_fields(self) -> tuple[str, ...]:
        return self.config.get(keys.RECORD_KEY_FIELDS)

    @property
    def partition_fields(self) -> tuple[str, ...]:
        return self.config.get(keys.PARTITION_FIELDS)

    @property
    def ordering_fields(self) -> tuple[str, ...]:
        fields = self.config.get(keys.ORDERING_FIELDS)
        precombine = self.config.get(keys.PRECOMBINE_FIELD)
        return fields or ((precombine,) if precombine else ())

    @property
    def hive_style_partitioning(self) -> bool:
        return self.config.get(keys.HIVE_STYLE_PARTITIONING)

    # -- timeline --------------------------------------------------------------------------------
    def timeline(self, tail: bool = False) -> Timeline:
        """The timeline listed now; with ``tail``, its tail on an object store (:meth:`Timeline.load`)."""
        return Timeline.load(self.storage, tail)

    def still_listed(self, timeline: Timeline) -> Timeline:
        """``timeline`` without the completed instants a listing in full no longer shows: those archived
        since (a tail's view may hold some). Lists the timeline."""
        now = self.timeline()
        return Timeline(i for i in timeline if not i.is_completed or now.get(i.requested_time) is not None)

    def read_timeline(self, read: Callable[[Timeline], T]) -> T:
        """``read`` of the timeline listed now, for a reader that reads files the listing showed.

        Archival, a rollback or a clean may remove such a file before ``read`` gets to it
        (:class:`InstantGoneError`): the timeline is then listed once more and ``read`` runs on that
        listing, so what it returns is exact for the timeline it finally read. If a file vanishes again,
        :class:`InstantGoneError` is raised (the timeline moves faster than it can be read; retry later).
        ``read`` may run twice: it must change nothing.
        """
        try:
            return read(self.timeline())
        except InstantGoneError as exc:
            log.info("%s; reading a new listing", exc)
            return read(self.timeline())

    def instant_path(self, instant: Instant) -> str:
        return f"{TIMELINE_DIR}/{instant.file_name}"

    def commit_metadata(self, instant: Instant) -> CommitMetadata:
        """The metadata of a completed commit or replacecommit (cached: completed files never change)."""
        path = self.instant_path(instant)
        return _published.get((self.storage, path)) or _read_commit_metadata(self.storage, path)

    def commit_metadata_of(self, instants: Sequence[Instant]) -> list[CommitMetadata]:
        """:meth:`commit_metadata` of each of ``instants``, those not read yet fetched concurrently: on an
        object store one round trip for all of them rather than one each."""
        return together(self.storage, [partial(self.commit_metadata, i) for i in instants])

    def published(self, instant: Instant, payload: bytes) -> None:
        """Note that this process just created ``instant``'s completed file with ``payload``: the next
        write reads the table's schema from it, and need not fetch what it wrote."""
        path = self.instant_path(instant)
        metadata = CommitMetadata.from_bytes(payload, self.storage.full_path(path))  # as a reader sees it
        with _published_lock:
            _published[(self.storage, path)] = metadata
            while len(_published) > _PUBLISHED_KEPT:
                del _published[next(iter(_published))]

    def known_timeline(self) -> Timeline:
        """The last timeline this process listed, with the commits it published itself since (the last
        few), without listing: each was completed before this call. Never a view to act on unconfirmed."""
        with _published_lock:
            own = [path.rsplit("/", 1)[-1] for storage, path in _published if storage is self.storage]
        return Timeline.last_listed(self.storage).adding(map(Instant.parse, own))

    def verified(self, timeline: Timeline) -> Timeline:
        """``timeline``, once every completed commit and replacecommit on it has been parsed.

        A read never skips a commit it cannot parse — its records would be silently missing —: a corrupt
        one raises :class:`CorruptTimelineError` naming the file and what to do; one archived since
        ``timeline`` was listed, :class:`InstantGoneError` (:meth:`read_timeline` lists again instead).
        Each file is parsed once per process (completed files never change), so this costs a read only
        for new commits.
        """
        for instant in timeline.data_commits():
            self.commit_metadata(instant)
        return timeline

    @staticmethod
    def completion_time(timeline: Timeline, requested_time: str, now_millis: int) -> str:
        """A completion time after the instant's own request and every earlier completion."""
        latest = timeline.latest_completion_time
        floor = max(to_millis(requested_time), to_millis(latest) if latest else 0)
        return from_millis(max(now_millis, floor + 1))

    def clean_plan(self, clean: Instant) -> CleanPlan:
        """The plan a clean instant recorded in its ``.requested`` file."""
        path = self.instant_path(Instant(clean.requested_time, Action.CLEAN, State.REQUESTED))
        return _read_clean_plan(self.storage, path)

    def rollback_plan(self, rollback: Instant) -> RollbackPlan:
        """The plan a rollback instant recorded in its ``.requested`` file."""
        path = self.instant_path(Instant(rollback.requested_time, Action.ROLLBACK, State.REQUESTED))
        return _read_rollback_plan(self.storage, path)

    def being_rolled_back(self, timeline: Timeline, requested_time: str) -> bool:
        """Whether a rollback on ``timeline`` targets the instant ``requested_time``. A rollback whose plan
        vanished after the listing was archived, so it had completed: it was not of a pending instant."""
        for rollback in timeline.after(requested_time).filter(actions=[Action.ROLLBACK]):
            try:
                if self.rollback_plan(rollback).target == requested_time:
                    return True
            except InstantGoneError:
                continue
        return False

    def is_clustering(self, instant: Instant) -> bool:
        """Whether a completed instant is a clustering (a replacecommit of a table service)."""
        return (
            instant.is_completed
            and instant.action is Action.REPLACE_COMMIT
            and self.commit_metadata(instant).operation in TABLE_SERVICE_OPERATIONS
        )

    def pending_plan(self, instant: Instant) -> CommitMetadata | None:
        """What a pending write plans to touch: its ``.inflight`` plan, else a service's requested plan."""
        if instant.is_completed:
            return None
        inflight = Instant(instant.requested_time, instant.action, State.INFLIGHT)
        try:
            data = self.storage.read(self.instant_path(inflight))
        except FileNotFoundError:
            return self.service_plan(instant)
        return (
            CommitMetadata.from_bytes(data, self.storage.full_path(self.instant_path(inflight)))
            if data
            else None
        )

    def service_plan(self, instant: Instant) -> CommitMetadata | None:
        """The plan of a pending table service (clustering), which counts as touching its file groups.

        Table services publish their plan in ``<t>.replacecommit.requested``; a writer's ``.requested`` is
        empty, or a commit's plan (one that went ahead of its listing, :mod:`~cowrite.format.claims`).
        """
        if instant.is_completed or instant.action is not Action.REPLACE_COMMIT:
            return None
        path = self.instant_path(Instant(instant.requested_time, instant.action, State.REQUESTED))
        try:
            data = self.storage.read(path)
        except FileNotFoundError:
            return None
        if not data:
            return None
        plan = CommitMetadata.from_bytes(data, self.storage.full_path(path))
        return plan if plan.operation in TABLE_SERVICE_OPERATIONS else None

    def __repr__(self) -> str:
        return f"Table({self.name!r} at {self.uri})"


def _read_timeline_file(storage: Storage, path: str) -> bytes:
    """A timeline file a listing showed; :class:`InstantGoneError` if it was removed since."""
    try:
        return storage.read(path)
    except FileNotFoundError:
        Timeline.forget(storage)  # a tail of the timeline may have shown it: the next listing is in full
        raise InstantGoneError(storage.full_path(path)) from None


# Completed commits this process published, newest last (a dict keeps insertion order).
_published: dict[tuple[Storage, str], CommitMetadata] = {}
_PUBLISHED_KEPT = 16
_published_lock = threading.Lock()
keep_mapping(
    f"{__name__}._published",
    _published,
    f"{_PUBLISHED_KEPT} entries",
    "a writer's next write reads the schema from its own last commit",
)


@memo(4096, "a completed commit file is never rewritten; every later writer's conflict check reads it")
def _read_commit_metadata(storage: Storage, path: str) -> CommitMetadata:
    return CommitMetadata.from_bytes(_read_timeline_file(storage, path), storage.full_path(path))


@memo(1024, "a clean plan is written once, with its claim, and never rewritten")
def _read_clean_plan(storage: Storage, path: str) -> CleanPlan:
    return CleanPlan.from_bytes(_read_timeline_file(storage, path), storage.full_path(path))


@memo(1024, "a rollback plan is written once, with its claim, and never rewritten")
def _read_rollback_plan(storage: Storage, path: str) -> RollbackPlan:
    return RollbackPlan.from_bytes(_read_timeline_file(storage, path), storage.full_path(path))
