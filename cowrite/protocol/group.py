"""Group commit: the holder of a turn of the table lock publishes, after its own commit, the commits of
writers queued behind it.

On an object store a turn of the lock is several round trips, one after another, and without this one
writer commits per turn: with many writers the lock's turns bound the table's commits per second. A writer
that waits in the lock's queue hands its commit over in its place (:class:`Request`: the completed file's
payload, the turn it began after, until when it may be published). The holder of a turn, once its own
completed file exists, reads the requests queued behind it and publishes each that passes the checks the
waiter would make under the lock itself, in the order of the queue, each with a completion time above the
one before and created after it (one round trip each: completed files appear in completion order, as
incremental readers need). It begins each one's note beside its create, and its release, made once they
all exist, is what counts them (:mod:`.locks.lock_files`). A waiter that sees its commit noted stops waiting
(:class:`~.locks.base.RequestPublished`); one that takes the lock first publishes its commit itself, unless a
turn before it published it.

A holder publishes a request only when the notes of the turns since the waiter's begin tell it all the
waiter's own check under the lock would look at:

- the waiter's commit is a data commit checked by file groups and carries no application version
  (:func:`groupable`);
- every turn since the waiter's begin left its notes and none names the waiter's instant; no commit they
  name, nor one published before it in this turn, touched a file group of the waiter's or inserted a
  record key it inserts (where it checks keys), nor does a pending clustering plan where those count. A
  note's sketch rules most out unread (:mod:`.sketch`); a conflict with a clustering that the waiter might
  revert is left to the waiter;
- the waiter carries the map of applications' versions and the schema that the holder's own commit
  carries: the newest;
- the request has not lapsed. A waiter hands its commit over for :data:`WINDOW` seconds at most, and
  only while its lease lasts with the safety margin to spare, so no commit is published after its
  writer's lease expired; a holder leaves alone a request with less than :data:`SLACK` left, which
  covers the skew of two clocks and the create's round trip. A waiter that fails meanwhile waits until its
  request lapsed, and looks whether it committed, before it aborts (:func:`settle`); a conflict it finds
  while it waits is one every holder finds, and needs no wait. A waiter that takes the lock and fails
  under it ends its turn unnoted, so that no later holder publishes its request.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cowrite.errors import CommitStateUnknownError, CowriteError
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.instant import Action, Instant, InvalidInstantError, State
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol import sketch
from cowrite.protocol.checks import key_overlap, pending_plans
from cowrite.protocol.conflict import Candidate, ConflictStrategy, file_group_overlap
from cowrite.protocol.locks import TableLock
from cowrite.protocol.turns import noted_instant
from cowrite.protocol.txn import TXNS_KEY
from cowrite.steps import Step, reached

log = logging.getLogger(__name__)

WINDOW = 10.0  # seconds a waiter's commit may be published by another holder, at most
SLACK = 0.5  # seconds before a request lapses that a holder leaves it alone: clock skew and a round trip


@dataclass(frozen=True)
class Request:
    """A waiter's commit, handed to the holders ahead of it in the queue."""

    instant: Instant  # the waiter's pending instant
    noted: int  # the lock's turn it noted before listing the timeline it began on
    until: float  # seconds since the epoch: no holder publishes it from then on
    plans: bool  # whether pending clustering plans count as touching their file groups
    keys: bool  # whether it must not insert a record key a rival inserted (:mod:`.conflict`)
    payload: bytes  # its completed file
    seen: str = ""  # the latest completion time on the timeline it began on: commits it began after

    def to_bytes(self) -> bytes:
        head = {
            "instant": self.instant.requested_time,
            "action": self.instant.action.value,
            "noted": self.noted,
            "until": self.until,
            "plans": self.plans,
            "keys": self.keys,
            "seen": self.seen,
        }
        return json.dumps(head, sort_keys=True).encode() + b"\n" + self.payload

    @classmethod
    def from_bytes(cls, data: bytes) -> Request | None:
        """The request ``data`` holds; None for anything else (an empty place, a damaged one)."""
        head, newline, payload = data.partition(b"\n")
        if not newline:
            return None
        try:
            fields = json.loads(head)
            instant = Instant(fields["instant"], Action(fields["action"]), State.INFLIGHT)
            noted, until = int(fields["noted"]), float(fields["until"])
            plans, keys = bool(fields["plans"]), bool(fields["keys"])
        except (ValueError, KeyError, TypeError, InvalidInstantError):
            return None
        return cls(instant, noted, until, plans, keys, payload, str(fields.get("seen", "")))


def groupable(action: Action, conflict_strategy: ConflictStrategy) -> bool:
    """Whether a commit of ``action`` checked by ``conflict_strategy`` may be handed over, when it carries
    no application version: a data commit checked by file groups, which a holder checks as its writer
    would."""
    return action is Action.COMMIT and conflict_strategy is file_group_overlap


@dataclass
class Turn:
    """What a writer's turn of the lock published: its holder's commit, then the waiters' in completion
    order, each with its sketch and its note; and the places of the waiters served from the queue."""

    published: list[tuple[Instant, sketch.Sketch]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    served: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, own: tuple[Instant, CommitMetadata]) -> Turn:
        """The turn of a holder that published ``own``, its completed instant and what it carries."""
        done, metadata = own
        drawn = sketch.Sketch.of(metadata)
        return cls([(done, drawn)], [drawn.note(done.file_name)])

    def note(self, lock: TableLock) -> None:
        """Note the turn (:meth:`~.locks.base.TableLock.note_published`), once every commit of it exists."""
        lock.note_published(self.notes[0], self.notes[1:], self.served)


