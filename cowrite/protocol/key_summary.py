"""What a commit tells its rivals about the record keys it inserted, without them reading its files.

Two writers that insert one new key into a partition, each into a file group of its own, touch no common
file group, yet leave two records with one key. So a commit that inserts keys (an upsert's new keys, an
``insert_overwrite``'s records) records them in ``extraMetadata`` under :data:`INSERTED_KEYS`, per
partition: the keys themselves when there are few, else their range and a Bloom filter, as Hudi keeps
in its base files' footers. A later committer compares its own summary with each rival's under the lock:
exact keys answer exactly; a Bloom filter only says "maybe", which the caller confirms by reading the
files (:func:`cowrite.protocol.conflict.record_key_overlap`), a rare case that needs two large concurrent
inserts into one partition.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

INSERTED_KEYS = "cowrite.insertedKeys"  # extraMetadata key; its value is :meth:`KeySummary.to_json`
EXACT_LIMIT = 4096  # keys of one commit stored as they are; above, per partition a range and a filter
BITS_PER_KEY = 10  # about 1 % false positives with 7 hashes
HASHES = 7


@dataclass(frozen=True)
class Bloom:
    """A Bloom filter of strings over ``bits`` bits (double hashing of a BLAKE2b digest)."""

    bits: int
    data: bytes

    @classmethod
    def of(cls, keys: Iterable[str], count: int) -> Bloom:
        bits = max(64, 8 * math.ceil(count * BITS_PER_KEY / 8))
        array = bytearray(bits // 8)
        for key in keys:
            for position in _positions(key, bits):
                array[position >> 3] |= 1 << (position & 7)
        return cls(bits, bytes(array))

    def __contains__(self, key: str) -> bool:
        return all(self.data[p >> 3] & (1 << (p & 7)) for p in _positions(key, self.bits))


def _positions(key: str, bits: int) -> list[int]:
    digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
    first, second = int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little") | 1
    return [(first + i * second) % bits for i in range(HASHES)]


@dataclass(frozen=True)
class PartitionKeys:
    """The keys inserted into one partition: exactly (``keys``), or as a range and a Bloom filter."""

    low: str
    high: str
    keys: frozenset[str] | None = None
    bloom: Bloom | None = None

    def may_hold(self, key: str) -> bool:
        if self.keys is not None:
            return key in self.keys
        return self.low <= key <= self.high and self.bloom is not None and key in self.bloom


@dataclass(frozen=True)
class KeySummary:
    """The record keys one commit inserted, by partition path."""

    partitions: Mapping[str, PartitionKeys]

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]]) -> KeySummary:
        """From (partition path, record key) pairs."""
        grouped: dict[str, set[str]] = {}
        for partition, key in pairs:
            grouped.setdefault(partition, set()).add(key)
        exact = sum(len(keys) for keys in grouped.values()) <= EXACT_LIMIT
        return cls(
            {
                partition: PartitionKeys(
                    min(keys),
                    max(keys),
                    frozenset(keys) if exact else None,
                    None if exact else Bloom.of(keys, len(keys)),
                )
                for partition, keys in grouped.items()
            }
        )

    def shared(self, other: KeySummary) -> tuple[set[tuple[str, str]], bool]:
        """Keys both summaries surely hold, as (partition, key); and whether more may be shared (a Bloom
        filter said "maybe", or two filters' ranges overlap), which only the files can tell."""
        sure: set[tuple[str, str]] = set()
        maybe = False
        for partition, mine in self.partitions.items():
            theirs = other.partitions.get(partition)
            if theirs is None or mine.high < theirs.low or theirs.high < mine.low:
                continue
            if mine.keys is not None and theirs.keys is not None:
                sure.update((partition, key) for key in mine.keys & theirs.keys)
            elif mine.keys is not None or theirs.keys is not None:
                exact, filtered = (mine, theirs) if mine.keys is not None else (theirs, mine)
                assert exact.keys is not None
                maybe = maybe or any(filtered.may_hold(key) for key in exact.keys)
            else:
                maybe = True
        return sure, maybe

    def to_json(self) -> str:
        return json.dumps(
            {
                partition: {"low": p.low, "high": p.high, "keys": sorted(p.keys)}
                if p.keys is not None
                else {
                    "low": p.low,
                    "high": p.high,
                    "bits": p.bloom.bits if p.bloom else 0,
                    "bloom": base64.b64encode(p.bloom.data if p.bloom else b"").decode(),
                }
                for partition, p in sorted(self.partitions.items())
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> KeySummary | None:
        """The summary, or None when ``text`` is not one (a foreign or damaged entry: files decide)."""
        try:
            parsed = {str(partition): _entry(entry) for partition, entry in json.loads(text).items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        return None if any(p is None for p in parsed.values()) else cls(parsed)  # type: ignore[arg-type]


def _entry(entry: dict[str, object]) -> PartitionKeys | None:
    low, high = str(entry["low"]), str(entry["high"])
    if "keys" in entry:
        return PartitionKeys(low, high, frozenset(str(k) for k in entry["keys"]))  # type: ignore[attr-defined]
    bits, data = int(entry["bits"]), base64.b64decode(str(entry["bloom"]), validate=True)  # type: ignore[call-overload]
    return PartitionKeys(low, high, bloom=Bloom(bits, data)) if 0 < bits <= 8 * len(data) else None
