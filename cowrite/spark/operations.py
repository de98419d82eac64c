"""The Spark engine's operations (the local engine's, plus ``bulk_insert``) and what a write reports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from cowrite.engine.operations import Operation
from cowrite.format.instant import Action


class SparkOperation(enum.StrEnum):
    INSERT = "insert"
    BULK_INSERT = "bulk_insert"
    UPSERT = "upsert"
    DELETE = "delete"
    INSERT_OVERWRITE = "insert_overwrite"

    @property
    def action(self) -> Action:
        return self.local.action

    @property
    def local(self) -> Operation:
        """The local engine's operation with the same input rules (bulk_insert validates as insert)."""
        return Operation.INSERT if self is SparkOperation.BULK_INSERT else Operation(self.value)

    @property
    def appends(self) -> bool:
        return self in (SparkOperation.INSERT, SparkOperation.BULK_INSERT)


@dataclass
class WriteMetrics:
    """What the last write did, for tests and logs."""

    input_rows: int = 0  # after deduplication, where the operation deduplicates
    index_files: int = 0  # latest base files of the touched partitions
    index_files_read: int = 0  # files whose keys a tagging task read (a file may be read by several)
    index_files_pruned: int = 0  # files a tagging task skipped by their footer key range
    file_groups: int = 0  # base files written
    routed_file_groups: int = 0  # of those, written after a shuffle
    tagged_in_place: bool = False  # tagged without a range shuffle (see SparkWriter._tag)
    routed_on_driver: bool = False  # merge rows routed on the driver, as few as Spark would broadcast
    deduplicated_on_driver: bool = False  # and deduplicated rows handed to tagging by the driver
    persisted: list[str] = field(default_factory=list)  # what the write persisted (and released)
