"""The local engine: one process reads and writes with pyarrow, no Spark."""
