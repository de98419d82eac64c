"""Readers as Spark DataFrames: snapshot, time travel and incremental, with partition pruning.

The driver plans a :class:`Scan` — which base files, and which of their rows — with the same rules as
the Arrow readers (:mod:`cowrite.local.read`): the latest visible base file of every file group for
a snapshot (as of a requested instant time for time travel), and for an incremental read the newest
file each file group got from the commits completed in ``(since, until]``, keeping the rows those
commits wrote. Executors then read one base file per task through the storage layer.

Filters (``[("region", "=", "eu"), ("day", ">=", date(2026, 1, 1))]``, see :mod:`.filters`) prune
partitions before anything is listed: only the directories of matching partitions are listed, and only
their files are read. The tasks also apply the filters to the rows, so results never depend on pruning.

The ``cowrite`` data source's readers, batch and stream, plan with the same functions and read each base
file in a task of its own (:class:`FileToRead`).

The DataFrame's schema is the newest base file's (the table's current schema, as Hudi's readers use
the latest commit's); files written before a column existed read it as null.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import from_arrow_schema

from cowrite.engine.records import META_COLUMNS
from cowrite.format.fs_view import BaseFile, FileSystemView, open_base_file
from cowrite.format.instant import check_time
from cowrite.format.overlay import CommitEntry, entries_of, newest_files
from cowrite.format.table import Table
from cowrite.format.timeline import InstantRange
from cowrite.spark.executor import StorageSpec
from cowrite.spark.filters import Predicate, matching_partitions, partition_matches, predicates
from cowrite.spark.writing import ReadFiles
from cowrite.storage.backend import FileInfo

Filters = Iterable[Predicate | Sequence[Any]] | None


@dataclass(frozen=True)
class Scan:
    """What a read takes: base files (relative paths) and, for incremental reads, the commits kept."""

    files: tuple[str, ...]
    schema: pa.Schema  # of the rows returned, in Spark-compatible Arrow types
    commit_times: tuple[str, ...] | None = None
    rules: tuple[Predicate, ...] = ()


class FileToRead(InputPartition):
    """One base file of a scan, as the data source's readers plan it: a task reads it (Spark pickles each
    partition to its task)."""

    def __init__(self, reading: ReadFiles) -> None:
        super().__init__(reading.files[0])
        self.reading = reading


def file_partitions(table: Table, scan: Scan, schema: pa.Schema) -> list[FileToRead]:
    """One input partition per base file of ``scan``, its rows conformed to ``schema``."""
    storage = StorageSpec.of(table.storage)
    return [
        FileToRead(ReadFiles(storage, (path,), schema, scan.commit_times, scan.rules)) for path in scan.files
    ]


def plan_snapshot(
    table: Table,
    as_of: str | None = None,
    filters: Filters = None,
    columns: Sequence[str] | None = None,
    with_meta: bool = False,
) -> Scan:
    """The base files a snapshot (``as_of``: time travel) reads, after partition pruning."""
    if as_of is not None:
        check_time(as_of)
    rules = predicates(filters)
    partitions = matching_partitions(table, rules)
    view = FileSystemView.build(table, as_of=as_of, partitions=partitions)
    files = view.latest_base_files()
    schema = _reader_schema(table, files, as_of, columns, with_meta)
    return Scan(tuple(b.path for b in files), schema, None, rules)


def plan_incremental(
    table: Table,
    since: str | None = None,
    until: str | None = None,
    filters: Filters = None,
    columns: Sequence[str] | None = None,
    with_meta: bool = False,
) -> Scan:
    """The base files and commits of an incremental read of completion times ``(since, until]``."""
    return plan_commits(table, completed_between(table, since, until), filters, columns, with_meta)


def completed_between(table: Table, since: str | None, until: str | None) -> list[CommitEntry]:
    """The data commits completed in ``(since, until]`` on the timeline listed now, in completion order,
    with the files each wrote and replaced. A commit archived before the listing is not among them
    (:meth:`Table.read_timeline`); whoever must not miss one looks in the archive."""
    return table.read_timeline(
        lambda timeline: entries_of(
            table, table.verified(timeline).completed_in(InstantRange.within(since, until))
        )
    )


def plan_commits(
    table: Table,
    entries: Sequence[CommitEntry],
    filters: Filters = None,
    columns: Sequence[str] | None = None,
    with_meta: bool = False,
    schema: pa.Schema | None = None,
) -> Scan:
    """The scan of the rows ``entries`` wrote: of each file group, the newest base file they gave it
    (none if one of them replaced the group), in the partitions the filters keep.

    ``schema`` is the rows' (a stream keeps the one it started with); by default the newest base file's,
    which is then opened: it must exist.
    """
    rules = predicates(filters)
    fields, hive = table.partition_fields, table.hive_style_partitioning
    paths = [p for p in newest_files(entries) if partition_matches(p.rpartition("/")[0], fields, hive, rules)]
    if schema is None:
        files = [b for b in (BaseFile.parse(FileInfo(p, 0, 0.0)) for p in paths) if b is not None]
        schema = _reader_schema(table, files, None, columns, with_meta)
    return Scan(tuple(paths), schema, tuple(sorted({e.requested_time for e in entries})), rules)


def snapshot(
    spark: SparkSession,
    table: Table,
    as_of: str | None = None,
    filters: Filters = None,
    columns: Sequence[str] | None = None,
    with_meta: bool = False,
) -> DataFrame:
    """All visible records as a DataFrame (as of a requested instant time, for time travel)."""
    return to_dataframe(spark, table, plan_snapshot(table, as_of, filters, columns, with_meta))


def incremental(
    spark: SparkSession,
    table: Table,
    since: str | None = None,
    until: str | None = None,
    filters: Filters = None,
    columns: Sequence[str] | None = None,
    with_meta: bool = False,
) -> DataFrame:
    """Records written by the commits completed in ``(since, until]`` (completion times)."""
    return to_dataframe(spark, table, plan_incremental(table, since, until, filters, columns, with_meta))


def to_dataframe(spark: SparkSession, table: Table, scan: Scan) -> DataFrame:
    """The rows of ``scan``, one task per base file; the tasks apply the scan's filters to the rows."""
    schema = from_arrow_schema(scan.schema)
    if not scan.files:
        return spark.createDataFrame([], schema)
    reader = ReadFiles(StorageSpec.of(table.storage), scan.files, scan.schema, scan.commit_times, scan.rules)
    count = len(scan.files)
    return spark.range(0, count, 1, numPartitions=min(count, 4096)).mapInArrow(reader, schema)


