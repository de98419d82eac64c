"""Readers as Arrow tables: snapshot, time travel and incremental.

- :func:`snapshot` reads the latest visible base file of every file group (``as_of`` a requested instant
  time for time travel: only commits requested at or before it count).
- :func:`incremental` returns the records written by commits whose *completion* time lies in
  ``(since, until]`` — the order in which commits became visible, which is what a consumer that
  checkpoints must follow when several writers interleave. File groups come from the commits' write stats;
  of each, the newest base file written in the range is read, keeping the rows those commits wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ..timeline.fs_view import FileSystemView, replaced_file_groups
from ..timeline.instant import check_time
from ..timeline.table import Table
from ..timeline.timeline import InstantRange
from .file_group import read_base_file
from .records import COMMIT_TIME, META_COLUMNS


def _concat(tables: Sequence[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables, promote_options="permissive") if tables else pa.table({})


def _finish(table: pa.Table, with_meta: bool, columns: Sequence[str] | None) -> pa.Table:
    if not with_meta:
        table = table.drop_columns([c for c in META_COLUMNS if c in table.column_names])
    if columns is not None:
        table = table.select(list(columns))
    return table


def _read(table: Table, paths: Iterable[str]) -> list[pa.Table]:
    return [read_base_file(table.storage, path) for path in paths]


def snapshot(
    table: Table,
    as_of: str | None = None,
    columns: Sequence[str] | None = None,
    partitions: Iterable[str] | None = None,
    with_meta: bool = False,
) -> pa.Table:
    """All visible records (as of a requested instant time, for time travel)."""
    if as_of is not None:
        check_time(as_of)
    view = FileSystemView.build(table, as_of=as_of, partitions=partitions)
    return _finish(_concat(_read(table, (b.path for b in view.latest_base_files()))), with_meta, columns)


def incremental(
    table: Table,
    since: str | None = None,
    until: str | None = None,
    columns: Sequence[str] | None = None,
    with_meta: bool = False,
) -> pa.Table:
    """Records written by commits completed in ``(since, until]`` (completion times)."""
    timeline = table.timeline()
    commits = [i for i in timeline.completed_in(InstantRange.within(since, until)) if i.action.writes_data]
    newest: dict[tuple[str, str], tuple[str, str]] = {}  # file group -> (instant time, path)
    for instant in commits:
        for stat in table.commit_metadata(instant).write_stats:
            key = (stat.partition_path, stat.file_id)
            if key not in newest or newest[key][0] < instant.requested_time:
                newest[key] = (instant.requested_time, stat.path)
    for group in replaced_file_groups(table, commits):  # as Hudi's readers: replaced within the range
        newest.pop(group, None)
    wanted = pa.array(sorted({i.requested_time for i in commits}), pa.string())
    parts = [
        part.filter(pc.is_in(part.column(COMMIT_TIME), value_set=wanted))
        for part in _read(table, sorted(path for _, path in newest.values()))
    ]
    return _finish(_concat(parts), with_meta, columns)
