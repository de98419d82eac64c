"""A turn's note sketches the commit it published; a sketch rules out only what reading the commit would."""

from __future__ import annotations

import random

import pytest

from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.instant import Action, Instant, State
from cowrite.protocol import carried, sketch
from cowrite.protocol.conflict import Candidate, file_group_overlap, strategy_named
from cowrite.protocol.key_summary import INSERTED_KEYS, KeySummary
from cowrite.protocol.sketch import MOST_MEMBERS, Sketch
from cowrite.protocol.txn import TXNS_KEY

RIVAL = Instant("20261127000000001", Action.COMMIT, State.COMPLETED, "20261127000000002")
NO_TXNS = "{}"
SCHEMA = '{"type": "record", "name": "t", "fields": [{"name": "id", "type": ["null", "long"]}]}'


def commit(
    groups: list[tuple[str, str]],
    inserted: dict[str, list[str]] | None,
    txns: str = NO_TXNS,
    schema: str = SCHEMA,
) -> CommitMetadata:
    """An upsert writing ``groups`` that inserted ``inserted`` (partition -> keys; None: no summary)."""
    stats = tuple(WriteStat(f, f"{p}/{f}_0-0-1_1.parquet", p, "null", 1, 1, 0, 0, 10) for p, f in groups)
    extra = {TXNS_KEY: txns}
    if inserted is not None:
        extra[INSERTED_KEYS] = KeySummary.of((p, k) for p, keys in inserted.items() for k in keys).to_json()
    return CommitMetadata("upsert", stats, schema=schema, extra=extra)


def rules_out(mine: CommitMetadata, theirs: CommitMetadata, key_check: bool = True) -> bool:
    clears = sketch.clearing(file_group_overlap, mine, NO_TXNS, SCHEMA, key_check)
    assert clears is not None
    _, drawn = sketch.parse(sketch.note(RIVAL.file_name, theirs))
    assert drawn is not None
    return clears(drawn)


def test_a_note_names_the_completed_file_and_its_sketch_under_255_bytes() -> None:
    partitions = [f"part={n:04d}" for n in range(MOST_MEMBERS)]
    groups = [(p, f"{n:08x}-aaaa-bbbb-cccc-dddddddddddd-0") for n, p in enumerate(partitions)]
    widest = commit(groups, {p: ["k"] for p in partitions}, txns='{"app":1}')
    noted = sketch.note(RIVAL.file_name.replace("commit", "replacecommit"), widest)
    assert len(f"lock123456.published.{noted}".encode()) < 255
    name, drawn = sketch.parse(noted)
    assert name == RIVAL.file_name.replace("commit", "replacecommit")
    assert drawn == Sketch.of(widest) and drawn.groups is not None and drawn.inserted is not None
    assert sketch.parse(RIVAL.file_name) == (RIVAL.file_name, None)  # a note made without a sketch
    for damaged in ["a-b", "!!-aaaaaaaaaaaaa-x", "-aaaaaaaaaaaaa-x"]:
        assert sketch.parse(f"{RIVAL.file_name}{sketch.MARK}{damaged}") == (RIVAL.file_name, None)


def test_a_sketch_rules_out_a_rival_only_when_no_check_could_fail() -> None:
    mine = commit([("p0", "f0")], {"p0": ["new"]})
    assert rules_out(mine, commit([("p1", "f1")], {"p1": ["new"]}))  # elsewhere
    assert rules_out(mine, commit([("p0", "f1")], {}))  # my partition, no key inserted
    assert not rules_out(mine, commit([("p0", "f0")], {}))  # my file group
    assert not rules_out(mine, commit([("p0", "f1")], {"p0": ["other"]}))  # keys inserted into my partition
    assert rules_out(mine, commit([("p0", "f1")], {"p0": ["other"]}), key_check=False)
    assert not rules_out(mine, commit([("p1", "f1")], None))  # keys inserted, no summary: files tell
    assert not rules_out(mine, commit([("p1", "f1")], {}, txns='{"app":{"version":1,"instant":"1"}}'))
    added = SCHEMA.replace("}]}", '}, {"name": "s", "type": ["null", "string"]}]}')
    assert not rules_out(mine, commit([("p1", "f1")], {}, schema=added))  # it changed the table's schema
    adding = commit([("p0", "f0")], {"p0": ["new"]}, schema=added)
    assert rules_out(adding, commit([("p1", "f1")], {}, schema=added))  # to the one mine records
    assert not rules_out(adding, commit([("p1", "f1")], {}, schema=added, txns='{"app":{"version":1}}'))
    many = [("p1", f"f{n}") for n in range(MOST_MEMBERS + 1)]
    assert not rules_out(mine, commit(many, {}))  # too many file groups to sketch


def test_a_strategy_of_ones_own_or_keys_known_only_from_files_read_every_rival() -> None:
    assert strategy_named("file-group") is file_group_overlap
    assert sketch.clearing(lambda mine, candidates: [], commit([], {}), NO_TXNS, SCHEMA, True) is None
    unsummed = commit([("p0", "f0")], None)
    assert sketch.clearing(file_group_overlap, unsummed, NO_TXNS, SCHEMA, True) is None
    assert sketch.clearing(file_group_overlap, unsummed, NO_TXNS, SCHEMA, False) is not None


@pytest.mark.parametrize("seed", range(5))
def test_a_sketch_never_rules_out_a_rival_the_file_group_check_would_fail(seed: int) -> None:
    draw = random.Random(seed)

    def groups() -> list[tuple[str, str]]:
        return [(f"p{draw.randrange(3)}", f"f{draw.randrange(12)}") for _ in range(draw.randrange(1, 6))]

    ruled_out = 0
    for _ in range(400):
        mine, theirs = commit(groups(), {}), commit(groups(), {})
        if rules_out(mine, theirs):
            ruled_out += 1
            assert not file_group_overlap(mine, [Candidate(RIVAL, theirs)])
    assert ruled_out > 50  # and most disjoint rivals are left unread


def test_a_sketch_leaves_a_partition_alone_only_when_the_commit_wrote_nothing_there() -> None:
    def leaves_p0(theirs: CommitMetadata) -> bool:
        return sketch.leaves_alone(Sketch.of(theirs), ["p0"], ["p0/f0", "p0/f1"])

    assert leaves_p0(commit([("p1", "f9")], {"p1": ["new"]}))  # another partition only
    assert leaves_p0(commit([("p1", "f9")], {}))  # an update elsewhere
    assert not leaves_p0(commit([("p0", "f1")], {}))  # an update of one of its file groups
    assert not leaves_p0(commit([("p1", "f9")], {"p0": ["new"]}))  # an insert there: a new file group
    assert not leaves_p0(commit([("p1", "f9")], None))  # what it inserted, only its files tell
    assert not leaves_p0(commit([("p1", f"f{n}") for n in range(MOST_MEMBERS + 1)], {}))  # not sketched


def test_what_a_noted_commit_carries_is_known_once_the_process_computed_its_digest() -> None:
    txns = '{"app":{"version":7,"instant":"20261127000000001"}}'
    value = carried.digest(txns, SCHEMA)
    assert carried.known(value) == carried.Carried(txns, SCHEMA)
    assert carried.known(carried.digest(NO_TXNS, SCHEMA + " ")) == carried.Carried(NO_TXNS, SCHEMA + " ")
    assert carried.known("0" * 16) is None and carried.known(None) is None
