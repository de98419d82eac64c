"""``python -m cowrite`` and the ``cowrite`` command.

For ``cowrite daemon`` the stop signals are caught before the command's modules are imported, which takes
a noticeable fraction of a second (see :mod:`cowrite.shutdown`): SIGTERM during start-up still drains.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["daemon"]:
        from cowrite.shutdown import catch

        catch()
    from cowrite.cli import main as run

    run()


if __name__ == "__main__":
    main()
