"""``python -m cowrite`` and the ``cowrite`` command.

For ``cowrite daemon`` the stop signals are caught before the command's modules are imported, which takes
a noticeable fraction of a second (see :mod:`cowrite.shutdown`): SIGTERM during start-up still drains.

Once a command has finished — committed or failed, its heartbeats stopped, the requests it made in the
background answered (a lock's release on an object store), its output flushed — the process ends without
the interpreter's teardown (:func:`cowrite.shutdown.exit_now`): a write that had committed, or the demo,
would otherwise exit -6 now and then. Commands stop the Spark sessions they start; Spark's JVM, a child
pyspark started, ends by itself once this process's end closes the pipe to its standard input.

A command that cannot start a Spark session (:func:`_runs_spark`) refuses pandas, which only costs it
time (:mod:`cowrite.startup`).
"""

from __future__ import annotations

import sys

from cowrite.shutdown import catch, exit_now
from cowrite.startup import refuse_pandas


def _runs_spark(args: list[str]) -> bool:
    """Whether the command ``args`` may start a Spark session."""
    command = next((a for a in args if not a.startswith("-")), "")
    spark_engine = "--engine=spark" in args or any(
        a == "--engine" and b == "spark" for a, b in zip(args, args[1:], strict=False)
    )
    return command in ("stream", "demo", "bootstrap") or spark_engine


def main() -> None:
    if sys.argv[1:2] == ["daemon"]:
        catch()
    if not _runs_spark(sys.argv[1:]):
        refuse_pandas()
    from cowrite.cli import main as run

    try:
        run()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    exit_now(code)


if __name__ == "__main__":
    main()
