"""The PySpark engine: Spark DataFrames in and out of cowrite tables, and the ``cowrite`` data source.

- :class:`SparkWriter` writes a DataFrame as one instant (insert, bulk_insert, upsert, delete,
  insert_overwrite): executors write the base files, the driver plans and commits (:mod:`.engine`).
- :func:`snapshot` / :func:`incremental` read a table as a DataFrame, pruning partitions by filters
  (:mod:`.reader`).
- :func:`register` makes ``format("cowrite")`` available, with Hudi's option names (:mod:`.datasource`).

Spark is imported only inside this package; nothing in :mod:`cowrite.timeline` depends on it.
"""

from cowrite.spark.datasource import CowriteDataSource, register
from cowrite.spark.engine import SparkOperation, SparkWriter, WriteMetrics
from cowrite.spark.errors import NondeterministicInputError, SparkJobError
from cowrite.spark.reader import Scan, incremental, plan_incremental, plan_snapshot, snapshot

__all__ = [
    "CowriteDataSource",
    "NondeterministicInputError",
    "Scan",
    "SparkJobError",
    "SparkOperation",
    "SparkWriter",
    "WriteMetrics",
    "incremental",
    "plan_incremental",
    "plan_snapshot",
    "register",
    "snapshot",
]
