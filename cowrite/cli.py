"""The ``cowrite`` command: what operators and scripts use.

Errors print one line on stderr and exit with a code that says what happened:

==  ==========================================================================
0   success
1   error (bad input, corrupt table, storage failure); nothing was committed
2   usage error
3   write conflict: another writer committed to the same file groups first
4   the table lock could not be acquired in time
5   the writer lost its lease (heartbeat expired or lock taken over)
6   commit state unknown: look at the timeline before retrying
==  ==========================================================================
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click
import pyarrow as pa

from cowrite.engine.contract import current_schema
from cowrite.engine.inputs import read_input
from cowrite.errors import (
    CommitStateUnknownError,
    CorruptTimelineError,
    CowriteError,
    LeaseLostError,
    LockTimeoutError,
    SchemaError,
    WriteConflictError,
)
from cowrite.format import config as keys
from cowrite.format.table import Table
from cowrite.protocol.transaction import WriteOptions

if TYPE_CHECKING:
    from cowrite.engine.clustering import MapJobs

EXIT_ERROR, EXIT_CONFLICT, EXIT_LOCK_TIMEOUT, EXIT_LEASE_LOST, EXIT_UNKNOWN = 1, 3, 4, 5, 6
_EXIT_CODES: list[tuple[type[CowriteError], int]] = [
    (WriteConflictError, EXIT_CONFLICT),
    (LockTimeoutError, EXIT_LOCK_TIMEOUT),
    (LeaseLostError, EXIT_LEASE_LOST),
    (CommitStateUnknownError, EXIT_UNKNOWN),
]


def _fail(exc: BaseException) -> NoReturn:
    code = next((c for kind, c in _EXIT_CODES if isinstance(exc, kind)), EXIT_ERROR)
    click.echo(f"cowrite: {exc}", err=True)
    sys.exit(code)


def _options(pairs: Sequence[str]) -> dict[str, str]:
    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        values[name.strip()] = value.strip()
    return values


def _split(values: Sequence[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cowrite")
def cli() -> None:
    """Multi-writer Apache Hudi tables: several independent writers, one table."""


@cli.command()
@click.argument("path")
@click.option(
    "--record-key", multiple=True, required=True, help="Record key field(s), comma-separated or repeated."
)
@click.option("--partition-field", multiple=True, help="Partition field(s), comma-separated or repeated.")
@click.option(
    "--ordering-field", multiple=True, help="Field deciding between versions of a key (larger wins)."
)
@click.option("--name", help="Table name (default: the last part of PATH).")
@click.option("--hive-style/--no-hive-style", default=False, help="Partition directories named field=value.")
@click.option("--option", "-o", "options", multiple=True, help="Extra table property KEY=VALUE (repeatable).")
@click.option(
    "--schema",
    "schema_file",
    type=click.Path(exists=True, dir_okay=False),
    help="Avro record schema (JSON) that fixes the table's columns before the first write.",
)
def init(
    path: str,
    record_key: Sequence[str],
    partition_field: Sequence[str],
    ordering_field: Sequence[str],
    name: str | None,
    hive_style: bool,
    options: Sequence[str],
    schema_file: str | None,
) -> None:
    """Create an empty table at PATH (local or s3://)."""
    from cowrite.engine.contract import declared_schema

    keys_, partitions, ordering = _split(record_key), _split(partition_field), _split(ordering_field)
    try:
        properties = _options(options)
        if schema_file:
            try:
                text = Path(schema_file).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise SchemaError(f"cannot read {schema_file}: {exc}") from None
            declared = declared_schema(text, [*keys_, *partitions, *ordering], schema_file)
            properties[keys.TABLE_CREATE_SCHEMA.key] = declared
        table = Table.create(
            path,
            name=name or path.rstrip("/").rsplit("/", 1)[-1],
            record_key_fields=keys_,
            partition_fields=partitions,
            ordering_fields=ordering,
            hive_style_partitioning=hive_style,
            properties=properties,
        )
    except CowriteError as exc:
        _fail(exc)
    click.echo(f"created table {table.name} at {table.uri}")


@cli.command()
@click.argument("path")
@click.option("--input", "input_path", required=True, help="Parquet, CSV or JSON Lines file, or a directory.")
@click.option("--input-format", type=click.Choice(["parquet", "csv", "jsonl"]), help="Override detection.")
@click.option(
    "--operation",
    type=click.Choice(["insert", "upsert", "delete", "insert_overwrite", "bulk_insert"]),
    default="upsert",
    show_default=True,
    help="bulk_insert needs --engine spark.",
)
@click.option(
    "--lock-provider",
    type=click.Choice(["filesystem", "zookeeper", "in-process"]),
    help="Table lock (default: the table's hoodie.write.lock.provider, else filesystem).",
)
@click.option("--option", "-o", "options", multiple=True, help="Write setting KEY=VALUE (repeatable).")
@click.option(
    "--engine",
    type=click.Choice(["local", "spark"]),
    default="local",
    show_default=True,
    help="local: this process with pyarrow; spark: a Spark job (-o spark.*=... configures its session).",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL (--engine spark).")
def write(
    path: str,
    input_path: str,
    input_format: str | None,
    operation: str,
    lock_provider: str | None,
    options: Sequence[str],
    engine: str,
    master: str,
) -> None:
    """Write records into the table at PATH as one commit."""
    from cowrite.local.writer import LocalWriter

    if operation == "bulk_insert" and engine != "spark":
        raise click.UsageError("--operation bulk_insert needs --engine spark")
    try:
        table = Table.load(path)
        settings = _options(options)
        if lock_provider:
            settings[keys.LOCK_PROVIDER.key] = lock_provider
        write_options = WriteOptions(config=table.config.with_values(settings))
        if engine == "spark":
            from cowrite.spark import command

            instant, count = command.write(
                table, write_options, input_path, input_format, operation, master
            )
        else:
            data = read_input(input_path, input_format, current_schema(table))
            if data.num_rows == 0:  # as Hudi does for an empty batch: no instant at all
                click.echo(f"nothing written: {input_path} holds no records")
                return
            local = LocalWriter(table, write_options)
            instant = local.write(data, operation, source=input_path)
            count = local.records
        done = f"committed {instant.requested_time} ({operation}, {count} records)"
        if operation == "delete":
            deleted = sum(s.num_deletes for s in table.commit_metadata(instant).write_stats)
            done = (
                f"committed {instant.requested_time} (delete: of {count} keys given, {deleted} found and "
                f"deleted, {max(0, count - deleted)} not found)"
            )
    except CowriteError as exc:
        _fail(exc)
    click.echo(f"{done}, completed at {instant.completion_time}")


@cli.command()
@click.argument("path")
@click.option("--as-of", help="Time travel: the table as of this requested instant time.")
@click.option("--since", help="Incremental: records of commits completed after this completion time.")
@click.option("--until", help="Incremental: ... and at or before this completion time.")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["jsonl", "csv", "parquet"]),
    default="jsonl",
    show_default=True,
)
@click.option("--output", help="Write here instead of stdout (required for parquet).")
@click.option("--with-meta", is_flag=True, help="Include the _hoodie_* meta columns.")
def read(
    path: str,
    as_of: str | None,
    since: str | None,
    until: str | None,
    output_format: str,
    output: str | None,
    with_meta: bool,
) -> None:
    """Read the table at PATH: snapshot, time travel or incremental."""
    from cowrite.local import read as readers

    if as_of and (since or until):
        raise click.UsageError("--as-of (time travel) and --since/--until (incremental) exclude each other")
    if output_format == "parquet" and not output:
        raise click.UsageError("--format parquet needs --output FILE")
    try:
        table = Table.load(path)
        if since or until:
            result = readers.incremental(table, since=since, until=until, with_meta=with_meta)
        else:
            result = readers.snapshot(table, as_of=as_of, with_meta=with_meta)
    except (CowriteError, ValueError) as exc:
        _fail(exc)
    _emit(result, output_format, output)


