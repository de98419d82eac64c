"""The local engine: one process writes with pyarrow, no Spark.

Operations follow Hudi's:

- ``insert``: new records, appended (small file groups are filled first); keys are not looked up.
- ``upsert``: records replace the stored record of their key; the ordering field decides between versions
  of a key, within the batch and against the stored record (the larger wins, a tie goes to the newer).
- ``delete``: the keys given are removed (partition columns, if present, narrow the lookup).
- ``insert_overwrite``: the partitions present in the input are replaced by its records (replacecommit).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from cowrite.engine.clustering import revert_clusterings
from cowrite.engine.contract import commit_schema, conform, current_schema, fit
from cowrite.engine.file_group import FileGroupWrite, RecentFiles, write_file_group
from cowrite.engine.planning import (
    FILE_ID,
    SizingPolicy,
    estimate_record_bytes,
    index_keys,
    plan_buckets,
    tag_locations,
    to_work,
)
from cowrite.engine.records import PARTITION_PATH, RECORD_KEY, latest_per_key, partition_paths, record_keys
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.fs_view import FileSystemView
from cowrite.format.instant import Action, Instant
from cowrite.format.table import Table
from cowrite.protocol.key_summary import INSERTED_KEYS, KeySummary
from cowrite.protocol.transaction import Transaction, WriteOptions, retry_on_conflict

log = logging.getLogger(__name__)


class Operation(enum.StrEnum):
    INSERT = "insert"
    UPSERT = "upsert"
    DELETE = "delete"
    INSERT_OVERWRITE = "insert_overwrite"

    @property
    def action(self) -> Action:
        return Action.REPLACE_COMMIT if self is Operation.INSERT_OVERWRITE else Action.COMMIT


class LocalWriter:
    """Writes Arrow tables into one table from this process."""

    def __init__(self, table: Table, options: WriteOptions | None = None) -> None:
        self.table = table
        self.options = options or WriteOptions(config=table.config)
        self._recent = RecentFiles()
        self.records = 0  # records of the last write, after deduplication where the operation merges

    def insert(self, data: pa.Table) -> Instant:
        return self.write(data, Operation.INSERT)

    def upsert(self, data: pa.Table) -> Instant:
        return self.write(data, Operation.UPSERT)

    def delete(self, data: pa.Table) -> Instant:
        return self.write(data, Operation.DELETE)

    def insert_overwrite(self, data: pa.Table) -> Instant:
        return self.write(data, Operation.INSERT_OVERWRITE)

    def write(self, data: pa.Table, operation: Operation | str, source: str = "input") -> Instant:
        """Write ``data`` as one instant; on a conflict retry as configured, each time a new instant.

        ``data`` is held to the table's schema first (:mod:`.contract`): what does not fit raises
        :class:`SchemaError` before anything is written.
        """
        operation = Operation(operation)
        prepared = self._prepare(data, operation, source, current_schema(self.table))
        self.records = prepared.num_rows
        return retry_on_conflict(self.options.config, lambda: self._write_once(prepared, operation))

    # -- preparation -----------------------------------------------------------------------------
    def _prepare(
        self, data: pa.Table, operation: Operation, source: str, current: pa.Schema | None
    ) -> pa.Table:
        """Fit to the table's schema ``current``, add key and partition path columns, and deduplicate
        where the operation merges."""
        table = self.table
        if any(name.startswith("_hoodie_") for name in data.column_names):
            data = data.drop_columns([n for n in data.column_names if n.startswith("_hoodie_")])
        delete = operation is Operation.DELETE
        data = conform(data, fit(data.schema, current, table, delete, source).target, source)
        key_column = record_keys(data, table.record_key_fields, source)
        if delete and not all(f in data.column_names for f in table.partition_fields):
            paths = pa.nulls(data.num_rows, pa.string())  # found by a lookup over all partitions
        else:
            paths = partition_paths(data, table.partition_fields, table.hive_style_partitioning, source)
        prepared = data.append_column(RECORD_KEY, key_column).append_column(PARTITION_PATH, paths)
        if operation in (Operation.UPSERT, Operation.INSERT_OVERWRITE, Operation.DELETE):
            ordering = () if operation is Operation.DELETE else table.ordering_fields
            prepared = latest_per_key(prepared, prepared.column(RECORD_KEY), ordering)
        return prepared

    # -- one instant -----------------------------------------------------------------------------
    def _write_once(self, incoming: pa.Table, operation: Operation) -> Instant:
        transaction = Transaction.begin(self.table, operation.value, operation.action, self.options)
        try:
            metadata = self._write_files(transaction, incoming, operation)
        except BaseException as exc:
            transaction.abort(exc)
            raise
        written = {(s.partition_path, s.file_id): s.path for s in metadata.write_stats}
        return transaction.commit(metadata, revert=revert_clusterings(self.table, written))

    def _write_files(
        self, transaction: Transaction, incoming: pa.Table, operation: Operation
    ) -> CommitMetadata:
        table, instant = self.table, transaction.instant_time
        known_partitions = [
            p for p in pc.unique(incoming.column(PARTITION_PATH)).to_pylist() if p is not None
        ]
        lookup_all = operation is Operation.DELETE and incoming.column(PARTITION_PATH).null_count > 0
        view = FileSystemView.build(
            table, transaction.begin_timeline, partitions=None if lookup_all else known_partitions
        )
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
            table, transaction.begin_timeline, incoming.drop_columns([RECORD_KEY, PARTITION_PATH]).schema,
            delete=operation is Operation.DELETE,
        )
        transaction.plan(self._metadata(operation, [_planned(w) for w in works], replaced, schema))
        stats = []
        for task, (bucket, work) in enumerate(zip(buckets, works, strict=True)):
            transaction.check_alive()
            rows = pa.chunked_array(bucket.rows, pa.uint64()) if bucket.rows else pa.array([], pa.uint64())
            rows_in_group = tagged.take(rows).drop_columns(
                [c for c in (FILE_ID,) if c in tagged.column_names]
            )
            deleted_keys = None
            if operation is Operation.DELETE:
                deleted_keys = rows_in_group.column(RECORD_KEY).combine_chunks()
                rows_in_group = rows_in_group.select([RECORD_KEY, PARTITION_PATH]).slice(0, 0)
            stats.append(
                write_file_group(
                    table.storage,
                    work,
                    instant,
                    rows_in_group,
                    deleted_keys=deleted_keys,
                    ordering=table.ordering_fields,
                    compression=self.options.config.get(keys.PARQUET_COMPRESSION),
                    task=task,
                    recent=self._recent,
                )
            )
        done = self._metadata(operation, stats, replaced, schema)
        if self.options.config.get(keys.CONFLICT_ON_RECORD_KEYS) and operation is not Operation.DELETE:
            new = tagged if FILE_ID not in tagged.column_names else tagged.filter(pc.is_null(tagged[FILE_ID]))
            pairs = zip(new[PARTITION_PATH].to_pylist(), new[RECORD_KEY].to_pylist(), strict=True)
            done = replace(done, extra={INSERTED_KEYS: KeySummary.of(pairs).to_json()})
        return done

    def _metadata(
        self, operation: Operation, stats: list[WriteStat], replaced: dict[str, tuple[str, ...]], schema: str
    ) -> CommitMetadata:
        return CommitMetadata(operation.value, tuple(stats), replaced, schema)


def _planned(work: FileGroupWrite) -> WriteStat:
    return WriteStat(work.file_id, work.new_path, work.partition, work.base_instant or "null", 0, 0, 0, 0, 0)
