"""Upserts and deletes from a streaming query, exactly once: functions for ``writeStream.foreachBatch``.

::

    query = (events.writeStream
             .foreachBatch(cowrite.spark.upsert_each_batch("s3://bucket/orders"))
             .option("checkpointLocation", checkpoint)
             .start())

Each micro-batch is written by :class:`~.engine.SparkWriter` as one instant carrying the txn
(application id, batch id) (:mod:`cowrite.protocol.txn`). The application id is by default the query's
id, which Spark keeps across restarts from one checkpoint; so a micro-batch replayed after its commit
landed but before Spark recorded it commits nothing the second time. Give ``app_id`` to keep one id across
checkpoints — then a new checkpoint, whose batch ids start again at 0, writes nothing until its batch ids
pass the last committed one, so change the id with the checkpoint.

A micro-batch that loses a write conflict is written again as a new instant, up to
``hoodie.write.num.retries.on.conflict.failures`` times; when it cannot commit, the function raises and
the query stops with that error. The table must exist (the data source or ``cowrite create`` makes it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame

from cowrite.errors import ConfigError, TxnAlreadyCommittedError
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.protocol.transaction import WriteOptions
from cowrite.protocol.txn import Txn
from cowrite.spark.engine import SparkWriter
from cowrite.spark.operations import SparkOperation
from cowrite.spark.sink import QUERY_ID_PROPERTY

__all__ = ["EachBatch", "delete_each_batch", "upsert_each_batch", "write_each_batch"]

log = logging.getLogger(__name__)


@dataclass
class EachBatch:
    """A ``foreachBatch`` function writing every micro-batch into ``table`` with ``operation``.

    ``last`` is the instant of the last micro-batch: the one it committed, or for a batch committed
    before, the one that did (None if that is no longer on the timeline nor in the archive); ``refused``
    says why the last micro-batch wrote nothing, if it had been committed before.
    """

    table: Table
    operation: SparkOperation
    app_id: str | None = None
    settings: Mapping[str, str] = field(default_factory=dict)
    last: Instant | None = None
    refused: TxnAlreadyCommittedError | None = None

    def __call__(self, df: DataFrame, batch_id: int, source: str | None = None) -> None:
        """Write micro-batch ``batch_id`` (``source`` names its input in errors; default: the batch);
        raises the writer's errors (nothing committed then)."""
        txn = Txn(self.app_id or _query_id(df), batch_id)
        options = WriteOptions(config=self.table.config.with_values(self.settings), txn=txn)
        writer = SparkWriter(self.table, df.sparkSession, options, source=source or f"micro-batch {batch_id}")
        self.last = writer.write(df, self.operation)
        self.refused = writer.refused
        if writer.refused is not None:
            log.info("micro-batch %d was committed before: %s", batch_id, writer.refused)


def write_each_batch(
    table: Table | str,
    operation: SparkOperation | str,
    *,
    app_id: str | None = None,
    settings: Mapping[str, str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> EachBatch:
    """A ``foreachBatch`` function writing each micro-batch as one ``operation`` (any of
    :class:`SparkWriter`'s) into ``table`` (a :class:`Table` or its URI, opened with
    ``storage_options``), exactly once per (``app_id``, batch id); ``settings`` override the table's
    write settings. Raises :class:`ConfigError` for an empty ``app_id`` and what opening the table raises.
    """
    if app_id is not None and not app_id.strip():
        raise ConfigError("app_id must be a non-empty string (or None for the query's id)")
    opened = table if isinstance(table, Table) else Table.load(table, **dict(storage_options or {}))
    return EachBatch(opened, SparkOperation(operation), app_id, dict(settings or {}))


def upsert_each_batch(table: Table | str, **kwargs: Any) -> EachBatch:
    """:func:`write_each_batch` with upserts."""
    return write_each_batch(table, SparkOperation.UPSERT, **kwargs)


def delete_each_batch(table: Table | str, **kwargs: Any) -> EachBatch:
    """:func:`write_each_batch` with deletes: each micro-batch's rows name the records to delete."""
    return write_each_batch(table, SparkOperation.DELETE, **kwargs)


def _query_id(df: DataFrame) -> str:
    """The id of the streaming query running this ``foreachBatch`` call (Spark keeps it in the checkpoint)."""
    query = df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    if not query:
        raise ConfigError("not called by a streaming query's foreachBatch: pass app_id")
    return str(query)
