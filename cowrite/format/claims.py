"""Claiming an instant time: a create-if-absent of ``<t>.<action>.requested``, without the table lock for
writers (:func:`begin_instant`) and under it for table services (:func:`claim_instant`), confirmed by a
listing of the timeline after it; and withdrawing a claim that does not stand (:func:`withdraw`). A
writer's claim may carry its plan and go ahead of that listing (:class:`Ahead`), which is why claims have a
parity (:func:`claim`)."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from cowrite.errors import CowriteError, LeaseLostError
from cowrite.format.commit_metadata import CommitMetadata
from cowrite.format.fs_view import own_files
from cowrite.format.instant import Action, Instant, State, from_millis, to_millis
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.process import keep_mapping
from cowrite.steps import Step, observed, reached
from cowrite.storage.backend import Storage
from cowrite.storage.together import beside, together

log = logging.getLogger(__name__)


class HeldLock(Protocol):
    """The table lock as a claim needs it (:class:`~cowrite.protocol.locks.TableLock` is one)."""

    def check_held(self) -> None:
        """Raise :class:`LeaseLostError` unless this process still holds the lock."""


@dataclass(frozen=True)
class Ahead:
    """A write that goes ahead of the listing after its claim (object stores): ``plan(time)``, its plan
    for a claim of ``time`` (or None), drafted before that claim and carried by its ``.requested`` file;
    and ``beside(time)``, requests made beside the listing after the claim (the plan's files, the lock's
    next turn), before that listing shows the claim stands; ``undo()`` what a claim withdrawn after it
    undoes besides deleting the files its plan names (the lock's turn). Only a claim's first try goes
    ahead."""

    plan: Callable[[str], CommitMetadata | None]
    beside: Callable[[str], object]
    undo: Callable[[], object]  # for a claim withdrawn after it, once its files are deleted


def claim_instant(
    table: Table,
    timeline: Timeline,
    action: Action,
    now_millis: int,
    plan: bytes | Callable[[str], bytes] = b"",
    *,
    lock: HeldLock,
) -> Instant:
    """Claim a new ``.requested`` instant for a table service (see :func:`claim`); ``timeline`` was
    loaded under ``lock``, the table lock the caller holds.

    A claimant paused past the lock's lease may have picked, from a stale timeline, a time someone
    else has since claimed: so the lock is checked before and after the claim, and a claim made
    without it is withdrawn: it raises :class:`LeaseLostError`, and nothing of it stays (lock expiry is
    final, so a lock still held after the claim was held throughout).
    """
    lock.check_held()
    instant, _, _ = claim(table, timeline, action, now_millis, plan)
    try:
        lock.check_held()
    except LeaseLostError:
        withdraw(table, instant, "claimed without the lock")
        raise
    return instant


def begin_instant(
    table: Table,
    action: Action,
    now_millis: int,
    meanwhile: Callable[[str], object] | None = None,
    plan: Callable[[str], bytes | None] | None = None,
    ahead: Ahead | None = None,
) -> tuple[Instant, Timeline, float]:
    """Claim a new ``.requested`` instant for a writer, without the table lock (see :func:`claim`);
    return it with the timeline the write begins on, listed after the claim, and when (on
    ``time.monotonic()``) the create of the claim that stood began: the writer's lease runs from there.

    That timeline shows every instant completed before the claim was made: what the cleaner and the
    archiver take a pending writer to have seen (they order the two by the files' modification
    times). The time is picked after the newest instant of the last timeline this process listed,
    which saves a listing; a claim that turns out too early is made again. ``meanwhile(time)`` (requests
    the writer makes before that listing, such as noting the lock's turn, and work such as drafting its
    plan for ``time``) runs beside the first try to claim ``time``: one round trip for both on an object
    store; it must not raise. ``plan(time)``, the ``.inflight`` content drafted for a claim of ``time``
    that stood (or None), is written beside the listing after it, and withdrawn with the claim.
    ``ahead``: a write that goes ahead of that listing (:class:`Ahead`); a claim withdrawn after it
    deletes the files its plan names first.
    """
    last = Timeline.last_listed(table.storage)
    return claim(table, last, action, now_millis, meanwhile=meanwhile, inflight=plan, ahead=ahead)


def claim(
    table: Table,
    timeline: Timeline,
    action: Action,
    now_millis: int,
    plan: bytes | Callable[[str], bytes] = b"",
    meanwhile: Callable[[str], object] | None = None,
    inflight: Callable[[str], bytes | None] | None = None,
    ahead: Ahead | None = None,
) -> tuple[Instant, Timeline, float]:
    """Create ``.requested`` at the first free time after ``timeline``'s newest instant and every time
    this process tried before, no earlier than ``now_millis``; return it with the timeline listed right
    after, and the ``time.monotonic()`` at which its create began (its file was written after that).

    The file is created only if absent (test-and-set), and the claim stands if the listing after it
    shows it, no other action's instant at the same time (each time names one instant) and no completed
    instant with a later time (its base files would outrank ours in the file groups both touch).
    Otherwise it is withdrawn and made again after what the listing showed. So an instant claimed after
    another completed carries the later time. A pending instant of a later time, claimed meanwhile, is
    no reason to withdraw: whichever of the two completes second finds the other in its conflict check
    (by identity); withdrawing would let claims made at once stand one a round (the latest each time).
    Of two claimants of one time, the later to list sees the other: one withdraws.

    A claim that goes ``ahead`` writes files before its listing shows that it stands, and a base file
    whose time is that of a completed commit or replacecommit is one readers show (a clean's or a
    rollback's makes none visible). So such a claim takes an even millisecond and a replacecommit an
    odd one: whatever other action's claim shares its time, none completes as one that would show
    the files a withdrawn claim left behind.
    """
    if action is not Action.COMMIT:
        ahead = None  # a replacecommit's millisecond is odd: it never goes ahead
    parity = _EVEN if ahead is not None else _ODD if action is Action.REPLACE_COMMIT else None
    while True:
        floor = timeline.last.requested_time if timeline.last else None  # in time order
        millis = max(now_millis, to_millis(floor) + 1 if floor else 0, _tried.get(table.storage, -1) + 1)
        if parity is not None and millis % 2 != parity:
            millis += 1
        reached(Step.CLAIMING)
        while True:
            instant = Instant(from_millis(millis), action, State.REQUESTED)
            _tried[table.storage] = millis
            carried = ahead.plan(instant.requested_time) if ahead is not None else None
            if carried is not None:
                content = carried.to_bytes(action)
            else:
                content = plan(instant.requested_time) if callable(plan) else plan  # a plan may name its time
            create = partial(table.storage.create_if_absent, table.instant_path(instant), content)
            made_at = time.monotonic()
            side = meanwhile and partial(meanwhile, instant.requested_time)
            created, meanwhile = beside(table.storage, create, side), None
            if created:
                break
            millis += 1 if parity is None else 2
        # a claim that carries its plan has it written again as .inflight, as encoded for the claim
        drafted = content if carried is not None else inflight and inflight(instant.requested_time)
        inflight = None
        path = table.instant_path(instant.transition(State.INFLIGHT))
        planned = partial(table.storage.write, path, drafted) if drafted else None
        sides: list[Callable[[], object]] = [planned] if planned is not None else []
        went, written = (ahead, tuple(own_files(carried, instant.requested_time))) if carried else (None, ())
        if went is not None:
            sides.append(partial(went.beside, instant.requested_time))
        ahead = None
        try:
            listing = partial(table.timeline, tail=True)
            after = beside(table.storage, listing, partial(together, table.storage, sides) if sides else None)
            shared = instant.requested_time in Timeline.shared_times(table.storage)
        except BaseException:
            # Not known to stand: withdrawn now, it needs no rollback (left behind, its time could be
            # claimed again once it is rolled back, then rolled back twice).
            _take_back(table, instant, "the listing after it failed", bool(planned), written, went)
            raise
        later = next((i for i in after.after(instant.requested_time) if i.is_completed), None)
        # Not listed: a cleaner removed it as a withdrawn claim while this claimant was paused.
        listed = after.get(instant.requested_time)
        gone = listed is None or listed.action is not instant.action
        if not shared and later is None and not gone:
            break
        clash = "another action's instant at its time" if shared or gone else f"{later} later"
        _take_back(table, instant, f"{clash} meanwhile", bool(planned), written, went)
        timeline = after
    if observed():
        seen = sorted(i.requested_time for i in after if i.is_completed)
        made = time.time() - (time.monotonic() - made_at)  # the claim judges see is no older
        reached(Step.CLAIMED, instant.requested_time, action=instant.action.value, seen=seen, made=made)
    return instant, after, made_at


def _take_back(
    table: Table, instant: Instant, why: str, planned: bool, files: Sequence[str], went: Ahead | None
) -> None:
    """Withdraw a claim that does not stand (:func:`withdraw`), and undo what went ahead of its listing."""
    withdraw(table, instant, why, planned=planned, files=files)
    if went is not None:
        went.undo()


def withdraw(
    table: Table, instant: Instant, why: str, planned: bool = False, files: Sequence[str] = ()
) -> None:
    """Delete the ``.requested`` file of a claim that does not stand, at once: the base ``files`` written
    under it first, then its ``.inflight`` if it may be ``planned``. If that fails the lazy rollback
    removes them later (the cleaner's removal of withdrawn claims where the time is shared)."""
    try:
        for path in files:  # one by one: a bulk delete does not tell which keys the storage refused
            table.storage.delete(path)
        if planned:
            table.storage.delete(table.instant_path(instant.transition(State.INFLIGHT)))
        table.storage.delete(table.instant_path(instant))
    except CowriteError as exc:  # a rollback, or the removal of withdrawn claims, removes them later
        log.warning("could not withdraw %s (%s): %s", instant, why, exc)
    else:
        log.info("withdrew %s: %s", instant, why)


# A time names one instant: a process never tries one twice, since a create whose answer was lost may
# have made its claim, which no listing of the process showed yet.
_EVEN, _ODD = 0, 1  # the parity of a claim's milliseconds (claim)

_tried: weakref.WeakKeyDictionary[Storage, int] = keep_mapping(
    f"{__name__}._tried", weakref.WeakKeyDictionary(), "a time per live Storage", "never claim a time twice"
)