def _emit(result: pa.Table, output_format: str, output: str | None) -> None:
    import pyarrow.csv as csv
    import pyarrow.parquet as pq

    if output_format == "parquet":
        pq.write_table(result, output)
    elif output_format == "csv":
        if output:
            csv.write_csv(result, output)
        else:
            sink = pa.BufferOutputStream()
            csv.write_csv(result, sink)
            sys.stdout.write(sink.getvalue().to_pybytes().decode())
    else:
        lines = (json.dumps(row, default=str, sort_keys=False) for row in result.to_pylist())
        if output:
            Path(output).write_text("".join(f"{line}\n" for line in lines))
        else:
            for line in lines:
                sys.stdout.write(line + "\n")


@cli.command()
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per instant.")
def timeline(path: str, as_json: bool) -> None:
    """Show the instants of the table at PATH; a completed commit that cannot be parsed is marked CORRUPT
    and the command then exits 1."""
    try:
        table = Table.load(path)
        instants = list(table.timeline())
    except CowriteError as exc:
        _fail(exc)
    corrupt: dict[str, CorruptTimelineError] = {}
    for instant in instants:
        if instant.is_completed and instant.action.writes_data:
            try:
                table.commit_metadata(instant)
            except CorruptTimelineError as exc:
                corrupt[instant.file_name] = exc
    if not as_json:
        click.echo(f"table {table.name} at {table.uri}: {len(instants)} instants")
    for instant in instants:
        problem = corrupt.get(instant.file_name)
        if as_json:
            view = {
                "requested_time": instant.requested_time,
                "action": instant.action.value,
                "state": instant.state.name,
                "completion_time": instant.completion_time,
            }
            click.echo(json.dumps({**view, "corrupt": str(problem)} if problem else view))
        else:
            click.echo(
                f"{instant.requested_time}  {instant.action.value:<14} {instant.state.name:<10} "
                f"{instant.completion_time or ''}{'  CORRUPT' if problem else ''}"
            )
    if corrupt:  # the first; the listing above marks every one
        _fail(next(iter(corrupt.values())))


