"""Table services that delete files: lazy rollback of failed writes and cleaning of old file versions."""

from cowrite.cleaner.archive import Archived, archive
from cowrite.cleaner.clean import Cleaned, clean, plan_clean
from cowrite.cleaner.rollback import RolledBack, rollback_failed
from cowrite.format.table import Table
from cowrite.protocol.heartbeat import HeartbeatPolicy
from cowrite.protocol.locks import LockHolder, TableLock, lock_for


def service_lock(table: Table, owner: str = "") -> TableLock:
    """The table lock as the table's configuration names it, for a service that holds no instant."""
    holder = LockHolder(owner=owner) if owner else LockHolder()
    return lock_for(
        table.storage, table.config, holder, HeartbeatPolicy.from_config(table.config), table.name
    )


__all__ = [
    "Archived",
    "Cleaned",
    "archive",
    "RolledBack",
    "clean",
    "plan_clean",
    "rollback_failed",
    "service_lock",
]
