"""The Spark engine's settings and the ``cowrite`` data source's options (Hudi's data source option names).

Only the Spark engine reads these. They join every other setting in :data:`cowrite.format.config.REGISTRY`
when this module is imported — as any import of :mod:`cowrite.spark` does — and only then: a registered
key's value in ``hoodie.properties`` is checked when a table is opened (:class:`~cowrite.format.table.Table`),
an unregistered one is not. Neither this module nor the package's ``__init__`` imports Spark, so code that
needs the whole registry without starting Spark can import this module.
"""

from __future__ import annotations

import json

from cowrite.format.config import ConfigKey, parse_bool, parse_list
from cowrite.format.instant import check_time


def _str(value: str) -> str:
    return value


WRITE_OPERATION = ConfigKey(
    "hoodie.datasource.write.operation",
    "insert",
    _str,
    "Operation of a data source write: insert or bulk_insert (Hudi defaults to upsert; a data source "
    "write cannot shuffle, so upsert, delete and insert_overwrite go through SparkWriter instead).",
)
WRITE_RECORDKEY_FIELD: ConfigKey[tuple[str, ...]] = ConfigKey(
    "hoodie.datasource.write.recordkey.field",
    (),
    parse_list,
    "Record key column(s) of a data source write; must match the table's, or creates the table.",
)
WRITE_PARTITIONPATH_FIELD: ConfigKey[tuple[str, ...]] = ConfigKey(
    "hoodie.datasource.write.partitionpath.field",
    (),
    parse_list,
    "Partition column(s) of a data source write; must match the table's, or creates the table.",
)
WRITE_PRECOMBINE_FIELD = ConfigKey(
    "hoodie.datasource.write.precombine.field",
    "",
    _str,
    "Ordering column of a data source write; must match the table's, or creates the table.",
)
WRITE_TABLE_NAME = ConfigKey(
    "hoodie.datasource.write.table.name", "", _str, "Table name when a data source write creates the table."
)
QUERY_TYPE = ConfigKey(
    "hoodie.datasource.query.type",
    "snapshot",
    _str,
    "Data source read: snapshot (read_optimized means the same on copy-on-write) or incremental.",
)
READ_BEGIN_INSTANTTIME = ConfigKey(
    "hoodie.datasource.read.begin.instanttime",
    "",
    _str,
    "Incremental read: records of commits completed after this completion time (exclusive; empty = all).",
)
READ_END_INSTANTTIME = ConfigKey(
    "hoodie.datasource.read.end.instanttime",
    "",
    _str,
    "Incremental read: ... and completed at or before this completion time (empty = open).",
)
AS_OF_INSTANT = ConfigKey(
    "as.of.instant", "", _str, "Time travel: read the table as of this requested instant time."
)
BULKINSERT_SHUFFLE_PARALLELISM = ConfigKey(
    "hoodie.bulkinsert.shuffle.parallelism",
    0,
    int,
    "Tasks of the bulk_insert sort (GLOBAL_SORT); 0 = spark.sql.shuffle.partitions.",
)
BULKINSERT_SORT_MODE = ConfigKey(
    "hoodie.bulkinsert.sort.mode",
    "GLOBAL_SORT",
    _str,
    "bulk_insert layout: GLOBAL_SORT (range-partition by partition path: fewest files), PARTITION_SORT "
    "(sort each input task's rows by partition, no shuffle) or NONE.",
)
UPSERT_SHUFFLE_PARALLELISM = ConfigKey(
    "hoodie.upsert.shuffle.parallelism",
    0,
    int,
    "Tasks that deduplicate upserts, deletes and insert_overwrites; 0 = as many as the input has.",
)


def _parse_filters(value: str) -> tuple[tuple[object, ...], ...]:
    found = json.loads(value) if value.strip() else []
    if not isinstance(found, list) or not all(isinstance(f, list) and 2 <= len(f) <= 3 for f in found):
        raise ValueError("expected a JSON list of [column, op] or [column, op, value]")
    return tuple(tuple(f) for f in found)


READ_FILTERS: ConfigKey[tuple[tuple[object, ...], ...]] = ConfigKey(
    "cowrite.read.filters",
    (),
    _parse_filters,
    'Data source reads: filters as JSON, e.g. [["region", "=", "eu"], ["day", ">=", "2026-01-01"]]; those '
    "on partition columns prune the partitions listed and read, all of them filter the rows.",
)
STORAGE_OPTIONS_JSON = ConfigKey(
    "cowrite.storage.options",
    "",
    _str,
    'fsspec options of the table\'s storage as JSON (S3 endpoint, keys), e.g. {"key": "..."}; for the '
    "Spark data source, whose options are strings. Empty = the AWS environment variables.",
)
# Delta's names for an idempotent write; Spark's options are case-insensitive (the data source lowers them).
TXN_APP_ID = ConfigKey(
    "txnappid",
    "",
    _str,
    "Idempotent data source write (Delta's txnAppId): the writing application's id, with txnVersion.",
)
TXN_VERSION = ConfigKey(
    "txnversion",
    "",
    _str,
    "Idempotent data source write (Delta's txnVersion): this write's version, a non-negative integer; a "
    "version of the application already committed, or older than one committed, writes nothing.",
)

# -- streaming reads ---------------------------------------------------------------------------------
EARLIEST, LATEST = "earliest", "latest"


def _start_offset(value: str) -> str:
    chosen = value.strip()
    return chosen.lower() if chosen.lower() in (EARLIEST, LATEST) else check_time(chosen)


# Spark's options are case-insensitive: the data source lowers their names (handover.Settings).
START_OFFSET = ConfigKey(
    "hoodie.datasource.streaming.startoffset",
    EARLIEST,
    _start_offset,
    "Where a new streaming query starts: earliest, latest, or a completion time (yyyyMMddHHmmssSSS) "
    "after which commits are read.",
)
FAIL_ON_DATA_LOSS = ConfigKey(
    "failondataloss",
    True,
    parse_bool,
    "Streaming reads: fail when commits still to be read were archived or their files cleaned (true), "
    "or skip them with a warning (false).",
)
OVERLAY_MAX_AGE_MS = ConfigKey(
    "cowrite.streaming.overlay.max.age.ms",
    0,
    int,
    "Streaming reads: take the watermark from the daemon's END_COMMIT_TIME overlay when it was written at "
    "most this long ago; 0 = always from a listing of the timeline.",
)
