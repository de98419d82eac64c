"""cowrite: several independent writers, one Apache Hudi table (copy-on-write, table version 8).

The public API (:mod:`cowrite.api`): ``cowrite.create``, ``load``, ``timeline``; ``insert``, ``upsert``,
``delete``, ``insert_overwrite``, ``write``; ``snapshot``, ``incremental``, ``pull``; the errors. The Spark
engine is :mod:`cowrite.spark`. Names are resolved on first use, so ``python -m cowrite`` starts (and
can be stopped) before pyarrow is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time the names resolve on first use
    from cowrite.api import *  # noqa: F403

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    api = importlib.import_module("cowrite.api")
    if name in api.__all__:
        return getattr(api, name)
    raise AttributeError(f"module 'cowrite' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *importlib.import_module("cowrite.api").__all__])