@cli.command()
@click.argument("path")
@click.option("--option", "-o", "options", multiple=True, help="Setting KEY=VALUE, e.g. heartbeat tolerance.")
def rollback(path: str, options: Sequence[str]) -> None:
    """Roll back the failed writes of the table at PATH (pending, heartbeat expired) once."""
    from cowrite.cleaner import rollback_failed, service_lock
    from cowrite.protocol.heartbeat import HeartbeatPolicy

    try:
        table = _with_settings(Table.load(path), options)
        done = rollback_failed(table, service_lock(table), HeartbeatPolicy.from_config(table.config))
    except CowriteError as exc:
        _fail(exc)
    for item in done:
        click.echo(
            f"rolled back {item.target}: deleted {len(item.deleted)} files ({item.rollback.file_name})"
        )
    if not done:
        click.echo("no failed writes to roll back")


@cli.command()
@click.argument("path")
@click.option("--retain", type=int, help="Commits to retain (default: hoodie.cleaner.commits.retained, 10).")
@click.option("--option", "-o", "options", multiple=True, help="Setting KEY=VALUE.")
def clean(path: str, retain: int | None, options: Sequence[str]) -> None:
    """Delete file versions that the last N commits no longer need, once."""
    from cowrite.cleaner import clean as run_clean
    from cowrite.cleaner import service_lock

    try:
        table = _with_settings(Table.load(path), options)
        retained = retain if retain is not None else table.config.get(keys.CLEANER_COMMITS_RETAINED)
        done = run_clean(table, service_lock(table), retained)
    except CowriteError as exc:
        _fail(exc)
    click.echo(f"deleted {len(done.deleted)} files ({done.clean.file_name})" if done else "nothing to clean")


@cli.command()
@click.argument("path")
@click.option("--sort-by", multiple=True, help="Sort the clustered file groups by these columns.")
@click.option("--small-file-limit", type=int, help="File groups below this size are clustered (bytes).")
@click.option("--target-file-size", type=int, help="Size of the new file groups (bytes).")
@click.option("--schedule-only", is_flag=True, help="Plan under the lock, do not execute.")
@click.option(
    "--engine",
    type=click.Choice(["local", "spark"]),
    default="local",
    show_default=True,
    help="Where the new file groups are written.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL (--engine spark).")
@click.option("--option", "-o", "options", multiple=True, help="Setting KEY=VALUE.")
def cluster(
    path: str,
    sort_by: Sequence[str],
    small_file_limit: int | None,
    target_file_size: int | None,
    schedule_only: bool,
    engine: str,
    master: str,
    options: Sequence[str],
) -> None:
    """Cluster small file groups: plan under the table lock, then execute every pending plan.

    Run it from one job dedicated to table services (RFC-22: scheduling is not every writer's job).
    """
    from cowrite.cleaner import service_lock
    from cowrite.engine.clustering import execute_clustering, pending_clusterings, schedule_clustering

    try:
        table = _with_settings(Table.load(path), options)
        planned = schedule_clustering(
            table, service_lock(table), small_file_limit, target_file_size, _split(sort_by)
        )
        click.echo(f"planned {planned.file_name}" if planned else "nothing to cluster")
        if not schedule_only:
            for instant in pending_clusterings(table):
                done = execute_clustering(table, instant, _cluster_jobs(engine, master, options))
                click.echo(f"clustered {done.file_name}")
    except CowriteError as exc:
        _fail(exc)


