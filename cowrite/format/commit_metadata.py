"""Commit metadata: what a completed ``commit`` / ``replacecommit`` wrote, as an Avro object container file.

Timeline layout 2 stores one ``HoodieCommitMetadata`` (or ``HoodieReplaceCommitMetadata``) record per
completed instant. Readers resolve fields by name, so the schema below carries the fields readers use,
each optional with a null default, in Hudi's own names. Incremental readers take the file groups of a
commit from ``partitionToWriteStats`` alone: a commit with wrong or missing write stats silently reads as
empty, so every base file written must appear here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fastavro

from cowrite.errors import CorruptTimelineError
from cowrite.format.avro import read_container, write_container
from cowrite.format.instant import Action

_OPTIONAL_STRING = ["null", "string"]
_OPTIONAL_LONG = ["null", "long"]

_WRITE_STAT = {
    "type": "record",
    "name": "HoodieWriteStat",
    "fields": [
        {"name": name, "type": kind, "default": None}
        for name, kind in [
            ("fileId", _OPTIONAL_STRING),
            ("path", _OPTIONAL_STRING),
            ("prevCommit", _OPTIONAL_STRING),
            ("numWrites", _OPTIONAL_LONG),
            ("numDeletes", _OPTIONAL_LONG),
            ("numUpdateWrites", _OPTIONAL_LONG),
            ("numInserts", _OPTIONAL_LONG),
            ("totalWriteBytes", _OPTIONAL_LONG),
            ("totalWriteErrors", _OPTIONAL_LONG),
            ("partitionPath", _OPTIONAL_STRING),
            ("fileSizeInBytes", _OPTIONAL_LONG),
        ]
    ],
}


def _schema(name: str, with_replace: bool) -> dict[str, Any]:
    fields: list[dict[str, Any]] = [
        {
            "name": "partitionToWriteStats",
            "type": ["null", {"type": "map", "values": {"type": "array", "items": _WRITE_STAT}}],
            "default": None,
        },
        {"name": "extraMetadata", "type": ["null", {"type": "map", "values": "string"}], "default": None},
        {"name": "version", "type": ["int", "null"], "default": 1},
        {"name": "operationType", "type": _OPTIONAL_STRING, "default": None},
    ]
    if with_replace:
        fields.append(
            {
                "name": "partitionToReplaceFileIds",
                "type": ["null", {"type": "map", "values": {"type": "array", "items": "string"}}],
                "default": None,
            }
        )
    return {"namespace": "org.apache.hudi.avro.model", "type": "record", "name": name, "fields": fields}


_SCHEMAS = {
    Action.COMMIT: fastavro.parse_schema(_schema("HoodieCommitMetadata", with_replace=False)),
    Action.REPLACE_COMMIT: fastavro.parse_schema(_schema("HoodieReplaceCommitMetadata", with_replace=True)),
}


@dataclass(frozen=True)
class WriteStat:
    """One base file written by an instant."""

    file_id: str
    path: str  # relative to the table's base path
    partition_path: str
    prev_commit: str  # requested time of the slice this one replaces, or "null" for a new file group
    num_writes: int
    num_inserts: int
    num_update_writes: int
    num_deletes: int
    file_size: int

    def to_avro(self) -> dict[str, Any]:
        return {
            "fileId": self.file_id,
            "path": self.path,
            "prevCommit": self.prev_commit,
            "numWrites": self.num_writes,
            "numDeletes": self.num_deletes,
            "numUpdateWrites": self.num_update_writes,
            "numInserts": self.num_inserts,
            "totalWriteBytes": self.file_size,
            "totalWriteErrors": 0,
            "partitionPath": self.partition_path,
            "fileSizeInBytes": self.file_size,
        }

    @classmethod
    def from_avro(cls, partition: str, record: Mapping[str, Any]) -> WriteStat:
        """A write stat from its Avro record; TypeError/KeyError if a field has the wrong type."""
        if not isinstance(record, Mapping):
            raise TypeError(f"a write stat is a record, not {type(record).__name__}")
        return cls(
            file_id=_typed(record["fileId"], str, "fileId"),
            path=_typed(record["path"], str, "path"),
            partition_path=_typed(record.get("partitionPath") or partition, str, "partitionPath"),
            prev_commit=_typed(record.get("prevCommit") or "null", str, "prevCommit"),
            num_writes=_count(record, "numWrites"),
            num_inserts=_count(record, "numInserts"),
            num_update_writes=_count(record, "numUpdateWrites"),
            num_deletes=_count(record, "numDeletes"),
            file_size=_count(record, "fileSizeInBytes"),
        )


T = TypeVar("T")


def _typed(value: Any, kind: type[T], name: str) -> T:
    # Readers resolve fields by name only: a file written with another schema can hold anything.
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise TypeError(f"field {name} is {type(value).__name__}, not {kind.__name__}")
    return value


def _count(record: Mapping[str, Any], name: str) -> int:
    return _typed(record.get(name) or 0, int, name)


def _strings(value: Any, name: str) -> tuple[str, ...]:
    return tuple(_typed(item, str, name) for item in _typed(value, list, name))


def _string_map(value: Any, name: str) -> dict[str, Any]:
    return _typed(value or {}, dict, name)


@dataclass(frozen=True)
class CommitMetadata:
    """The content of a completed commit or replacecommit."""

    operation: str
    write_stats: tuple[WriteStat, ...] = ()
    replaced_file_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # partition -> file ids
    schema: str = ""  # Avro schema (JSON) of the data columns
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def touched_file_groups(self) -> frozenset[tuple[str, str]]:
        """(partition, file id) of every file group this commit wrote or replaced."""
        written = {(s.partition_path, s.file_id) for s in self.write_stats}
        replaced = {(p, f) for p, ids in self.replaced_file_ids.items() for f in ids}
        return frozenset(written | replaced)

    def stats_by_partition(self) -> dict[str, list[WriteStat]]:
        grouped: dict[str, list[WriteStat]] = {}
        for stat in self.write_stats:
            grouped.setdefault(stat.partition_path, []).append(stat)
        return grouped

    def to_bytes(self, action: Action) -> bytes:
        record: dict[str, Any] = {
            "partitionToWriteStats": {
                p: [s.to_avro() for s in stats] for p, stats in self.stats_by_partition().items()
            },
            "extraMetadata": {**self.extra, "schema": self.schema} if self.schema else dict(self.extra),
            "version": 1,
            "operationType": self.operation,
        }
        if action is Action.REPLACE_COMMIT:
            record["partitionToReplaceFileIds"] = {p: list(ids) for p, ids in self.replaced_file_ids.items()}
        return write_container(_SCHEMAS[action], [record])

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> CommitMetadata:
        """Parse a commit file; raises :class:`CorruptTimelineError` naming ``path``.

        Any Avro file with one record parses as far as the format goes; the fields are checked here, so a
        file written with another schema is refused rather than read as nonsense.
        """
        try:
            records = read_container(data)
            if len(records) != 1:
                raise CorruptTimelineError(path, f"expected one commit record, found {len(records)}")
            record = _typed(records[0], dict, "the commit record")
            stats = tuple(
                WriteStat.from_avro(partition, stat)
                for partition, partition_stats in _string_map(
                    record.get("partitionToWriteStats"), "partitionToWriteStats"
                ).items()
                for stat in _typed(partition_stats, list, "partitionToWriteStats")
            )
            extra = {
                k: _typed(v, str, "extraMetadata")
                for k, v in _string_map(record.get("extraMetadata"), "extraMetadata").items()
            }
            replaced = {
                p: _strings(ids, "partitionToReplaceFileIds")
                for p, ids in _string_map(
                    record.get("partitionToReplaceFileIds"), "partitionToReplaceFileIds"
                ).items()
            }
            operation = _typed(record.get("operationType") or "", str, "operationType")
        except CorruptTimelineError:
            raise
        except Exception as exc:  # fastavro raises many kinds on garbage; all mean the same here
            raise CorruptTimelineError(path, f"not a readable Avro commit record ({exc})") from None
        return cls(
            operation=operation,
            write_stats=stats,
            replaced_file_ids=replaced,
            schema=extra.pop("schema", ""),
            extra=extra,
        )
