"""Commands that move records: write (either engine) and read (snapshot, time travel, incremental).

The engines (pyarrow, pandas) are imported by the commands that run, not with the module: every
``cowrite`` command registers this one, and ``cowrite daemon`` should not carry them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cowrite.cli.common import cli, fail, fail_usage, parse_options
from cowrite.errors import ConfigError, CowriteError
from cowrite.format import config as keys
from cowrite.format.table import Table
from cowrite.protocol.txn import Txn

if TYPE_CHECKING:
    import pyarrow as pa


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
@click.option(
    "--txn-app-id",
    help="Idempotent write: the writing application's id (with --txn-version); a version of it already "
    "committed, or older than one committed, writes nothing and exits 0.",
)
@click.option("--txn-version", help="Idempotent write: the version of this write, a non-negative integer.")
def write(
    path: str,
    input_path: str,
    input_format: str | None,
    operation: str,
    lock_provider: str | None,
    options: Sequence[str],
    engine: str,
    master: str,
    txn_app_id: str | None,
    txn_version: str | None,
) -> None:
    """Write records into the table at PATH as one commit."""
    from cowrite.engine.contract import current_schema
    from cowrite.engine.inputs import read_input
    from cowrite.local.writer import LocalWriter
    from cowrite.protocol.transaction import WriteOptions

    if operation == "bulk_insert" and engine != "spark":
        raise click.UsageError("--operation bulk_insert needs --engine spark")
    try:
        txn = Txn.parse(txn_app_id, txn_version, ("--txn-app-id", "--txn-version"))
    except ConfigError as exc:
        fail_usage(exc)
    try:
        table = Table.load(path)
        settings = parse_options(options)
        if lock_provider:
            settings[keys.LOCK_PROVIDER.key] = lock_provider
        write_options = WriteOptions(config=table.config.with_values(settings), txn=txn)
        if engine == "spark":
            from cowrite.spark import command

            instant, count, refused = command.write(
                table, write_options, input_path, input_format, operation, master
            )
        else:
            data = read_input(input_path, input_format, current_schema(table))
            if data.num_rows == 0:  # as Hudi does for an empty batch: no instant at all
                click.echo(f"nothing written: {input_path} holds no records")
                return
            local = LocalWriter(table, write_options)
            instant = local.write(data, operation, source=input_path)
            count, refused = local.records, local.refused
        if refused is not None:
            click.echo(f"nothing written: {refused.summary}")
            return
        assert instant is not None  # not refused: committed
        done = f"committed {instant.requested_time} ({operation}, {count} records)"
        if operation == "delete":
            deleted = sum(s.num_deletes for s in table.commit_metadata(instant).write_stats)
            done = (
                f"committed {instant.requested_time} (delete: of {count} keys given, {deleted} found and "
                f"deleted, {max(0, count - deleted)} not found)"
            )
    except CowriteError as exc:
        fail(exc)
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
        fail(exc)
    _emit(result, output_format, output)


def _emit(result: pa.Table, output_format: str, output: str | None) -> None:
    import pyarrow as pa
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