def _cluster_jobs(engine: str, master: str, options: Sequence[str]) -> MapJobs:
    from cowrite.engine.clustering import map_locally

    if engine == "local":
        return map_locally
    from cowrite.spark.clustering import map_on_spark
    from cowrite.spark.command import session

    spark, _ = session(master, _options(options))  # stopped with the process
    return map_on_spark(spark)


@cli.command("bootstrap")
@click.argument("source")
@click.argument("destination")
@click.option("--record-key", multiple=True, required=True, help="Record key field(s).")
@click.option(
    "--partition-field", multiple=True, help="Partition field(s) (default: the hive-style directories)."
)
@click.option("--ordering-field", multiple=True, help="Ordering field(s) for later upserts.")
@click.option("--name", help="Table name (default: the last part of DESTINATION).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--option", "-o", "options", multiple=True, help="Table property or spark.* setting KEY=VALUE.")
def bootstrap_command(
    source: str,
    destination: str,
    record_key: Sequence[str],
    partition_field: Sequence[str],
    ordering_field: Sequence[str],
    name: str | None,
    master: str,
    options: Sequence[str],
) -> None:
    """Turn the plain parquet dataset at SOURCE (hive-style partitions) into a table at DESTINATION.

    Run it before any other writer; a failed bootstrap is rolled back like any failed write.
    """
    from cowrite.spark.bootstrap import bootstrap
    from cowrite.spark.command import session

    settings = _options(options)
    spark, created = session(master, settings)
    try:
        instant = bootstrap(
            spark,
            source,
            destination,
            record_key_fields=_split(record_key),
            partition_fields=_split(partition_field) or None,
            ordering_fields=_split(ordering_field),
            name=name,
            settings={k: v for k, v in settings.items() if not k.startswith("spark.")},
        )
    except CowriteError as exc:
        _fail(exc)
    finally:
        if created:
            spark.stop()
    click.echo(f"bootstrapped {source} into {destination} as {instant.file_name}")


@cli.command("archive")
@click.argument("path")
@click.option(
    "--option", "-o", "options", multiple=True, help="Setting KEY=VALUE, e.g. hoodie.keep.max.commits."
)
def archive_command(path: str, options: Sequence[str]) -> None:
    """Move old completed instants off the active timeline (after cleaning), once."""
    from cowrite.cleaner import archive, service_lock

    try:
        table = _with_settings(Table.load(path), options)
        done = archive(table, service_lock(table))
    except CowriteError as exc:
        _fail(exc)
    click.echo(f"archived {len(done.instants)} instants into {done.path}" if done else "nothing to archive")


def _with_settings(table: Table, options: Sequence[str]) -> Table:
    return Table(table.storage, table.config.with_values(_options(options)))


@cli.command()
@click.argument("tables", nargs=-1)
@click.option(
    "--config", "config_path", help="TOML configuration (see the README); tables may also be arguments."
)
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="HTTP port for /metrics, /healthz, /readyz and /api (default 9464).")
@click.option("--poll-interval", type=float, help="Seconds between looks at timelines, heartbeats, locks.")
@click.option("--clean-interval", type=float, help="Seconds between cleaner runs.")
@click.option("--commits-retained", type=int, help="Commits whose file versions cleaning keeps.")
@click.option("--log-level", default="INFO", show_default=True)
def daemon(
    tables: Sequence[str],
    config_path: str | None,
    host: str | None,
    port: int | None,
    poll_interval: float | None,
    clean_interval: float | None,
    commits_retained: int | None,
    log_level: str,
) -> None:
    """Serve tables: follow timelines, expire stale locks, roll back failed writes, clean, export metrics.

    SIGTERM or SIGINT drains (running jobs finish) and exits 0.
    """
    from cowrite import shutdown
    from cowrite.daemon.config import DaemonConfig
    from cowrite.daemon.logs import configure
    from cowrite.daemon.service import Daemon

    stop = shutdown.catch()  # the entry point caught them already; a request made since is kept
    configure(log_level.upper())
    try:
        config = DaemonConfig.load(
            config_path,
            tables,
            host=host,
            port=port,
            poll_interval=poll_interval,
            clean_interval=clean_interval,
            commits_retained=commits_retained,
        )
        service = Daemon(config)
        if not stop.is_set():  # asked to stop while starting: there is nothing to drain
            service.start()
    except (CowriteError, OSError) as exc:
        _fail(exc)
    stop.wait()
    service.stop()


@cli.command()
@click.option("--path", help="Where to create the demo table (default: a new temporary directory).")
def demo(path: str | None) -> None:
    """Show concurrent writers, a conflict, a killed writer and incremental reads on a local table."""
    from cowrite.demo import run

    run(path)


def main() -> None:
    cli()
