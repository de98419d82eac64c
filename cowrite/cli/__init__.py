"""The ``cowrite`` command: what operators and scripts use (``main``; the commands live in
:mod:`.tables`, :mod:`.data`, :mod:`.stream` and :mod:`.services`).

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

from cowrite.cli import data, services, stream, tables  # noqa: F401  (each registers its commands)
from cowrite.cli.common import (
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_LEASE_LOST,
    EXIT_LOCK_TIMEOUT,
    EXIT_UNKNOWN,
    cli,
)

__all__ = [
    "EXIT_CONFLICT", "EXIT_ERROR", "EXIT_LEASE_LOST", "EXIT_LOCK_TIMEOUT", "EXIT_UNKNOWN", "cli", "main"
]


def main() -> None:
    cli()
