"""The PySpark engine: Spark DataFrames in and out of cowrite tables, and the ``cowrite`` data source.

- :class:`SparkWriter` writes a DataFrame as one instant (insert, bulk_insert, upsert, delete,
  insert_overwrite): executors write the base files, the driver plans and commits (:mod:`.engine`).
- :func:`snapshot` / :func:`incremental` read a table as a DataFrame, pruning partitions by filters
  (:mod:`.reader`).
- :func:`register` makes ``format("cowrite")`` available, with Hudi's option names (:mod:`.datasource`),
  for reads, writes and streaming appends (``writeStream``, exactly once: :mod:`.sink`).
- :func:`upsert_each_batch` / :func:`delete_each_batch` / :func:`write_each_batch` make a streaming
  query's ``foreachBatch`` write each micro-batch exactly once with :class:`SparkWriter` (:mod:`.each_batch`).
- :mod:`.options` declares the engine's settings and the data source's options.

Spark is imported only inside this package; nothing in :mod:`cowrite.timeline` depends on it. The names
above are resolved on first use: importing the package, or :mod:`.options` alone, imports no Spark.
Importing any part of it registers the Spark settings (:mod:`.options`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cowrite.spark import options  # noqa: F401  (registers the Spark settings; imports no Spark)

if TYPE_CHECKING:  # what type checkers see; at run time the names resolve on first use
    from cowrite.spark.datasource import CowriteDataSource, register
    from cowrite.spark.each_batch import EachBatch, delete_each_batch, upsert_each_batch, write_each_batch
    from cowrite.spark.engine import SparkWriter
    from cowrite.spark.errors import NondeterministicInputError, SparkJobError
    from cowrite.spark.operations import SparkOperation, WriteMetrics
    from cowrite.spark.reader import Scan, incremental, plan_incremental, plan_snapshot, snapshot

__all__ = [
    "CowriteDataSource",
    "EachBatch",
    "NondeterministicInputError",
    "Scan",
    "SparkJobError",
    "SparkOperation",
    "SparkWriter",
    "WriteMetrics",
    "delete_each_batch",
    "incremental",
    "plan_incremental",
    "plan_snapshot",
    "register",
    "snapshot",
    "upsert_each_batch",
    "write_each_batch",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:  # a submodule not imported yet, or a mistake
        raise AttributeError(f"module 'cowrite.spark' has no attribute {name!r}")
    from cowrite.spark import datasource, each_batch, engine, errors, operations, reader  # imports Spark

    homes = (datasource, each_batch, engine, errors, operations, reader)
    value = next(vars(home)[name] for home in homes if name in vars(home))
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
