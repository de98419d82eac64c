"""A Spark application that writes a table with ``cowrite write --engine spark``, for the multi-process tests.

Run it from ``tests/`` as ``python -m support.spark_writer --name NAME --peers N --barrier-dir DIR
--result FILE --round '["write", URI, "--input", ...]' [--round ...] [--master spark://...]``. Each process
is a Spark application of its own: one SparkSession (``local[1]``, or one core of the cluster at
``--master``), started first, which every ``cowrite`` command then uses (an active session is used as it
is and left running). Each ``--round`` is one ``cowrite`` command line (a
JSON list), run through :mod:`cowrite.cli` in this process, so its exit code is the CLI's: 0 committed,
3 write conflict, and so on.

**Overlap on purpose.** Before a round's commit (entry of ``Transaction.commit``, after every base file
is written) the process waits at a barrier until all ``--peers`` processes reached the commit of the same
round: every two writes of a round have both begun before either commits, so when they touch the same
file group one of them must lose. The hook wraps cowrite's function in this process only.

``--result`` receives JSON: per round the exit code and the instant the round began.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from cowrite import steps
from cowrite.cli import cli
from cowrite.shutdown import exit_now
from cowrite.steps import Step
from support.spark import cluster_session, local_session


def wait_for_peers(directory: Path, round_number: int, name: str, peers: int, timeout: float) -> None:
    (directory / f"round-{round_number}-{name}").touch()
    deadline = time.monotonic() + timeout
    while len(list(directory.glob(f"round-{round_number}-*"))) < peers:
        if time.monotonic() > deadline:
            raise SystemExit(f"spark_writer {name}: peers did not reach round {round_number} in {timeout} s")
        time.sleep(0.02)


def install_barrier(directory: Path, name: str, peers: int, timeout: float, began: list[str]) -> None:
    """Commit in rounds with the peers: each waits at :data:`Step.WRITTEN` until all have written."""
    commits = [0]

    def observer(step: Step, instant: str | None, details: dict[str, Any]) -> None:
        if step is Step.CLAIMED and details["action"] in ("commit", "replacecommit"):
            began.append(instant or "")
        elif step is Step.WRITTEN:
            wait_for_peers(directory, commits[0], name, peers, timeout)
            commits[0] += 1

    steps.observe_forever(observer)


def start_spark(master: str) -> Any:
    if master.startswith("spark://"):
        return cluster_session(master, "cowrite-spark-writer")
    return local_session(1, "512m", "cowrite-spark-writer")


def run_command(arguments: list[str]) -> int:
    try:
        cli.main(args=arguments, prog_name="cowrite", standalone_mode=True)
    except SystemExit as exit_:
        return int(exit_.code or 0) if not isinstance(exit_.code, str) else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark_writer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--peers", type=int, default=1)
    parser.add_argument("--barrier-dir", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--round", action="append", default=[], help="a cowrite command line as JSON")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--master", default="local[1]", help="local[1] or a spark:// URL")
    args = parser.parse_args(argv)
    began: list[str] = []
    install_barrier(args.barrier_dir, args.name, args.peers, args.timeout, began)
    spark = start_spark(args.master)
    codes = []
    try:
        for command in args.round:
            began_before = len(began)
            code = run_command(json.loads(command))
            codes.append(
                {"exit": code, "instant": began[began_before] if len(began) > began_before else None}
            )
    finally:
        spark.stop()
    args.result.write_text(json.dumps({"name": args.name, "rounds": codes}))
    return 0


if __name__ == "__main__":
    exit_now(main())
