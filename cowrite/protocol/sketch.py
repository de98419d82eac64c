"""What a turn's note tells the writers after it about the commit it published, so most need not read it.

A writer that takes the lock after other turns published commits checks each for a conflict (the file
groups it touched, the record keys it inserted) and carries forward the newest map of applications'
versions (:mod:`.txn`). On an object store every commit it reads is a request, and a busy table publishes
several commits during one write. So the note a writer's turn leaves (:mod:`.turns`) names, after the
completed file, a sketch of the commit: Bloom filters of the file groups it touched and of the partitions it
inserted record keys into, and a digest of what it carries forward: the map of versions and the table's
schema (:mod:`.table_schema`). A rival whose sketch rules out all three checks — no file group of mine, no
partition I inserted into, the map and the schema I began with — is left unread;
one it cannot rule out (a filter's "maybe", too many file groups to sketch, keys inserted without a
summary, a note without a sketch) is read and checked as before.

A filter never says "no" for a member, so the sketch rules out only what the commit itself would.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Instant
from cowrite.format.table import Table
from cowrite.process import memo
from cowrite.protocol.carried import TXNS_KEY, Carried, carried, digest, known
from cowrite.protocol.conflict import INSERTING, ConflictStrategy, file_group_overlap, inserted_keys
from cowrite.protocol.key_summary import Bloom
from cowrite.protocol.locks.handover import ask_notes
from cowrite.protocol.locks.lock_files import noted
from cowrite.storage.backend import Storage

MARK = ".sketch-"  # between the completed file's name and its sketch in a note
# A filter of more members is not sketched (rivals read the commit): a note's name stays under 255 bytes.
MOST_MEMBERS = 24
_UNKNOWN = "x"

# Whether a rival's sketch rules out every check this writer makes against that rival's commit.
Clears = Callable[["Sketch"], bool]


@dataclass(frozen=True)
class Sketch:
    """A commit at a glance. ``None`` in a field: that question needs the commit read."""

    groups: Bloom | None  # "partition/file id" of every file group it wrote or replaced
    inserted: Bloom | None  # the partitions it inserted record keys into
    carried: str | None  # the digest of the map of applications' versions and the schema it carries

    @classmethod
    def of(cls, metadata: CommitMetadata) -> Sketch:
        groups = _bloom(_group_names(metadata.touched_file_groups))
        txns = metadata.extra.get(TXNS_KEY)
        carried = digest(txns, metadata.schema) if txns is not None else None
        return cls(groups, _bloom(_inserted_partitions(metadata)), carried)

    def to_text(self) -> str:
        return "-".join([_bloom_text(self.groups), _bloom_text(self.inserted), self.carried or _UNKNOWN])

    def note(self, completed_file: str) -> str:
        """What a turn notes for the completed file it published, of a commit this sketch draws."""
        return f"{completed_file}{MARK}{self.to_text()}"

    @classmethod
    def from_text(cls, text: str) -> Sketch | None:
        """The sketch ``text`` names; None for anything else (a damaged or foreign note: read the commit)."""
        fields = text.split("-")
        if len(fields) != 3:
            return None
        try:
            groups, inserted = _bloom_of(fields[0]), _bloom_of(fields[1])
        except ValueError:
            return None
        carried = fields[2] if fields[2] != _UNKNOWN else None
        return cls(groups, inserted, carried)


def note(completed_file: str, metadata: CommitMetadata) -> str:
    """What a turn notes for the completed file it published with ``metadata``."""
    return Sketch.of(metadata).note(completed_file)


@memo(1 << 10, "a pure parse of a note: a writer looks at the notes of the latest turns at every commit")
def parse(noted: str) -> tuple[str, Sketch | None]:
    """The completed file's name a note names, and its sketch (None when it has none)."""
    name, mark, text = noted.partition(MARK)
    return name, Sketch.from_text(text) if mark else None


def noted_sketch(storage: Storage, commit: Instant) -> Sketch | None:
    """The sketch the note of the completed ``commit`` names, if a lock listing of this process showed it."""
    note = noted(storage, commit.requested_time)
    if note is None:
        return None
    name, sketch = parse(note)
    return sketch if name == commit.file_name else None


