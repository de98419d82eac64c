"""``cowrite stream``: continuous ingestion of the files arriving in a directory, one commit per micro-batch,
exactly once across restarts (the Spark part: :mod:`cowrite.spark.ingest`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from cowrite.cli.common import cli, fail, parse_options
from cowrite.errors import CowriteError
from cowrite.format.table import Table

if TYPE_CHECKING:  # imports Spark: the command imports it when it runs
    from cowrite.spark.ingest import Ingested


@cli.command()
@click.argument("path")
@click.option(
    "--input",
    "input_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="The local directory to follow: each new file of the format is written once.",
)
@click.option(
    "--checkpoint",
    required=True,
    help="Spark's checkpoint directory: where the stream stands. A run from it resumes; a new one starts "
    "with the files present.",
)
@click.option(
    "--operation", type=click.Choice(["upsert", "insert", "delete"]), default="upsert", show_default=True
)
@click.option(
    "--format",
    "input_format",
    type=click.Choice(["json", "csv", "parquet"]),
    default="json",
    show_default=True,
    help="json: JSON Lines (*.json, *.jsonl, *.ndjson); csv: *.csv; parquet: *.parquet. Other files are "
    "ignored.",
)
@click.option(
    "--max-files-per-trigger",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="At most this many files per micro-batch (one commit), oldest first.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--once", is_flag=True, help="Write the files present now, then exit 0 (Trigger.AvailableNow).")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between looks at the directory (without --once).",
)
@click.option(
    "--option",
    "-o",
    "options",
    multiple=True,
    help="Write setting KEY=VALUE, or spark.*=VALUE for the Spark session (repeatable).",
)
def stream(
    path: str,
    input_dir: str,
    checkpoint: str,
    operation: str,
    input_format: str,
    max_files_per_trigger: int,
    master: str,
    once: bool,
    interval: float,
    options: Sequence[str],
) -> None:
    """Write the files arriving in --input into the table at PATH, each micro-batch one commit, exactly once
    across restarts from one --checkpoint.

    Runs until SIGTERM or SIGINT (the micro-batch being written is finished first), or with --once until
    the files present at its start are written; then exits 0. A micro-batch that fails stops it with the
    write's exit code; nothing of that batch is visible, and the next run writes it.
    """
    from cowrite import shutdown

    stop = shutdown.catch()  # before Spark starts: a request during start-up stops at the first chance
    try:
        table = Table.load(path)
        settings = parse_options(options)
        from cowrite.spark import command, ingest

        spark, created = command.session(master, settings)
        try:
            ingest.quiet(spark)
            ingestion = ingest.Ingestion(table, operation, input_format, settings, on_batch=_say)
            query = ingestion.start(spark, input_dir, checkpoint, max_files_per_trigger, once, interval)
            done = ingestion.run(query, stop)
        finally:
            if created:
                spark.stop()
    except CowriteError as exc:
        fail(exc)
    how = "stopped on request" if stop.is_set() else "caught up"
    batches = f"{done.batches} micro-batch" + ("es" if done.batches != 1 else "")
    click.echo(
        f"{how}: {batches}, {done.commits} committed ({done.records} records), "
        f"{done.committed_before} committed before"
    )


def _say(batch: Ingested) -> None:
    names = ", ".join(name.rpartition("/")[2] for name in batch.files)
    if batch.refused is not None:
        click.echo(f"micro-batch {batch.batch_id}: nothing written: {batch.refused.summary}")
    elif batch.instant is None:
        click.echo(f"micro-batch {batch.batch_id}: nothing written: {names} holds no records")
    else:
        instant = batch.instant
        click.echo(
            f"micro-batch {batch.batch_id}: committed {instant.requested_time} "
            f"({batch.operation}, {batch.records} records of {names}), completed at {instant.completion_time}"
        )
