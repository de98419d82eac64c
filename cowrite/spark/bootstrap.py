"""Bootstrap: turn an existing plain parquet dataset into a cowrite table, on Spark.

The dataset's hive-style directories (``field=value/...``) become the table's partitions; every record
is written once, as a ``bulk_insert`` instant, into new base files — the source is only read, and
refused, with nothing made, when a file holds a column of an Arrow extension type. Bootstrap
must come before any other writer (RFC-22: bootstraps do not run in parallel with writers): it refuses
a table that already has an instant. It is an ordinary transaction otherwise, so a failed bootstrap
leaves a pending instant that the lazy rollback removes like any failed write, and running it again
starts a new instant.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from cowrite.engine.schema import refuse_extensions
from cowrite.errors import ConfigError, SchemaError, TableExistsError
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.protocol.liveness import WRITER_ACTIONS
from cowrite.protocol.transaction import WriteOptions
from cowrite.spark.engine import SparkWriter
from cowrite.spark.executor import StorageSpec
from cowrite.storage.backend import Storage

_HIVE_DIRECTORY = re.compile(r"([^=/]+)=[^/]*")


def hive_partition_fields(source: Storage) -> list[str]:
    """The partition fields named by the first path of ``field=value`` directories under ``source``."""
    fields: list[str] = []
    directory = ""
    while True:
        names = [d.rsplit("/", 1)[-1] for d in source.list_dirs(directory)]
        matches = [m for m in (_HIVE_DIRECTORY.fullmatch(n) for n in names) if m]
        if not matches:
            return fields
        fields.append(matches[0].group(1))
        directory = f"{directory}/{matches[0].group(0)}".lstrip("/")


def _check_footers(spark: SparkSession, source: Storage) -> None:
    """Raise :class:`SchemaError` for a column of an Arrow extension type in any parquet file of the dataset
    (a pandas period, say), which Spark reads as its storage type without a word. The files' footers are
    read by a Spark job, a task per core: a dataset's files may be many."""
    files = [info.path for info in source.walk_files() if not _hidden(info.path)]
    if not files:
        return
    tasks = min(len(files), spark.sparkContext.defaultParallelism)
    check = partial(_extension_columns, StorageSpec.of(source))
    refused = spark.sparkContext.parallelize(files, tasks).mapPartitions(check).take(1)
    if refused:
        raise SchemaError(refused[0])


def _hidden(path: str) -> bool:
    """Whether Spark's reader leaves the file out: a name on its path begins with "." or "_"."""
    return any(name.startswith((".", "_")) for name in path.split("/"))


def _extension_columns(source: StorageSpec, paths: Iterable[str]) -> Iterator[str]:
    """On an executor: why each of these files of the dataset is refused, if it is (one that is not parquet
    is left to Spark's reader to report)."""
    storage = source.open()
    for path in paths:
        try:
            with storage.open_input(path) as file:
                schema = pq.read_schema(file)
        except pa.ArrowInvalid:
            continue
        try:
            refuse_extensions(schema, storage.full_path(path))
        except SchemaError as exc:
            yield str(exc)


def bootstrap(
    spark: SparkSession,
    source: str,
    destination: str,
    *,
    record_key_fields: Sequence[str],
    partition_fields: Sequence[str] | None = None,
    ordering_fields: Sequence[str] = (),
    name: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    settings: Mapping[str, str] | None = None,
) -> Instant:
    """Write every record of the parquet dataset at ``source`` into a new table at ``destination``."""
    options = dict(storage_options or {})
    fields = (
        list(partition_fields)
        if partition_fields is not None
        else hive_partition_fields(Storage.for_uri(source, **options))
    )
    frame = spark.read.option("basePath", source).parquet(source)
    missing = [f for f in (*record_key_fields, *fields, *ordering_fields) if f not in frame.columns]
    if missing:
        raise SchemaError(
            f"the dataset at {source} has no column {', '.join(missing)} (columns: {frame.columns})"
        )
    _check_footers(spark, Storage.for_uri(source, **options))
    try:
        table = Table.create(
            destination,
            name=name or destination.rstrip("/").rsplit("/", 1)[-1],
            record_key_fields=record_key_fields,
            partition_fields=fields,
            ordering_fields=ordering_fields,
            hive_style_partitioning=True,
            properties=settings,
            storage_options=options,
        )
    except TableExistsError:
        table = Table.load(destination, **options)
        if table.timeline().filter(actions=WRITER_ACTIONS):  # rollbacks of a failed bootstrap are fine
            raise ConfigError(
                f"{destination} already has instants: bootstrap comes before any other writer. "
                "Bootstrap into a new path, or write the dataset with `cowrite write --engine spark`"
            ) from None
    writer = SparkWriter(table, spark, WriteOptions(config=table.config), source=source)
    instant = writer.bulk_insert(frame)
    assert instant is not None  # without a txn a write commits or raises
    return instant
