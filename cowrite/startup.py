"""What a cowrite process that runs no Spark does at its start: refuse pandas.

pyarrow imports pandas the first time it converts a Python value, only to tell whether the value is a
pandas object, and that import is most of a short command's start (bench/README.md). Nothing cowrite
does without Spark needs pandas; pyspark converts through it, so a process that may start a Spark session
must not call :func:`refuse_pandas`. The ``cowrite`` command calls it for every command that runs no
Spark (:mod:`cowrite.__main__`).
"""

from __future__ import annotations

import sys


class _NoPandas:
    """A finder that refuses ``import pandas``, which pyarrow then takes as pandas not installed."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":  # its submodules are imported after it, so they are refused with it
            raise ModuleNotFoundError("this process runs no Spark and does not load pandas", name=name)


def refuse_pandas() -> None:
    """From now on this process cannot import pandas; call it before pyarrow first converts a value."""
    if not any(isinstance(finder, _NoPandas) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())