# -- schema ------------------------------------------------------------------------------------------------
def _reader_schema(
    table: Table,
    files: Sequence[BaseFile],
    as_of: str | None,
    columns: Sequence[str] | None,
    with_meta: bool,
) -> pa.Schema:
    """The newest base file's schema (of those read, else of the newest commit), in Spark's Arrow types."""
    newest = max(files, key=lambda b: (b.instant_time, b.path), default=None)
    path = newest.path if newest is not None else _newest_written(table, as_of)
    if path is None:
        return pa.schema([])
    with open_base_file(table.storage, path) as stream:
        schema = pq.ParquetFile(stream).schema_arrow.remove_metadata()
    fields = [spark_compatible(f) for f in schema if with_meta or f.name not in META_COLUMNS]
    if columns is not None:
        by_name = {f.name: f for f in fields}
        fields = [by_name[c] for c in columns if c in by_name]
    return pa.schema(fields)


def _newest_written(table: Table, as_of: str | None) -> str | None:
    for instant in reversed(table.timeline().data_commits().in_completion_order()):
        if as_of is not None and instant.requested_time > as_of:
            continue
        for stat in table.commit_metadata(instant).write_stats:
            if table.storage.exists(stat.path):
                return stat.path
    return None


def spark_compatible(field: pa.Field) -> pa.Field:
    """A field in an Arrow type Spark reads back unchanged (microsecond timestamps, no half floats)."""
    kind = field.type
    if pa.types.is_timestamp(kind) and kind.unit != "us":
        return field.with_type(pa.timestamp("us", tz=kind.tz))
    if pa.types.is_float16(kind):
        return field.with_type(pa.float32())
    if pa.types.is_large_string(kind):
        return field.with_type(pa.string())
    if pa.types.is_large_binary(kind):
        return field.with_type(pa.binary())
    return field
