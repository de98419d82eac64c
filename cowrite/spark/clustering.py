"""Clustering executed on Spark: each new file group is one task (see :mod:`cowrite.engine.clustering`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import SparkSession

from cowrite.engine.clustering import ClusterJob, MapJobs
from cowrite.format.commit_metadata import WriteStat


def map_on_spark(spark: SparkSession) -> MapJobs:
    """Run clustering jobs as Spark tasks, one per new file group; executors write, the driver commits."""

    def run(function: Callable[[ClusterJob], WriteStat], jobs: Sequence[ClusterJob]) -> list[WriteStat]:
        if not jobs:
            return []
        return spark.sparkContext.parallelize(list(jobs), len(jobs)).map(function).collect()

    return run
