"""The public API, imported as ``cowrite``: tables, writes with the local engine, reads, errors.

::

    import cowrite
    import pyarrow as pa

    table = cowrite.create("/data/orders", name="orders", record_key_fields=["id"],
                           partition_fields=["region"], ordering_fields=["version"])
    done = cowrite.upsert(table, pa.table({"id": [1], "region": ["eu"], "version": [1]}))
    cowrite.snapshot(table)                               # all visible records
    cowrite.incremental(table, since=done.completion_time)

Every write is one instant, committed with optimistic concurrency against every other writer of the
table, in this process or any other: it either completes whole or leaves nothing visible. The Spark engine
and the ``cowrite`` data source are :mod:`cowrite.spark`; the modules under this package are internal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from cowrite.engine.operations import Operation
from cowrite.errors import (  # noqa: F401  (re-exported as cowrite.<Error>)
    BaseFileGoneError,
    CheckpointArchivedError,
    CommitFailedError,
    CommitStateUnknownError,
    ConfigError,
    CorruptTimelineError,
    CowriteError,
    InstantGoneError,
    InvalidTablePropertiesError,
    LeaseLostError,
    LockTimeoutError,
    SchemaError,
    StorageError,
    TableExistsError,
    TableNotFoundError,
    TimeTravelCleanedError,
    TxnAlreadyCommittedError,
    WriteConflictError,
)
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.local import read
from cowrite.local.read import Pull, PullMode
from cowrite.local.writer import LocalWriter
from cowrite.protocol.transaction import WriteOptions
from cowrite.protocol.txn import Txn  # noqa: F401  (re-exported as cowrite.Txn)
from cowrite.spark import options as _spark_options  # noqa: F401  (every setting checked on open; no Spark)


def create(
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
    """Create an empty table at ``uri`` (a local path, ``s3://bucket/path``, or any fsspec URL).

    ``properties`` are Hudi table properties and cowrite settings (README, "Settings"), kept in
    ``.hoodie/hoodie.properties`` for every writer; ``hoodie.table.create.schema`` declares the schema
    before the first write. ``storage_options`` go to the storage (endpoint, credentials). Raises
    :class:`TableExistsError` if a table is there, :class:`ConfigError` for a bad setting.
    """
    return Table.create(
        uri,
        name=name,
        record_key_fields=record_key_fields,
        partition_fields=partition_fields,
        ordering_fields=ordering_fields,
        hive_style_partitioning=hive_style_partitioning,
        properties=properties,
        storage_options=storage_options,
    )


def load(uri: str, **storage_options: Any) -> Table:
    """The table at ``uri``; raises :class:`TableNotFoundError` where there is none and
    :class:`InvalidTablePropertiesError` for a table this version cannot write (not version 8)."""
    return Table.load(uri, **storage_options)


def timeline(table: Table | str) -> Timeline:
    """The table's active timeline as it is now: every instant, requested, inflight or completed."""
    return _table(table).timeline()


def write(
    table: Table | str, data: pa.Table, operation: Operation | str, settings: Mapping[str, str] | None = None
) -> Instant:
    """Write ``data`` as one instant of ``operation`` (insert, upsert, delete, insert_overwrite); returns
    the completed instant. ``settings`` override the table's for this write (README, "Settings").

    ``data`` is held to the table's schema first: input that does not fit raises :class:`SchemaError`
    before anything is written. Then :class:`WriteConflictError` (another writer committed to the same
    file groups, or inserted the same new key, first; retried as ``hoodie.write.num.retries.on.conflict``
    says), :class:`LockTimeoutError`, :class:`LeaseLostError` — each with nothing of the write visible —
    or :class:`CommitStateUnknownError`, when storage failed while the commit was being published: look at
    the timeline before retrying.
    """
    table = _table(table)
    config = table.config.with_values(dict(settings)) if settings else table.config
    instant = LocalWriter(table, WriteOptions(config=config)).write(data, operation)
    assert instant is not None  # without a txn (LocalWriter) a write commits or raises
    return instant


def insert(table: Table | str, data: pa.Table, settings: Mapping[str, str] | None = None) -> Instant:
    """Append ``data`` (small file groups are filled first); keys are not looked up. See :func:`write`."""
    return write(table, data, Operation.INSERT, settings)


def upsert(table: Table | str, data: pa.Table, settings: Mapping[str, str] | None = None) -> Instant:
    """Replace the stored record of each key in ``data``, insert the rest; the ordering fields decide
    between versions of a key, in the batch and against the table. See :func:`write`."""
    return write(table, data, Operation.UPSERT, settings)


def delete(table: Table | str, keys: pa.Table, settings: Mapping[str, str] | None = None) -> Instant:
    """Remove the records whose keys ``keys`` holds (partition columns, if present, narrow the lookup).
    See :func:`write`."""
    return write(table, keys, Operation.DELETE, settings)


def insert_overwrite(
    table: Table | str, data: pa.Table, settings: Mapping[str, str] | None = None
) -> Instant:
    """Replace the partitions present in ``data`` with its records (a replacecommit). See :func:`write`."""
    return write(table, data, Operation.INSERT_OVERWRITE, settings)


def snapshot(
    table: Table | str,
    as_of: str | None = None,
    columns: Sequence[str] | None = None,
    partitions: Iterable[str] | None = None,
    with_meta: bool = False,
) -> pa.Table:
    """Every visible record; with ``as_of`` (a requested instant time), the table as that instant left
    it. Raises :class:`TimeTravelCleanedError` when cleaning removed the files ``as_of`` needs, and
    :class:`CorruptTimelineError` for a damaged completed commit — never a silently shorter answer."""
    return read.snapshot(_table(table), as_of, columns, partitions, with_meta)


def incremental(
    table: Table | str,
    since: str | None = None,
    until: str | None = None,
    columns: Sequence[str] | None = None,
    with_meta: bool = False,
) -> pa.Table:
    """The records written by the commits that completed in ``(since, until]`` — completion times, so a
    slow commit that completed after a faster, later one is not skipped."""
    return read.incremental(_table(table), since, until, columns, with_meta)


def pull(
    table: Table | str,
    checkpoint: str | None,
    mode: PullMode = PullMode.COMPLETION_TIME,
    with_meta: bool = False,
) -> Pull:
    """Everything committed since ``checkpoint`` and the checkpoint to store for the next pull: every
    record of every commit comes in exactly one pull, however writers interleave. Raises
    :class:`CheckpointArchivedError` when commits after the checkpoint were archived."""
    return read.pull(_table(table), checkpoint, mode, with_meta)


def _table(table: Table | str) -> Table:
    return Table.load(table) if isinstance(table, str) else table
