"""``python -m cowrite`` and the ``cowrite`` command.

For ``cowrite daemon`` the stop signals are caught before the command's modules are imported, which takes
a noticeable fraction of a second (see :mod:`cowrite.shutdown`): SIGTERM during start-up still drains.

Once a command has finished — committed or failed, its heartbeats stopped, the requests it made in the
background answered (a lock's release on an object store), its output flushed — the process ends without
the interpreter's teardown (:func:`cowrite.shutdown.exit_now`): a write that had committed, or the demo,
would otherwise exit -6 now and then. Commands stop the Spark sessions they start; Spark's JVM, a child
pyspark started, ends by itself once this process's end closes the pipe to its standard input.
"""

from __future__ import annotations

import sys

from cowrite.shutdown import catch, exit_now


def main() -> None:
    if sys.argv[1:2] == ["daemon"]:
        catch()
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
