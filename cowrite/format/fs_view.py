"""The file system view: which base file of each file group a reader sees as of an instant.

Base files are named ``<fileId>_<writeToken>_<instantTime>.parquet``. A file group is every base file of
one file id in one partition; its latest *visible* base file is the file slice readers use. Visibility
follows Hudi's readers exactly (hudi-rs), since cowrite must agree with them:

- a base file counts if its instant is a completed commit/replacecommit requested at or before ``as_of``,
- or if its instant is older than the timeline's start, its first instant (its evidence was archived;
  :func:`timeline_start` says when claims before it do not count, where hudi-rs counts them),
- a file group replaced by a completed replacecommit (``partitionToReplaceFileIds``) is gone.

So files of failed writes stay invisible only while the failed instant is on the timeline, or while the
failed instant is younger than the start — the cleaner removes garbage before archival.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import IO

from cowrite.errors import BaseFileGoneError, InstantGoneError, TimeTravelCleanedError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action, Instant
from cowrite.format.table import Table
from cowrite.format.timeline import ARCHIVE_DIR, Timeline
from cowrite.storage.backend import FileInfo, Storage, stays_inside
from cowrite.storage.together import together

log = logging.getLogger(__name__)

BASE_FILE_EXTENSION = ".parquet"
_BASE_FILE = re.compile(r"(?P<file_id>[^_/]+)_(?P<token>[^_/]+)_(?P<time>\d{17})\.parquet")


@dataclass(frozen=True)
class BaseFile:
    path: str  # relative to the table's base path
    partition: str
    file_id: str
    write_token: str
    instant_time: str
    size: int = 0

    @staticmethod
    def file_name(file_id: str, write_token: str, instant_time: str) -> str:
        return f"{file_id}_{write_token}_{instant_time}{BASE_FILE_EXTENSION}"

    @classmethod
    def parse(cls, info: FileInfo) -> BaseFile | None:
        """The base file behind a listed file, or None for anything else."""
        match = _BASE_FILE.fullmatch(info.name)
        if match is None:
            return None
        partition = info.path[: -len(info.name)].rstrip("/")
        return cls(info.path, partition, match["file_id"], match["token"], match["time"], info.size)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class FileGroup:
    partition: str
    file_id: str
    slices: tuple[BaseFile, ...]  # visible base files, oldest first

    @property
    def latest(self) -> BaseFile:
        return self.slices[-1]


class FileSystemView:
    """Visible file groups of a table as of an instant, built from one listing and one timeline."""

    def __init__(self, groups: Iterable[FileGroup]) -> None:
        self.groups = {(g.partition, g.file_id): g for g in groups}

    @classmethod
    def build(
        cls,
        table: Table,
        timeline: Timeline | None = None,
        as_of: str | None = None,
        partitions: Iterable[str] | None = None,
        *,
        for_write: bool = False,
        early: EarlyListing | None = None,
    ) -> FileSystemView:
        """The view of ``timeline`` (default: the timeline listed now), from a listing of base files taken
        after it.

        Every completed commit on the timeline is read (and, for time travel, the last clean's plan): a
        read fails on any commit it cannot parse. A view ``for_write`` reads only the replacecommits and the
        commits whose files it shows as latest, concurrently: a write fails when it would build on a commit
        nobody can parse, and what it reads does not grow with the table's history. A file a caller's
        ``timeline`` showed that was archived since raises :class:`InstantGoneError` (a view ``for_write``
        lists the timeline in full instead and leaves the archived instants out: their files count as
        committed); the timeline listed here is listed once more instead (:meth:`Table.read_timeline`).
        ``early``, the same partitions listed before ``timeline``, replaces the listing when it holds every
        file the view can show.
        """
        if timeline is None:
            wanted = None if partitions is None else tuple(partitions)  # may be read twice
            return table.read_timeline(
                lambda listed: cls.build(table, listed, as_of, wanted, for_write=for_write)
            )
        if not for_write:
            timeline = table.verified(timeline)
        if as_of is not None:
            check_time_travel(table, timeline, as_of)
        commits = [i for i in timeline.data_commits() if as_of is None or i.requested_time <= as_of]
        visible_times = {i.requested_time for i in commits}
        start = timeline_start(table, timeline)
        replaced = replaced_file_groups(table, commits)

        def visible(f: BaseFile) -> bool:
            if as_of is not None and f.instant_time > as_of:
                return False
            return f.instant_time in visible_times or (start is not None and f.instant_time < start)

        if early is None or not early.holds(timeline, partitions):
            listed = list_base_files(table, partitions)
        else:
            listed = early.files
        by_group: dict[tuple[str, str], list[BaseFile]] = {}
        for base_file in listed:
            key = (base_file.partition, base_file.file_id)
            if key not in replaced and visible(base_file):
                by_group.setdefault(key, []).append(base_file)
        view = cls(
            FileGroup(p, f, tuple(sorted(files, key=lambda b: b.instant_time)))
            for (p, f), files in by_group.items()
        )
        if for_write:
            latest = {g.latest.instant_time for g in view.groups.values()}
            try:
                table.commit_metadata_of([i for i in commits if i.requested_time in latest])
            except InstantGoneError:  # archived since the timeline was listed (a tail may show it): its
                # files count as committed, as every archived instant's
                timeline = table.still_listed(timeline)
                return cls.build(table, timeline, as_of, partitions, for_write=True, early=early)
        return view

    def latest_base_files(self) -> list[BaseFile]:
        return sorted((g.latest for g in self.groups.values()), key=lambda b: b.path)

    def in_partition(self, partition: str) -> list[FileGroup]:
        return [g for (p, _), g in sorted(self.groups.items()) if p == partition]

    @property
    def partitions(self) -> set[str]:
        return {p for p, _ in self.groups}


def check_time_travel(table: Table, timeline: Timeline, as_of: str) -> None:
    """Raise :class:`TimeTravelCleanedError` if the last clean may have deleted file versions of ``as_of``.

    Cleaning keeps the versions the commits from its earliest retained one on need; older snapshots may
    have lost some of theirs, and reading them would silently miss those rows.
    """
    last_clean = timeline.filter(actions=[Action.CLEAN]).completed().last
    if last_clean is None:
        return
    earliest = table.clean_plan(last_clean).earliest_retained
    if as_of < earliest:
        raise TimeTravelCleanedError(
            f"cannot travel to {as_of} on table {table.name}: the cleaner has deleted file versions of "
            f"commits before {earliest} (clean {last_clean.requested_time}); travel to {earliest} or "
            f"later, or retain more commits ({keys.CLEANER_COMMITS_RETAINED.key})"
        )


@contextmanager
def open_base_file(storage: Storage, path: str) -> Iterator[IO[bytes]]:
    """Open a base file that a read or a write planned to use; :class:`BaseFileGoneError` if it was
    deleted since (an object store may only tell on the first read)."""
    try:
        with storage.open_input(path) as stream:
            yield stream
    except FileNotFoundError:
        raise BaseFileGoneError(storage.full_path(path)) from None


def timeline_start(table: Table, timeline: Timeline) -> str | None:
    """The requested time before which base files count as committed, their instants archived: that of
    the timeline's first instant, or of its first instant past its claim when only claims
    (``.requested``) come before it on a table that archived instants.

    Archival keeps a completed instant before the oldest pending one (:mod:`cowrite.cleaner.archive`),
    so on a table that archived instants such a claim was made from a stale view: a writer paused
    between picking its time and claiming it resumed after archival, and withdraws once it lists, or
    its claim is left for the lazy rollback. Counted, it would hide the archived commits' files — and a
    writer that upserted meanwhile would write their keys a second time. On a table that archived
    nothing, the oldest claim is the start: a Spark data source's tasks write files under a claim alone.
    Looks at the archive only in that case (one listing).
    """
    first = timeline.first
    if first is None or first.requested_time == timeline.first_past_claim:
        return timeline.first_past_claim
    if timeline.first_past_claim is not None and table.storage.list(ARCHIVE_DIR):
        return timeline.first_past_claim
    return first.requested_time


def list_base_files(table: Table, partitions: Iterable[str] | None = None) -> list[BaseFile]:
    """Every base file on storage (visible or not), optionally only in some partitions."""
    if partitions is None:
        listed = table.storage.walk_files("", skip=(".hoodie",))
    else:
        calls = [partial(table.storage.list, p) for p in partitions]
        listed = [i for found in together(table.storage, calls) for i in found]
    return [b for b in (BaseFile.parse(i) for i in listed) if b is not None]


@dataclass(frozen=True)
class EarlyListing:
    """Base files of some partitions, listed before the timeline a write's view is built on: beside its
    claim, a round trip earlier. A base file is written before its commit completes, so the listing holds
    the files of every commit completed before it began — those this process knew of then (:meth:`take`).
    A view of a timeline on which only such commits are completed needs no other listing (:meth:`holds`).
    ``known``: the requested times of commits known completed before the listing began
    (of :meth:`Table.known_timeline`, taken before).
    """

    partitions: tuple[str, ...]
    known: frozenset[str]
    files: list[BaseFile]

    @classmethod
    def take(cls, table: Table, partitions: Iterable[str], known: frozenset[str]) -> EarlyListing:
        wanted = tuple(partitions)
        return cls(wanted, known, list_base_files(table, wanted))

    def holds(self, timeline: Timeline, partitions: Iterable[str] | None) -> bool:
        """Whether this listing holds every file a view of ``partitions`` as of ``timeline`` can show:
        the same partitions, and no commit on ``timeline`` completed that this process learnt of later."""
        same = partitions is not None and tuple(partitions) == self.partitions
        return same and timeline.data_commits().completed_times <= self.known

    def after(self, commit: Instant, written: Iterable[WriteStat]) -> EarlyListing:
        """This listing once this process's ``commit``, which wrote ``written`` into these partitions, has
        completed: what a listing then would show to a write, as far as this process knows — the file
        groups ``commit`` wrote by their new slice alone, the one a write builds on. A commit of anyone
        else is not in it, nor known to it: a view of a timeline that shows one lists again
        (:meth:`holds`)."""
        new = [f for s in written if (f := BaseFile.parse(FileInfo(s.path, s.file_size, 0.0))) is not None]
        groups = {(f.partition, f.file_id) for f in new}
        kept = [f for f in self.files if (f.partition, f.file_id) not in groups]
        return EarlyListing(self.partitions, self.known | {commit.requested_time}, [*kept, *new])


def replaced_file_groups(table: Table, commits: Iterable[Instant]) -> set[tuple[str, str]]:
    replacecommits = [i for i in commits if i.action == "replacecommit"]
    return {
        (partition, file_id)
        for metadata in table.commit_metadata_of(replacecommits)
        for partition, file_ids in metadata.replaced_file_ids.items()
        for file_id in file_ids
    }


def own_files(plan: CommitMetadata, instant_time: str) -> list[str]:
    """The planned base files that carry ``instant_time`` in their name.

    Only these can be garbage of the instant: a plan naming any other file (a bug, a forged plan) must
    never make an abort or a rollback delete data of another commit.
    """
    files = []
    for stat in plan.write_stats:
        base = BaseFile.parse(FileInfo(stat.path, 0, 0.0))
        if base is not None and base.instant_time == instant_time and stays_inside(stat.path):
            files.append(stat.path)
        else:
            log.warning(
                "plan of %s names %s, which it did not write; leaving it alone", instant_time, stat.path
            )
    return files
