"""Commands that create, inspect and maintain a table: init, timeline, rollback, clean, cluster, archive,
bootstrap."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cowrite.errors import (
    CorruptTimelineError,
    CowriteError,
    SchemaError,
)
from cowrite.format import config as keys
from cowrite.format.table import Table

if TYPE_CHECKING:
    from cowrite.engine.clustering import MapJobs

from cowrite.cli.common import cli, fail, parse_options, split_values, with_settings


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

    keys_, partitions = split_values(record_key), split_values(partition_field)
    ordering = split_values(ordering_field)
    try:
        properties = parse_options(options)
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
        fail(exc)
    click.echo(f"created table {table.name} at {table.uri}")


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
        fail(exc)
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
        fail(next(iter(corrupt.values())))


@cli.command()
@click.argument("path")
@click.option("--option", "-o", "options", multiple=True, help="Setting KEY=VALUE, e.g. heartbeat tolerance.")
def rollback(path: str, options: Sequence[str]) -> None:
    """Roll back the failed writes of the table at PATH (pending, heartbeat expired) once."""
    from cowrite.cleaner import rollback_failed, service_lock
    from cowrite.protocol.heartbeat import HeartbeatPolicy

    try:
        table = with_settings(Table.load(path), options)
        done = rollback_failed(table, service_lock(table), HeartbeatPolicy.from_config(table.config))
    except CowriteError as exc:
        fail(exc)
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
    """Delete file versions that the last N commits no longer need, once; then, as the daemon's cleaning
    does, record the table's schema at the latest instant time where a writer died before it could."""
    from cowrite.cleaner import clean as run_clean
    from cowrite.cleaner import service_lock
    from cowrite.protocol.table_schema import record_unseen_schema

    try:
        table = with_settings(Table.load(path), options)
        retained = retain if retain is not None else table.config.get(keys.CLEANER_COMMITS_RETAINED)
        lock = service_lock(table)
        done = run_clean(table, lock, retained)
    except CowriteError as exc:
        fail(exc)
    click.echo(f"deleted {len(done.deleted)} files ({done.clean.file_name})" if done else "nothing to clean")
    try:  # after saying what the clean did: this may fail on its own (the lock busy)
        recorded = record_unseen_schema(table, lock, int(time.time() * 1000))
    except CowriteError as exc:
        fail(exc)
    if recorded is not None:
        click.echo(f"recorded the table's schema at the latest instant time ({recorded.file_name})")


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
        table = with_settings(Table.load(path), options)
        planned = schedule_clustering(
            table, service_lock(table), small_file_limit, target_file_size, split_values(sort_by)
        )
        click.echo(f"planned {planned.file_name}" if planned else "nothing to cluster")
        if not schedule_only:
            for instant in pending_clusterings(table):
                done = execute_clustering(table, instant, _cluster_jobs(engine, master, options))
                click.echo(f"clustered {done.file_name}")
    except CowriteError as exc:
        fail(exc)


def _cluster_jobs(engine: str, master: str, options: Sequence[str]) -> MapJobs:
    from cowrite.engine.clustering import map_locally

    if engine == "local":
        return map_locally
    from cowrite.spark.clustering import map_on_spark
    from cowrite.spark.command import session

    spark, _ = session(master, parse_options(options))  # stopped with the process
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

    settings = parse_options(options)
    spark, created = session(master, settings)
    try:
        instant = bootstrap(
            spark,
            source,
            destination,
            record_key_fields=split_values(record_key),
            partition_fields=split_values(partition_field) or None,
            ordering_fields=split_values(ordering_field),
            name=name,
            settings={k: v for k, v in settings.items() if not k.startswith("spark.")},
        )
    except CowriteError as exc:
        fail(exc)
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
        table = with_settings(Table.load(path), options)
        done = archive(table, service_lock(table))
    except CowriteError as exc:
        fail(exc)
    click.echo(f"archived {len(done.instants)} instants into {done.path}" if done else "nothing to archive")


