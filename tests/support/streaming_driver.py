"""A streaming ingestion query in a process of its own, for the fault tests (``test_streaming_faults.py``).

Run it from ``tests/`` as ``python -m support.streaming_driver TABLE SOURCE CHECKPOINT [options]``. It
upserts every JSON file of SOURCE into TABLE, one file per micro-batch, through
:func:`cowrite.spark.upsert_each_batch`, with its Spark checkpoint in CHECKPOINT; it stops once every file
present when the query started is written (``availableNow``) and exits 0. Records are
``{"id", "part", "ts", "value"}``: the shape of the tests' tables (``support.tables.new_table``).

``--standby GO`` starts the Spark session, then waits for the file GO, which holds the run's further
arguments (a JSON list), before the query starts: starting the JVM is most of a driver's time, and a test
can start the next driver while the one before it runs. ``--started-file`` is written once the query
runs. ``--pause-at STEP --pause-batch N --ready-file F`` stop the driver in micro-batch N: at STEP, a
step of :mod:`cowrite.steps` that the driver reaches while it commits (``requested``, ``planned``,
``written``, ``locked``, ``checked``, ``published``), or at ``committed``, when the batch's write has
returned and Spark has not recorded the batch yet. There it writes F and waits to be killed
(:class:`cowrite.steps.Pause`); after ``--pause-timeout`` seconds it exits 9 (the test that should have
killed it is gone).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cowrite.shutdown import exit_now
from cowrite.spark import upsert_each_batch
from cowrite.steps import Pause, Step, observe
from support import wait_until
from support.spark import local_session

SCHEMA = "id string, part string, ts long, value string"
COMMITTED = "committed"  # the batch's write returned; Spark has not recorded the batch
STANDBY_TIMEOUT = 600.0  # the test's own limit: a driver on standby waits for the runs before it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table")
    parser.add_argument("source", type=Path)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--storage-options", default="{}", help="JSON fsspec options (S3 endpoint, keys)")
    parser.add_argument("--started-file", type=Path)
    parser.add_argument("--pause-at", choices=[*(s.value for s in Step), COMMITTED])
    parser.add_argument("--pause-batch", type=int, default=0)
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--pause-timeout", type=float, default=120.0)
    parser.add_argument("--standby", type=Path, help="start Spark, then wait for this file's arguments")
    args = parser.parse_args(argv)
    spark = local_session(1, "512m", name="streaming-driver")
    if args.standby is not None:
        given = sys.argv[1:] if argv is None else argv
        wait_until(args.standby.exists, "the test to start the query", STANDBY_TIMEOUT)  # written whole
        args = parser.parse_args([*given, *json.loads(args.standby.read_text())])

    # At "committed" the pause is called after the write returns, and its file names the step "published".
    step = Step.PUBLISHED if args.pause_at == COMMITTED else Step(args.pause_at) if args.pause_at else None
    pause = Pause(step, ready=args.ready_file, timeout=args.pause_timeout)
    upserts = upsert_each_batch(args.table, storage_options=json.loads(args.storage_options))
    current: list[int] = []  # the micro-batch being written

    def in_the_batch(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if current == [args.pause_batch] and args.pause_at != COMMITTED:
            pause(step, instant, details)

    def each_batch(df: Any, batch_id: int) -> None:
        current[:] = [batch_id]
        upserts(df, batch_id)
        if batch_id == args.pause_batch and args.pause_at == COMMITTED:
            pause(Step.PUBLISHED, upserts.last.requested_time if upserts.last else None, {})

    with observe(in_the_batch):
        query = (
            spark.readStream.schema(SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .json(str(args.source))
            .writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", str(args.checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        if args.started_file is not None:
            args.started_file.touch()
        query.awaitTermination()
    return 0


if __name__ == "__main__":
    exit_now(main())
