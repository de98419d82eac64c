"""What the data source's writes (batch and streaming) hand from one Spark process to the next.

A data source write runs its driver side in processes Spark starts and stops: the options are parsed
into :class:`Settings` in each, the instant one of them begins is described by a :class:`Ticket` (pickled
to the tasks and to the process that commits), and :func:`adopt` takes the instant over where it commits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cowrite.spark.options as spark_keys
from cowrite.errors import ConfigError, LeaseLostError, TableExistsError, TableNotFoundError
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.config import Config
from cowrite.format.instant import State
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol.heartbeat import HeartbeatPolicy, abort_reason, heartbeat_age
from cowrite.protocol.transaction import Transaction, WriteOptions
from cowrite.protocol.txn import Txn

WRITE_OPERATIONS = ("insert", "bulk_insert")


@dataclass(frozen=True)
class Settings:
    """A data source's options: the table's location, its storage options and the rest as settings."""

    uri: str
    storage_options: Mapping[str, Any]
    values: Mapping[str, str]

    @classmethod
    def of(cls, options: Mapping[str, str]) -> Settings:
        values = {str(k).lower(): str(v) for k, v in dict(options).items()}
        uri = values.pop("path", "")
        if not uri:
            raise ConfigError("the cowrite data source needs a table path: .load(path) or .save(path)")
        raw = values.get(spark_keys.STORAGE_OPTIONS_JSON.key, "")
        try:
            storage_options = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ConfigError(f"{spark_keys.STORAGE_OPTIONS_JSON.key} is not JSON: {exc}") from None
        return cls(uri, storage_options, values)

    @property
    def config(self) -> Config:
        return Config(self.values)

    def table(self) -> Table:
        return Table.load(self.uri, **dict(self.storage_options))


@dataclass(frozen=True)
class Ticket:
    """A begun instant, handed from the process that began it to the tasks and to the one that commits."""

    uri: str
    storage_options: Mapping[str, Any]
    config: Mapping[str, str]
    instant: str
    operation: str
    seen: frozenset[str]  # requested times of the instants completed when it began
    owner: str
    txn: Txn | None = None

    def table(self) -> Table:
        return Table.load(self.uri, **dict(self.storage_options))

    @property
    def policy(self) -> HeartbeatPolicy:
        return HeartbeatPolicy.from_config(Config(self.config))


def open_or_create(settings: Settings) -> Table:
    config = settings.config
    given_keys = config.get(spark_keys.WRITE_RECORDKEY_FIELD)
    given_partitions = config.get(spark_keys.WRITE_PARTITIONPATH_FIELD)
    given_ordering = config.get(spark_keys.WRITE_PRECOMBINE_FIELD)
    try:
        table = settings.table()
    except TableNotFoundError:
        if not given_keys:
            raise ConfigError(
                f"no table at {settings.uri} yet: set {spark_keys.WRITE_RECORDKEY_FIELD.key} (and "
                f"{spark_keys.WRITE_PARTITIONPATH_FIELD.key}, {spark_keys.WRITE_PRECOMBINE_FIELD.key}) "
                "to create it"
            ) from None
        name = config.get(keys.TABLE_NAME) or config.get(spark_keys.WRITE_TABLE_NAME)
        try:
            return Table.create(
                settings.uri,
                name=name or settings.uri.rstrip("/").rsplit("/", 1)[-1],
                record_key_fields=given_keys,
                partition_fields=given_partitions,
                ordering_fields=(given_ordering,) if given_ordering else (),
                hive_style_partitioning=config.get(keys.HIVE_STYLE_PARTITIONING),
                storage_options=settings.storage_options,
            )
        except TableExistsError:  # another writer created it meanwhile
            table = settings.table()
    mismatched = [
        f"{key.key}={','.join(given) if isinstance(given, tuple) else given} (the table has {have})"
        for key, given, have in (
            (spark_keys.WRITE_RECORDKEY_FIELD, given_keys, ",".join(table.record_key_fields)),
            (spark_keys.WRITE_PARTITIONPATH_FIELD, given_partitions, ",".join(table.partition_fields)),
            (spark_keys.WRITE_PRECOMBINE_FIELD, given_ordering, ",".join(table.ordering_fields)),
        )
        if given and (",".join(given) if isinstance(given, tuple) else given) != have
    ]
    if mismatched:
        raise ConfigError(f"options do not match the table at {settings.uri}: {'; '.join(mismatched)}")
    return table


def txn_of(settings: Settings) -> Txn | None:
    config = settings.config
    app_id, version = config.get(spark_keys.TXN_APP_ID), config.get(spark_keys.TXN_VERSION)
    return Txn.parse(app_id or None, version or None, ("txnAppId", "txnVersion"))


def adopt(table: Table, ticket: Ticket, metadata: CommitMetadata) -> Transaction:
    """Take over the begun instant in this process, if its lease is still live; publishes the plan."""
    policy = ticket.policy
    age = heartbeat_age(table.storage, ticket.instant)
    reason = abort_reason(table.storage, ticket.instant)
    if age is None or age > policy.tolerance or reason is not None:
        state = "gone" if age is None else f"{age:.0f} s old" + (f", aborted ({reason})" if reason else "")
        raise LeaseLostError(
            f"the heartbeat of instant {ticket.instant} of table {table.name} is {state}; "
            "the write lost its lease and is not committed"
        )
    timeline = table.timeline()
    mine = timeline.get(ticket.instant)
    if mine is None or mine.state is not State.REQUESTED:
        raise LeaseLostError(f"instant {ticket.instant} of table {table.name} is no longer requested: {mine}")
    seen = Timeline(i for i in timeline if i.requested_time in ticket.seen)
    options = WriteOptions(config=Config(ticket.config), txn=ticket.txn)
    return Transaction.adopt(table, mine, metadata, seen, options)