def publish_waiting(
    table: Table,
    lock: TableLock,
    timeline: Timeline,
    own: tuple[Instant, CommitMetadata],
    waiting: list[tuple[int, bytes]],
    clock: Callable[[], float],
    check: Callable[[], None],
) -> Turn | None:
    """Under the lock, once the holder's own completed file ``own`` exists on ``timeline`` (the timeline
    as it is now, but for that file): publish what the requests ``waiting`` queued behind it allow
    (:func:`publish_one`), and return the turn to note; None when a create failed midway (its commit may
    exist): the turn then ends unnoted, and later holders list the timeline."""
    turn = Turn.of(own)
    for place, data in waiting:
        try:
            why = publish_one(table, lock, timeline, turn, data, clock, check)
        except CowriteError:
            return None
        if why is None:
            turn.served.append(place)
        else:
            log.debug("leaving a commit queued behind the lock to its writer: %s", why)
    return turn


def publish_one(
    table: Table,
    lock: TableLock,
    timeline: Timeline,
    turn: Turn,
    data: bytes,
    clock: Callable[[], float],
    check: Callable[[], None],
) -> str | None:
    """Publish the commit of the request ``data`` next in ``turn``, if the checks its writer would make
    under the lock allow (:func:`_refusal`); None once it is published and added to ``turn``, else why
    not. ``check`` raises :class:`~cowrite.errors.LeaseLostError` unless the holder's lease is held with
    the safety margin to spare: asked right before the create, as before the holder's own, it stops a
    holder paused meanwhile from publishing after its lock may have expired. Raises
    :class:`~cowrite.errors.CowriteError` when the create failed midway: the commit may exist, and the
    turn must end unnoted."""
    request = Request.from_bytes(data)
    if request is None:
        return "it is not a request"
    time_ = request.instant.requested_time
    try:
        metadata = CommitMetadata.from_bytes(request.payload, f"the request of {time_}")
        drawn = sketch.Sketch.of(metadata)
        why = _refusal(table, lock, timeline, request, (metadata, drawn), turn.published)
        check()
    except CowriteError as exc:
        why = str(exc)
    if why is not None or time.time() >= request.until - SLACK:
        return why or "it lapses"
    completion = Table.completion_time(Timeline([turn.published[-1][0]]), time_, int(clock() * 1000))
    done = request.instant.transition(State.COMPLETED, completion)
    noted = drawn.note(done.file_name)
    lock.note_grouped(noted)  # counts only once the release exists
    try:
        created = table.storage.create_if_absent(table.instant_path(done), request.payload)
        if not created:
            raise CommitStateUnknownError(f"{done} exists already on {table.uri}")
    except CowriteError as exc:
        log.warning("publishing %s for its writer failed midway: %s", done, exc)
        raise
    table.published(done, request.payload)
    turn.published.append((done, drawn))
    turn.notes.append(noted)
    reached(Step.GROUPED, time_, completion=completion, lock=lock)
    log.info("published %s on %s for its writer", done, table)
    return None


def _refusal(
    table: Table,
    lock: TableLock,
    timeline: Timeline,
    request: Request,
    commit: tuple[CommitMetadata, sketch.Sketch],
    published: list[tuple[Instant, sketch.Sketch]],
) -> str | None:
    """Why the holder leaves the waiter's ``commit`` (its metadata, and its sketch) to the waiter; None
    when it publishes it. ``published``: the commits of the turn so far, with their sketches."""
    time_ = request.instant.requested_time
    metadata, drawn = commit
    if time.time() >= request.until - SLACK:
        return "it lapses"
    if drawn.carried is None or drawn.carried != published[0][1].carried:
        return "it carries another map of versions or schema than the newest commit"
    between = lock.published_since(request.noted)
    if between is None:
        return "a turn since its begin left no note"
    rivals = [(i, sketch.parse(name)[1]) for name in between if (i := noted_instant(name)) is not None]
    if len(rivals) < len(between):
        return "a note names no completed instant"
    rivals += published
    # a commit the waiter's timeline showed completed is one it began after, not a rival: a create shows
    # to every listing once it returns, and those of turns follow one another in completion order
    rivals = [(i, noted) for i, noted in rivals if (i.completion_time or "") > request.seen]
    if any(i.requested_time == time_ for i, _ in rivals):
        return "it committed already"
    mine = timeline.get(time_)
    if mine is not None and (mine.is_completed or table.being_rolled_back(timeline, time_)):
        return "it is no longer pending"
    txns = metadata.extra.get(TXNS_KEY, "")
    clears = sketch.clearing(file_group_overlap, metadata, txns, metadata.schema, request.keys)
    if clears is None:
        return "its record keys are known only from its files"
    unread = [i for i, noted in rivals if i.action.writes_data and not (noted and clears(noted))]
    candidates = [Candidate(i, m) for i, m in zip(unread, table.commit_metadata_of(unread), strict=True)]
    if request.keys and key_overlap(table, time_, metadata, candidates):
        return "it inserts a record key another commit inserted"
    if request.plans:
        candidates += pending_plans(table, timeline, time_)
    if file_group_overlap(metadata, candidates):
        return "it touches a file group another commit touched"
    return None


def settle(table: Table, requested_time: str, until: float, at_once: bool) -> Instant | None:
    """For a waiter that failed after handing its commit over: the completed instant if a holder published
    it, else None, told once no holder can publish it any more — after it lapsed, or ``at_once`` when the
    failure was a conflict every holder finds as well. Raises what listing the timeline raises."""
    if not at_once:
        time.sleep(max(0.0, until - time.time()))
    found = table.timeline().get(requested_time)
    return found if found is not None and found.is_completed else None
