"""How one writer takes part in concurrency control."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cowrite.format.config import Config
from cowrite.protocol.conflict import ConflictStrategy
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.locks import TableLock
from cowrite.protocol.txn import Txn


@dataclass
class WriteOptions:
    """How one writer takes part in concurrency control; defaults come from the config registry."""

    config: Config = field(default_factory=Config)
    clock: Callable[[], float] = time.time  # wall clock for instant times; injectable to test skew
    lock: TableLock | None = None  # a ready lock, else one is made from the config
    conflict_strategy: ConflictStrategy | None = None
    txn: Txn | None = None  # an application id and version: the write commits only if that is new

    @property
    def heartbeat_policy(self) -> HeartbeatPolicy:
        return HeartbeatPolicy.from_config(self.config)
