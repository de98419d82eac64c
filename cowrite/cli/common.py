"""What every ``cowrite`` command shares: the command group, the exit codes, option parsing."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

import click

from cowrite.errors import (
    CommitStateUnknownError,
    CowriteError,
    LeaseLostError,
    LockTimeoutError,
    WriteConflictError,
)
from cowrite.format.table import Table
from cowrite.spark import options as _spark_options  # noqa: F401  (every setting checked on open; no Spark)

EXIT_ERROR, EXIT_USAGE, EXIT_CONFLICT, EXIT_LOCK_TIMEOUT, EXIT_LEASE_LOST, EXIT_UNKNOWN = 1, 2, 3, 4, 5, 6
_EXIT_CODES: list[tuple[type[CowriteError], int]] = [
    (WriteConflictError, EXIT_CONFLICT),
    (LockTimeoutError, EXIT_LOCK_TIMEOUT),
    (LeaseLostError, EXIT_LEASE_LOST),
    (CommitStateUnknownError, EXIT_UNKNOWN),
]


def fail(exc: BaseException) -> NoReturn:
    code = next((c for kind, c in _EXIT_CODES if isinstance(exc, kind)), EXIT_ERROR)
    click.echo(f"cowrite: {exc}", err=True)
    sys.exit(code)


def fail_usage(exc: BaseException) -> NoReturn:
    """A malformed option value: one line, the usage exit code (no usage text, no traceback)."""
    click.echo(f"cowrite: {exc}", err=True)
    sys.exit(EXIT_USAGE)


def parse_options(pairs: Sequence[str]) -> dict[str, str]:
    values = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--option")
        values[name.strip()] = value.strip()
    return values


def split_values(values: Sequence[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cowrite")
def cli() -> None:
    """Multi-writer Apache Hudi tables: several independent writers, one table."""


def with_settings(table: Table, options: Sequence[str]) -> Table:
    return Table(table.storage, table.config.with_values(parse_options(options)))
