"""The class-data archive Spark's JVM starts from, made once by ``make setup``.

A Spark driver loads thousands of classes before it runs a job; from an archive of them (the JDK's
class-data sharing, ``-XX:SharedArchiveFile``) it starts sooner, and the tests and the demo start dozens of
drivers (figures in ``bench/README.md``). ``python tests/support/spark_classes.py ARCHIVE`` runs, in one local
driver, what they do with Spark — a write through :class:`~cowrite.spark.SparkWriter`, a read and a
streaming query through the data source — and its JVM writes the classes it loaded to ``ARCHIVE`` as it
exits. The Makefile hands it to every driver through ``SPARK_SUBMIT_OPTS``; an archive a JVM cannot use
(another JDK, another classpath) is passed over in silence, and the driver starts as without it. Exits 1
when no archive was written.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"  # no notes of the JVM on the archive, as in the Makefile


def main(archive: Path) -> int:
    archive.unlink(missing_ok=True)  # the JVM writes it read-only
    os.environ["SPARK_SUBMIT_OPTS"] = f"-XX:ArchiveClassesAtExit={archive} {QUIET}"
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from pyspark import SparkContext

    from cowrite.spark import SparkWriter, register
    from support.spark import local_session
    from support.tables import new_table, rows

    spark = local_session(1, "512m", "cowrite-class-archive")
    register(spark)
    with tempfile.TemporaryDirectory() as work:
        table = new_table(Path(work) / "t")
        SparkWriter(table, spark).upsert(spark.createDataFrame(rows(["a", "b"]).to_pandas()))
        spark.read.format("cowrite").load(table.uri).collect()
        query = (
            spark.readStream.format("cowrite")
            .load(table.uri)
            .writeStream.foreachBatch(lambda frame, _: frame.count())
            .option("checkpointLocation", str(Path(work) / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    gateway = SparkContext._gateway
    spark.stop()
    gateway.proc.stdin.close()  # the JVM exits at the end of its input, writing the archive first
    gateway.proc.wait()
    if not archive.exists():
        print(f"Spark's JVM wrote no class-data archive at {archive}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]).absolute()))
