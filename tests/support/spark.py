"""SparkSessions for the tests and their Spark harness processes: local, or an application on a cluster."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def local_session(cores: int, memory: str, name: str = "cowrite-tests") -> Any:
    """A ``local[cores]`` session whose executors run this virtualenv's Python and bind loopback only."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.default.parallelism", str(cores))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", memory)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def cluster_session(master: str, name: str = "cowrite-tests") -> Any:
    """An application on the standalone cluster at ``master`` with one core of its own, so that two
    applications run side by side on a two-core worker. The executors run this virtualenv's Python; their
    environment is the worker's, not this process's."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master(master)
        .appName(name)
        .config("spark.cores.max", "1")
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", "512m")
        .config("spark.driver.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        # the executors start as the driver does (make test's JVM flags: they live as briefly)
        .config("spark.executor.extraJavaOptions", os.environ.get("SPARK_SUBMIT_OPTS", ""))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session


def forget_commit(checkpoint: Path, batch: int) -> None:
    """What a crash between a batch's commit and Spark's record of it leaves: no ``commits/<batch>`` (nor
    the checksum Spark writes beside it), so the restarted query runs the batch again."""
    for name in (str(batch), f".{batch}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