def noted_sketches(storage: Storage, commits: Iterable[Instant]) -> dict[Instant, Sketch | None]:
    """:func:`noted_sketch` of each of ``commits``; on an object store, those this process knows no note of
    are asked of the standing turn of the lock it knows of, if any (:func:`~.locks.handover.ask_notes`)."""
    sketches = {commit: noted_sketch(storage, commit) for commit in commits}
    missing = [commit.requested_time for commit, sketch in sketches.items() if sketch is None]
    if storage.round_trips and ask_notes(storage.uri, missing):
        sketches = {commit: noted_sketch(storage, commit) for commit in sketches}
    return sketches


def carried_by(table: Table, commit: Instant) -> Carried:
    """What the completed data ``commit`` carries: known from its note when this process knows the digest
    it names (it computed that digest for a commit of its own, or read a commit carrying the same),
    else read from the commit."""
    sketch = noted_sketch(table.storage, commit)
    return known(sketch.carried if sketch else None) or carried(table.commit_metadata(commit))


def leaves_alone(sketch: Sketch, partitions: Iterable[str], groups: Iterable[str]) -> bool:
    """Whether a commit of ``sketch`` wrote no file in ``partitions``, whose file groups (``partition/file
    id``) are ``groups`` as far as a listing showed: it touched none of them and inserted no record key
    there (a new file group is made only for inserted keys). A data commit only, not a replacecommit."""
    if sketch.groups is None or sketch.inserted is None:
        return False
    touched = any(name in sketch.groups for name in groups)
    return not touched and not any(partition in sketch.inserted for partition in partitions)


def clearing(
    strategy: ConflictStrategy, mine: CommitMetadata, carried: str, schema: str, key_check: bool
) -> Clears | None:
    """Whether a rival's sketch rules out, for a writer committing ``mine`` that carried the map of
    versions ``carried`` (its JSON) and the table's ``schema`` from its begin, the file-group check, the
    record-key check (when ``key_check``) and a change of that map or schema. A rival that carried the same
    map and the schema the write began on, or the one ``mine`` records (writers creating a table's schema at
    once, or adding the same column), changed nothing that check would refuse; which of the two, its digest
    tells (:func:`carried_by`). None for a ``strategy`` of one's own, which may look at anything in a
    rival's commit."""
    my_partitions = _inserted_partitions(mine)
    if strategy is not file_group_overlap or (key_check and my_partitions is None):
        return None  # (my keys known only from my files: every rival's are read)
    my_groups = _group_names(mine.touched_file_groups)
    unchanged = {digest(carried, schema), digest(carried, mine.schema)}

    def clears(theirs: Sketch) -> bool:
        if theirs.carried not in unchanged or theirs.groups is None:
            return False
        if any(name in theirs.groups for name in my_groups):
            return False
        return not key_check or (
            theirs.inserted is not None and not any(p in theirs.inserted for p in my_partitions or ())
        )

    return clears


def _group_names(groups: Iterable[tuple[str, str]]) -> list[str]:
    return [f"{partition}/{file_id}" for partition, file_id in groups]


def _inserted_partitions(metadata: CommitMetadata) -> list[str] | None:
    """The partitions ``metadata`` inserted keys into; None when only its files can tell."""
    summary = inserted_keys(metadata)
    if summary is not None:
        return sorted(summary.partitions)
    return None if metadata.operation in INSERTING else []


def _bloom(members: list[str] | None) -> Bloom | None:
    if members is None or len(members) > MOST_MEMBERS:
        return None
    return Bloom.of(members, len(members))


def _bloom_text(bloom: Bloom | None) -> str:
    if bloom is None:
        return _UNKNOWN
    return base64.b32encode(bloom.data).decode().rstrip("=").lower()


def _bloom_of(text: str) -> Bloom | None:
    if text == _UNKNOWN:
        return None
    data = base64.b32decode(text.upper() + "=" * (-len(text) % 8))
    if not data:
        raise ValueError("an empty filter")
    return Bloom(8 * len(data), data)
