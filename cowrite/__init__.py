"""cowrite: several independent writers, one Apache Hudi table (copy-on-write, table version 8).

The public API (:mod:`cowrite.api`): ``cowrite.create``, ``load``, ``timeline``; ``insert``, ``upsert``,
``delete``, ``insert_overwrite``, ``write``; ``snapshot``, ``incremental``, ``pull``; the errors. The Spark
engine is :mod:`cowrite.spark`. Names are resolved on first use, so ``python -m cowrite`` starts (and
can be stopped) before pyarrow is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time the names resolve on first use
    from cowrite.api import (
        Instant,
        LocalWriter,
        Operation,
        Pull,
        PullMode,
        Table,
        Timeline,
        Txn,
        WriteOptions,
        create,
        delete,
        incremental,
        insert,
        insert_overwrite,
        load,
        pull,
        snapshot,
        timeline,
        upsert,
        write,
    )
    from cowrite.errors import (
        BaseFileGoneError,
        CheckpointArchivedError,
        CommitFailedError,
        CommitStateUnknownError,
        ConfigError,
        CorruptTimelineError,
        CowriteError,
        InstantGoneError,
        InvalidTablePropertiesError,
        LeaseLostError,
        LockTimeoutError,
        SchemaError,
        StorageError,
        TableExistsError,
        TableNotFoundError,
        TimeTravelCleanedError,
        TxnAlreadyCommittedError,
        WriteConflictError,
    )

__version__ = "0.1.0"

__all__ = [
    "BaseFileGoneError",
    "CheckpointArchivedError",
    "CommitFailedError",
    "CommitStateUnknownError",
    "ConfigError",
    "CorruptTimelineError",
    "CowriteError",
    "Instant",
    "InstantGoneError",
    "InvalidTablePropertiesError",
    "LeaseLostError",
    "LocalWriter",
    "LockTimeoutError",
    "Operation",
    "Pull",
    "PullMode",
    "SchemaError",
    "StorageError",
    "Table",
    "TableExistsError",
    "TableNotFoundError",
    "TimeTravelCleanedError",
    "Timeline",
    "Txn",
    "TxnAlreadyCommittedError",
    "WriteConflictError",
    "WriteOptions",
    "create",
    "delete",
    "incremental",
    "insert",
    "insert_overwrite",
    "load",
    "pull",
    "snapshot",
    "timeline",
    "upsert",
    "write",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:  # a submodule, or a mistake: never a reason to import the API
        raise AttributeError(f"module 'cowrite' has no attribute {name!r}")
    import cowrite.api

    return getattr(cowrite.api, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
