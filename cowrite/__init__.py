"""cowrite: several independent writers, one Apache Hudi table (copy-on-write, table version 8)."""

__version__ = "0.1.0"
