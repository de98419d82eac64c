"""Plans and results of the table services that change files: rollback and clean.

Stored like commit metadata, as one-record Avro object container files in Hudi's record names, so Hudi
tools that list a timeline can decode them. A plan is written into ``<t>.<action>.requested`` before
anything is deleted: a crashed service finds its plan there and finishes the same work (idempotent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fastavro

from cowrite.errors import CorruptTimelineError
from cowrite.format.avro import read_container, write_container

_NAMESPACE = "org.apache.hudi.avro.model"
_STRINGS = {"type": "array", "items": "string"}


def _record(name: str, fields: Sequence[tuple[str, Any]]) -> Any:
    return fastavro.parse_schema(
        {
            "namespace": _NAMESPACE,
            "type": "record",
            "name": name,
            "fields": [{"name": n, "type": t} for n, t in fields],
        }
    )


_ROLLBACK_PLAN = _record(
    "HoodieRollbackPlan",
    [
        (
            "instantToRollback",
            {
                "type": "record",
                "name": "HoodieInstantInfo",
                "fields": [{"name": "commitTime", "type": "string"}, {"name": "action", "type": "string"}],
            },
        ),
        ("filesToDelete", _STRINGS),
        ("version", "int"),
    ],
)
_ROLLBACK_METADATA = _record(
    "HoodieRollbackMetadata",
    [
        ("startRollbackTime", "string"),
        ("timeTakenInMillis", "long"),
        ("totalFilesDeleted", "int"),
        ("commitsRollback", _STRINGS),
        ("deletedFiles", _STRINGS),
        ("version", "int"),
    ],
)
_CLEAN_PLAN = _record(
    "HoodieCleanerPlan",
    [
        ("earliestInstantToRetain", "string"),
        ("policy", "string"),
        ("filesToDelete", _STRINGS),
        ("version", "int"),
    ],
)
_CLEAN_METADATA = _record(
    "HoodieCleanMetadata",
    [
        ("startCleanTime", "string"),
        ("timeTakenInMillis", "long"),
        ("totalFilesDeleted", "int"),
        ("earliestCommitToRetain", "string"),
        ("deletedFiles", _STRINGS),
        ("version", "int"),
    ],
)


def _encode(schema: Any, record: dict[str, Any]) -> bytes:
    return write_container(schema, [record])


def _decode(data: bytes, path: str) -> dict[str, Any]:
    try:
        records = read_container(data)
    except Exception as exc:  # fastavro raises many kinds on garbage
        raise CorruptTimelineError(path, f"not a readable Avro record ({exc})") from None
    if len(records) != 1 or not isinstance(records[0], dict):
        raise CorruptTimelineError(path, f"expected one record, found {len(records)}")
    return records[0]


def _field(record: dict[str, Any], name: str, kind: type, path: str) -> Any:
    value = record.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CorruptTimelineError(path, f"field {name} is missing or not a {kind.__name__}")
    return value


def _strings(record: dict[str, Any], name: str, path: str) -> tuple[str, ...]:
    """A list of strings (file paths, instant times): a file written with another schema may hold others."""
    values = _field(record, name, list, path)
    if not all(isinstance(v, str) for v in values):
        raise CorruptTimelineError(path, f"field {name} holds something other than strings")
    return tuple(values)


@dataclass(frozen=True)
class RollbackPlan:
    target: str  # requested time of the failed instant
    target_action: str
    files: tuple[str, ...]  # relative paths of its data files

    def to_bytes(self) -> bytes:
        return _encode(
            _ROLLBACK_PLAN,
            {
                "instantToRollback": {"commitTime": self.target, "action": self.target_action},
                "filesToDelete": list(self.files),
                "version": 1,
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> RollbackPlan:
        record = _decode(data, path)
        target = _field(record, "instantToRollback", dict, path)
        return cls(
            _field(target, "commitTime", str, path),
            _field(target, "action", str, path),
            _strings(record, "filesToDelete", path),
        )


@dataclass(frozen=True)
class RollbackResult:
    started: str
    took_ms: int
    target: str
    deleted: tuple[str, ...]

    def to_bytes(self) -> bytes:
        return _encode(
            _ROLLBACK_METADATA,
            {
                "startRollbackTime": self.started,
                "timeTakenInMillis": self.took_ms,
                "totalFilesDeleted": len(self.deleted),
                "commitsRollback": [self.target],
                "deletedFiles": list(self.deleted),
                "version": 1,
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> RollbackResult:
        record = _decode(data, path)
        targets = _strings(record, "commitsRollback", path)
        return cls(
            _field(record, "startRollbackTime", str, path),
            _field(record, "timeTakenInMillis", int, path),
            targets[0] if targets else "",
            _strings(record, "deletedFiles", path),
        )


@dataclass(frozen=True)
class CleanPlan:
    earliest_retained: str
    files: tuple[str, ...]
    policy: str = "KEEP_LATEST_COMMITS"

    def to_bytes(self) -> bytes:
        return _encode(
            _CLEAN_PLAN,
            {
                "earliestInstantToRetain": self.earliest_retained,
                "policy": self.policy,
                "filesToDelete": list(self.files),
                "version": 1,
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes, path: str) -> CleanPlan:
        record = _decode(data, path)
        return cls(
            _field(record, "earliestInstantToRetain", str, path),
            _strings(record, "filesToDelete", path),
            _field(record, "policy", str, path),
        )


@dataclass(frozen=True)
class CleanResult:
    started: str
    took_ms: int
    earliest_retained: str
    deleted: tuple[str, ...]

    def to_bytes(self) -> bytes:
        return _encode(
            _CLEAN_METADATA,
            {
                "startCleanTime": self.started,
                "timeTakenInMillis": self.took_ms,
                "totalFilesDeleted": len(self.deleted),
                "earliestCommitToRetain": self.earliest_retained,
                "deletedFiles": list(self.deleted),
                "version": 1,
            },
        )
