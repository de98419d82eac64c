"""What a data commit carries forward — the map of applications' versions and the table's schema — and
the digest a turn's note names it by (:mod:`.sketch`).

Every write takes both from the newest data commit: the schema its input is held to (:mod:`.table_schema`),
the map it carries on (:mod:`.txn`). On an object store, reading the newest commit is a request whenever
another process published it. Its note names the digest of what it carries, and a process remembers what
each digest it computed or read stands for, so a commit noted with a digest it knows need not be read.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

from cowrite.format.commit_metadata import CommitMetadata
from cowrite.process import keep_mapping

TXNS_KEY = "cowrite.txns"  # the carried map, in every data commit cowrite publishes

_KEPT = 64


@dataclass(frozen=True)
class Carried:
    """The map of versions (its JSON; None in a commit that carries none) and the table's schema."""

    txns: str | None
    schema: str


_KNOWN: dict[str, Carried] = keep_mapping(
    f"{__name__}._KNOWN",
    {},
    f"{_KEPT} digests",
    "what each digest this process computed stands for: a commit noted with one is not read",
)
_KNOWN_LOCK = threading.Lock()  # a write's requests run on several threads


def digest(txns: str, schema: str) -> str:
    """The digest of a map of versions and a schema (8 bytes of BLAKE2b, in hex); remembered with them."""
    value = hashlib.blake2b(f"{txns}\0{schema}".encode(), digest_size=8).hexdigest()
    with _KNOWN_LOCK:
        _KNOWN[value] = Carried(txns, schema)
        while len(_KNOWN) > _KEPT:
            del _KNOWN[next(iter(_KNOWN))]
    return value


def known(value: str | None) -> Carried | None:
    """What ``value``, a digest, stands for, if this process computed it."""
    return _KNOWN.get(value) if value is not None else None


def carried(metadata: CommitMetadata) -> Carried:
    """What ``metadata``'s commit carries; its digest is remembered."""
    txns = metadata.extra.get(TXNS_KEY)
    if txns is not None:
        digest(txns, metadata.schema)
    return Carried(txns, metadata.schema)
