"""Clustering executed on Spark: each new file group is one task (see :mod:`cowrite.writer.clustering`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import SparkSession

from ...timeline.commit_metadata import WriteStat
from ..clustering import ClusterJob, MapJobs


def map_on_spark(spark: SparkSession) -> MapJobs:
    """Run clustering jobs as Spark tasks, one per new file group; executors write, the driver commits."""

    def run(function: Callable[[ClusterJob], WriteStat], jobs: Sequence[ClusterJob]) -> list[WriteStat]:
        if not jobs:
            return []
        return spark.sparkContext.parallelize(list(jobs), len(jobs)).map(function).collect()

    return run
