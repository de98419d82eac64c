"""Clustering: rewrite many small file groups of a partition into fewer, optionally sorted.

Scheduling happens under the table lock on a static view of the table, by a job dedicated to it
(:func:`schedule_clustering`): the plan — which base files go into which new file group — is the content
of ``<t>.replacecommit.requested``. Execution (:func:`execute_clustering`) may run anywhere, on Spark
through ``map_jobs``: each new file group is one job, which reads its inputs and writes one base file
keeping every row's meta columns (an incremental reader must not see clustered rows as new). The commit
is a replacecommit replacing the inputs.

Who wins when ingestion touches a file group being clustered is ``hoodie.clustering.updates.strategy``:

- ``allow`` (ingestion first, the default): a pending clustering never blocks a writer; at its own commit
  the clustering aborts with a conflict. If the clustering completed first, the writer reverts it
  (:func:`revert_clusterings`): a new replacecommit replaces the clustering's output with the input file
  groups rewritten as new file groups (the whole mapping, M to N), the writer's own rows included. The
  cleaner keeps the inputs' files while a writer that began before the clustering completed is pending.
- ``reject`` (clustering first): pending clustering plans count as touched, so the writer aborts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from cowrite.engine.file_group import read_base_file
from cowrite.engine.records import FILE_NAME, RECORD_KEY
from cowrite.format import claims
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.fs_view import BaseFile, FileSystemView
from cowrite.format.instant import Action, Instant, State
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.locks import TableLock
from cowrite.protocol.revert import REVERTED_KEY, Revert
from cowrite.protocol.table_schema import latest_schema
from cowrite.protocol.transaction import RevertClustering, Transaction, WriteOptions
from cowrite.storage.backend import Storage

CLUSTER = "cluster"
INPUTS_KEY = "cowrite.clustering.inputs"  # json: output path -> input base file paths
SORT_KEY = "cowrite.clustering.sort.columns"
SEEN_KEY = "cowrite.clustering.seen.completion"  # latest completion time the plan was made on

MapJobs = Callable[[Callable[["ClusterJob"], WriteStat], Sequence["ClusterJob"]], list[WriteStat]]


def map_locally(function: Callable[[ClusterJob], WriteStat], jobs: Sequence[ClusterJob]) -> list[WriteStat]:
    return [function(job) for job in jobs]


@dataclass(frozen=True)
class ClusterJob:
    """One new file group: everything a worker needs, picklable."""

    uri: str
    storage_options: Mapping[str, Any]
    partition: str
    file_id: str
    output: str
    inputs: tuple[str, ...]
    sort_columns: tuple[str, ...]


def schedule_clustering(
    table: Table,
    lock: TableLock,
    small_file_limit: int | None = None,
    target_file_size: int | None = None,
    sort_columns: Sequence[str] = (),
    now: float | None = None,
) -> Instant | None:
    """Plan clustering of the small file groups no pending plan touches; None when nothing qualifies."""
    small = table.config.get(keys.PARQUET_SMALL_FILE_LIMIT) if small_file_limit is None else small_file_limit
    target = table.config.get(keys.PARQUET_MAX_FILE_SIZE) if target_file_size is None else target_file_size
    with lock:
        timeline = table.timeline()
        busy = {
            group
            for instant in timeline.pending()
            if (plan := table.pending_plan(instant)) is not None
            for group in plan.touched_file_groups
        }
        view = FileSystemView.build(table, timeline)
        bins: list[tuple[str, list[BaseFile]]] = []
        for partition in sorted(view.partitions):
            current: list[BaseFile] = []
            for group in view.in_partition(partition):
                if group.latest.size >= small or (partition, group.file_id) in busy:
                    continue
                if current and sum(b.size for b in current) + group.latest.size > target:
                    bins.append((partition, current))
                    current = []
                current.append(group.latest)
            bins.append((partition, current))
        bins = [(p, files) for p, files in bins if len(files) >= 2]
        if not bins:
            return None
        outputs = [(p, f"{uuid.uuid4()}-0", files) for p, files in bins]

        def plan_for(instant_time: str) -> bytes:
            inputs = {}
            stats = []
            for partition, file_id, files in outputs:
                name = BaseFile.file_name(file_id, "0-0-1", instant_time)
                path = f"{partition}/{name}" if partition else name
                inputs[path] = [b.path for b in files]
                stats.append(WriteStat(file_id, path, partition, "null", 0, 0, 0, 0, 0))
            replaced: dict[str, tuple[str, ...]] = {}
            for partition, _, files in outputs:
                replaced[partition] = replaced.get(partition, ()) + tuple(b.file_id for b in files)
            extra = {
                INPUTS_KEY: json.dumps(inputs),
                SORT_KEY: ",".join(sort_columns),
                SEEN_KEY: timeline.latest_completion_time or "",
            }
            return CommitMetadata(
                CLUSTER, tuple(stats), replaced, latest_schema(table, timeline), extra
            ).to_bytes(Action.REPLACE_COMMIT)

        now_ms = int((time.time() if now is None else now) * 1000)
        return claims.claim_instant(table, timeline, Action.REPLACE_COMMIT, now_ms, plan_for, lock=lock)


def execute_clustering(
    table: Table, instant: Instant, map_jobs: MapJobs = map_locally, options: WriteOptions | None = None
) -> Instant:
    """Carry out a planned clustering and commit it; raises WriteConflictError if ingestion won."""
    plan = table.service_plan(instant)
    if plan is None:
        raise ValueError(f"{instant} holds no clustering plan")
    seen_completion = plan.extra.get(SEEN_KEY, "")
    seen = Timeline(i for i in table.timeline().completed() if (i.completion_time or "") <= seen_completion)
    transaction = Transaction.adopt(table, instant, plan, seen, options)
    try:
        inputs = json.loads(plan.extra[INPUTS_KEY])
        sort_columns = tuple(c for c in plan.extra.get(SORT_KEY, "").split(",") if c)
        jobs = [
            ClusterJob(
                table.storage.uri,
                table.storage.portable_options(),
                s.partition_path,
                s.file_id,
                s.path,
                tuple(inputs[s.path]),
                sort_columns,
            )
            for s in plan.write_stats
        ]
        stats = map_jobs(rewrite_file_group, jobs)
        transaction.check_alive()
    except BaseException as exc:
        transaction.abort(exc)
        raise
    return transaction.commit(
        CommitMetadata(CLUSTER, tuple(stats), plan.replaced_file_ids, plan.schema, plan.extra)
    )


def pending_clusterings(table: Table) -> list[Instant]:
    """Clustering plans nobody executes yet (an inflight one has an executor, or is rolled back)."""
    timeline = table.timeline()
    return [i for i in timeline.pending() if i.state is State.REQUESTED and table.service_plan(i) is not None]


def rewrite_file_group(job: ClusterJob) -> WriteStat:
    """Write ``job.output`` from the rows of ``job.inputs``, meta columns kept (runs on a worker)."""
    storage = Storage.for_uri(job.uri, **job.storage_options)
    rows = pa.concat_tables(
        [read_base_file(storage, path) for path in job.inputs], promote_options="permissive"
    )
    return _write_rows(storage, rows, job.partition, job.file_id, job.output, job.sort_columns)


def _write_rows(
    storage: Storage, rows: pa.Table, partition: str, file_id: str, output: str, sort_columns: Sequence[str]
) -> WriteStat:
    name = output.rsplit("/", 1)[-1]
    rows = rows.set_column(
        rows.schema.get_field_index(FILE_NAME), FILE_NAME, pa.repeat(pa.scalar(name), rows.num_rows)
    )
    rows = rows.sort_by([(c, "ascending") for c in (*sort_columns, RECORD_KEY)])
    with storage.open_output(output) as stream:
        pq.write_table(rows, stream)
    size = storage.stat(output).size
    return WriteStat(file_id, output, partition, "null", rows.num_rows, 0, 0, 0, size)


def revert_clusterings(table: Table, written: Mapping[tuple[str, str], str]) -> RevertClustering:
    """The resolver an ingestion passes to commit: ``written`` maps its file groups to its new files."""

    def resolve(transaction: Transaction, clusterings: list[Instant], timeline: Timeline) -> Revert | None:
        outputs: set[tuple[str, str]] = set()
        sources: list[tuple[str, str]] = []  # (partition, base file to copy)
        replaced: dict[str, set[str]] = {}
        for clustering in clusterings:
            metadata = table.commit_metadata(clustering)
            made = {(s.partition_path, s.file_id) for s in metadata.write_stats}
            later = [
                i
                for i in timeline.data_commits()
                if (i.completion_time or "") > (clustering.completion_time or "")
            ]
            if any(table.commit_metadata(i).touched_file_groups & made for i in later if i != clustering):
                return None  # its output was changed since: reverting would lose those changes
            outputs |= made
            for paths in json.loads(metadata.extra[INPUTS_KEY]).values():
                for path in paths:
                    base = BaseFile.parse(table.storage.stat(path))
                    assert base is not None
                    sources.append((base.partition, written.get((base.partition, base.file_id), path)))
                    replaced.setdefault(base.partition, set()).add(base.file_id)
            for partition, file_id in made:
                replaced.setdefault(partition, set()).add(file_id)
        now = int(transaction.options.clock() * 1000)
        requested = claims.claim_instant(table, timeline, Action.REPLACE_COMMIT, now, lock=transaction.lock)
        jobs = [(partition, f"{uuid.uuid4()}-0", source) for partition, source in sources]
        stats = []
        planned = CommitMetadata(
            "cluster_revert",
            tuple(
                WriteStat(f, _path(p, f, requested.requested_time), p, "null", 0, 0, 0, 0, 0)
                for p, f, _ in jobs
            ),
            {p: tuple(sorted(ids)) for p, ids in replaced.items()},
            latest_schema(table, timeline),
            {REVERTED_KEY: ",".join(c.requested_time for c in clusterings)},
        )
        inflight = requested.transition(State.INFLIGHT)
        table.storage.write(table.instant_path(inflight), planned.to_bytes(Action.REPLACE_COMMIT))
        for partition, file_id, source in jobs:
            output = _path(partition, file_id, requested.requested_time)
            stats.append(
                _write_rows(
                    table.storage, read_base_file(table.storage, source), partition, file_id, output, ()
                )
            )
        plan = CommitMetadata(
            planned.operation, tuple(stats), planned.replaced_file_ids, planned.schema, planned.extra
        )
        return Revert(inflight, plan)

    return resolve


def _path(partition: str, file_id: str, instant_time: str) -> str:
    name = BaseFile.file_name(file_id, "0-0-1", instant_time)
    return f"{partition}/{name}" if partition else name
