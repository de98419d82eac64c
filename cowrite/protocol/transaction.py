"""One writer's instant: begin, plan, write, commit — optimistic concurrency control (RFC-22).

1. :meth:`Transaction.begin` picks an instant time no instant on the timeline has used (test-and-set:
   the ``.requested`` file is created only if absent; no lock), remembers which instants were completed
   (listed after the claim) and starts the heartbeat.
2. :meth:`Transaction.plan` publishes ``.inflight`` listing every base file the writer may create, so a
   failed write can be rolled back without listing the table.
3. The engine writes base files, calling :meth:`Transaction.check_alive` between files to fail fast.
4. :meth:`Transaction.commit` takes the lock, reloads the timeline, and looks for conflicts among the
   instants that completed since begin (by identity, not by clocks). Without conflict, and with the lease
   still held by the safety margin, it publishes ``<t>_<completion>.<action>`` with a completion time
   above every earlier one.

Under the lock the timeline is listed again only when the lock cannot tell what its turns since begin
published (:mod:`.turns`).

A write may carry a :class:`~.txn.Txn` (an application id and a version): it is refused — nothing
committed, :class:`~.errors.TxnAlreadyCommittedError` — when that version or a newer one of the
application is committed, checked at begin (before any data is written) and again under the lock.
Every data commit carries forward the last version of every application (:mod:`.txn`).

A failure before the completed file is created leaves only invisible garbage (``.requested``/``.inflight``
and unreferenced base files) for the lazy rollback. Errors say which of the two cases applies:
:class:`~.errors.CommitFailedError` (not committed) or :class:`~.errors.CommitStateUnknownError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from cowrite.errors import (
    CommitFailedError,
    CommitStateUnknownError,
    CowriteError,
    LeaseLostError,
    StorageError,
    WriteConflictError,
)
from cowrite.format import claims
from cowrite.format import config as keys
from cowrite.format.commit_metadata import CommitMetadata, WriteStat
from cowrite.format.fs_view import own_files
from cowrite.format.instant import Action, Instant, State
from cowrite.format.table import Table
from cowrite.format.timeline import Timeline
from cowrite.protocol import group, sketch, standing
from cowrite.protocol.checks import WriteChecks
from cowrite.protocol.conflict import strategy_named
from cowrite.protocol.drafts import Drafts
from cowrite.protocol.heartbeat import Heartbeat, abort_reason_of
from cowrite.protocol.locks import LockHolder, RequestPublished, lock_for
from cowrite.protocol.options import WriteOptions
from cowrite.protocol.revert import Revert
from cowrite.protocol.table_schema import Rebase, hidden, latest_schema, publish_schema, recorded_schema
from cowrite.protocol.turns import Turns, completed_between, noted_instant
from cowrite.protocol.txn import TXNS_KEY, CommittedTxns
from cowrite.steps import Step, reached
from cowrite.storage.together import ahead, beside

log = logging.getLogger(__name__)


# (the losing ingestion, the clusterings it lost to, the current timeline) -> the revert, or None when
# they cannot be reverted (then the ingestion aborts with the conflict). Called under the table lock.
RevertClustering = Callable[["Transaction", list[Instant], Timeline], Revert | None]


class Transaction(WriteChecks):
    """A writer's instant from begin to commit or abort. Use :meth:`begin` to create one."""

    options: WriteOptions

    def __init__(self, table: Table, action: Action, operation: str, options: WriteOptions) -> None:
        self.table = table
        self.action = action
        self.operation = operation
        self.options = options
        self.holder = LockHolder()
        self.lock = options.lock or lock_for(
            table.storage, options.config, self.holder, options.heartbeat_policy, table.name
        )
        self.strategy = options.conflict_strategy or strategy_named(
            options.config.get(keys.CONFLICT_STRATEGY)
        )
        self.instant: Instant | None = None
        self.begin_timeline = Timeline(())
        self.heartbeat: Heartbeat | None = None
        self.planned: CommitMetadata | None = None
        self._early_checked = 0.0
        self.turns = Turns(table, self.lock)
        self._publishing = False  # the completed file's creation has begun (under the lock)
        self._handed: group.Request | None = None  # the commit this writer handed over (:mod:`.group`)
        self._then: Callable[[], bool] | None = None  # once its commit is reported: whether the turn stands
        self._held = False  # this commit took the lock (a request it handed over is then told at once)

    # -- begin -----------------------------------------------------------------------------------
    @classmethod
    def begin(
        cls,
        table: Table,
        operation: str,
        action: Action = Action.COMMIT,
        options: WriteOptions | None = None,
        alongside: Callable[[], object] | None = None,
        draft: Callable[[str], CommitMetadata | None] | None = None,
        write_ahead: Callable[[str], object] | None = None,
    ) -> Transaction:
        """Claim an instant and list the timeline the write begins on. ``alongside``: requests the writer
        makes beside the claim (one round trip for all on an object store); it must not raise.
        ``draft(instant_time)``: on an object store, the write's plan (or None; it must not raise), made
        beside the claim from what the process knew before it and written beside the listing after it;
        :attr:`planned` then holds it, and the writer plans again if the timeline it begins on shows
        otherwise. Withdrawn with the claim. ``write_ahead(instant_time)``: the draft's files, written ahead
        of that listing where it was made before the claim (:mod:`.drafts`)."""
        transaction = cls(table, action, operation, options or WriteOptions(config=table.config))
        early = draft if table.storage.round_trips and transaction.options.txn is None else None
        transaction._begin(alongside, early, write_ahead if early else None)
        return transaction

    def _begin(
        self,
        alongside: Callable[[], object] | None,
        draft: Callable[[str], CommitMetadata | None] | None,
        write_ahead: Callable[[str], object] | None,
    ) -> None:
        # No lock: the claim is a test-and-set, and the timeline the write begins on is listed after it
        # (claims.begin_instant). The lease runs from the claim that stood: until its first heartbeat a new
        # instant is judged by its .requested file, written after that claim's create began, so a writer
        # paused past the tolerance meanwhile may have been rolled back, and fails to start. Not from the
        # first try: the claims it withdrew before (rivals had claimed later times) are not its instant.
        drafts = Drafts(self.action, draft)
        # The lock's turn is noted first (where that lists): on a server that answers one request at a
        # time, the claim's round trip then does not wait for that listing as well.
        noted = ahead(self.table.storage, self.turns.note)

        def meanwhile(time_: str) -> None:  # beside the claim: the engine's requests, its plan, the turn
            if alongside is not None:
                alongside()
            drafts(time_)
            noted()

        def turn(time_: str) -> None:  # taken with the lease that began with the claim
            self.holder = self.lock.holder = self.holder.for_instant(time_)
            self.turns.take_next()

        give_back, storage = self.turns.give_back, self.table.storage
        going = drafts.ahead(storage, write_ahead, turn, give_back) if write_ahead is not None else None
        now = int(self.options.clock() * 1000)
        requested, timeline, claimed_at = claims.begin_instant(
            self.table, self.action, now, meanwhile, drafts.content, going
        )
        if self.options.txn is not None:
            # A replayed batch is refused here, before any data is written; the claim, under which
            # nothing was written, is withdrawn so the timeline is left as it was.
            try:
                CommittedTxns.of(self.table, timeline).check(
                    self.options.txn, self.table.name, requested.requested_time
                )
            except BaseException:
                claims.withdraw(self.table, requested, "its application version was already committed")
                raise
        self.holder = self.lock.holder = self.holder.for_instant(requested.requested_time)
        self.instant, self.begin_timeline = requested, timeline
        self.heartbeat = Heartbeat(
            self.table.storage,
            requested.requested_time,
            self.options.heartbeat_policy,
            self.holder.owner,
            leased_at=claimed_at,
        ).start()
        log.debug("began %s on %s", requested, self.table)
        if requested.requested_time in drafts.made:  # else drafted for a claim that did not stand, or none
            reached(Step.REQUESTED, self.instant_time)
            self.planned, made = drafts.made[requested.requested_time]
            self.instant = requested.transition(State.INFLIGHT)
            reached(Step.PLANNED, self.instant_time, made=made)

    @classmethod
    def adopt(
        cls,
        table: Table,
        planned: Instant,
        plan: CommitMetadata,
        seen: Timeline,
        options: WriteOptions | None = None,
    ) -> Transaction:
        """Take over an instant a table service planned (its ``.requested`` holds the plan).

        Of several executors, only the one that creates ``.inflight`` goes on; the others get
        :class:`CommitFailedError` before touching anything. ``seen`` is the timeline the plan was
        made on: commits completed after it are the candidates for conflicts.
        """
        inflight = planned.transition(State.INFLIGHT)
        if not table.storage.create_if_absent(table.instant_path(inflight), plan.to_bytes(planned.action)):
            raise CommitFailedError(f"{inflight} of {table.uri} is already being executed by another job")
        transaction = cls(table, planned.action, plan.operation, options or WriteOptions(config=table.config))
        transaction.instant, transaction.planned, transaction.begin_timeline = inflight, plan, seen
        transaction.holder = transaction.lock.holder = transaction.holder.for_instant(planned.requested_time)
        transaction.heartbeat = Heartbeat(
            table.storage,
            planned.requested_time,
            transaction.options.heartbeat_policy,
            transaction.holder.owner,
        ).start()
        return transaction

    @property
    def instant_time(self) -> str:
        if self.instant is None:
            raise CowriteError("the transaction has not begun")
        return self.instant.requested_time

    # -- plan and write --------------------------------------------------------------------------
    def plan(self, planned: CommitMetadata) -> None:
        """Publish ``.inflight`` listing every file group and base file this write may create (again, when
        the plan written beside the listing after the claim does not stand)."""
        assert self.instant is not None
        if self.instant.state is State.REQUESTED:
            reached(Step.REQUESTED, self.instant_time)
        self.check_alive()
        inflight = replace(self.instant, state=State.INFLIGHT)
        made = time.time()  # the plan judges see is no older
        self.table.storage.write(self.table.instant_path(inflight), planned.to_bytes(self.action))
        self.instant, self.planned = inflight, planned
        reached(Step.PLANNED, self.instant_time, made=made)

    def share_lease(self) -> None:
        """Write the heartbeat file now, for other processes that judge this writer by it (Spark tasks
        check it before each file), rather than at the first renewal; raises :class:`LeaseLostError` if
        the lease is gone or the file cannot be written."""
        assert self.heartbeat is not None
        self.heartbeat.renew()
        self.heartbeat.check(margin=0.0)
        if not self.heartbeat.written:
            raise LeaseLostError(f"the heartbeat of {self.instant_time} could not be written")

    def check_alive(self) -> None:
        """Raise as soon as the write cannot succeed: its lease is gone (:class:`LeaseLostError`) or,
        with early conflict detection on, it overlaps a writer that wins (:class:`WriteConflictError`)."""
        if self.heartbeat is None:
            raise CowriteError("the transaction has not begun")
        self.heartbeat.check(margin=0.0)
        if self.planned is not None and self.options.config.get(keys.EARLY_CONFLICT_DETECTION):
            now = time.monotonic()
            if now - self._early_checked >= self.options.config.get(keys.EARLY_CONFLICT_PERIOD_MS) / 1000:
                self._early_checked = now
                self._check_early(self.planned)

    # -- commit ----------------------------------------------------------------------------------
    def beside_the_lock(self, last: Callable[[], WriteStat]) -> WriteStat:
        """``last()`` — the write's last file, from an engine that writes its files itself — made beside
        one try for the lock's next turn on an object store (:meth:`Turns.take_next`, which tries only while
        the lock's listing at begin is fresh): a writer nobody overtook then holds the lock once its files
        are written. If ``last`` or the commit fails, the write aborts as any other, releasing the lock."""
        assert self.heartbeat is not None
        if not self.table.storage.round_trips:  # nothing to save; the lock would be held while it runs
            return last()
        self.heartbeat.refresh()
        self.heartbeat.check()  # a writer takes the lock with the safety margin left on its lease
        return beside(self.table.storage, last, self.turns.take_next)

    def commit(
        self, metadata: CommitMetadata, revert: RevertClustering | None = None, rebase: Rebase | None = None
    ) -> Instant:
        """Publish the completed instant, or raise; see the module docstring for the error cases.

        ``revert`` lets an ingestion that lost to a clustering win instead, when the table gives
        ingestion priority (``hoodie.clustering.updates.strategy`` = allow): it writes the clustering's
        input file groups back as new file groups, which a second replacecommit publishes right after
        this one, replacing the clustering's output (RFC-22's example of priority). ``rebase`` applies
        this write's changes of the table's schema to another writer's made since (:mod:`.table_schema`).
        """
        assert self.instant is not None and self.heartbeat is not None
        reached(Step.WRITTEN, self.instant_time)
        if self.instant.state is State.REQUESTED:
            self.plan(metadata)
        stands = False  # whether the turn stands once this commit is published (:mod:`.standing`)
        try:
            self.heartbeat.refresh()  # a fresh lease for the commit; a writer that was paused loses it here
            self.heartbeat.check()
            carried = CommittedTxns.of(self.table, self.begin_timeline)
            begun = latest_schema(self.table, self.begin_timeline)
            metadata = self._with_txns(metadata, carried)
            payload = metadata.to_bytes(self.action)  # encoded before taking the lock others wait for
            keyed = self._checks_keys(metadata)
            unread = sketch.clearing(self.strategy, metadata, carried.to_json(), begun, keyed)
            waiting = partial(self._fail_while_waiting, metadata, revert)
            self._hand_over(metadata, payload)
            self._publishing, self._then, self._held = False, None, False
            known = self.turns.take(self.begin_timeline, waiting, unread)
            self._held = True
            try:
                reached(Step.LOCKED, self.instant_time)
                completed = self._publish(metadata, payload, revert, (carried, begun, rebase), known)
                completion, grouped = completed.completion_time, not self._publishing
                reached(
                    Step.PUBLISHED, self.instant_time, completion=completion, lock=self.lock, grouped=grouped
                )
                stands = self._then is not None and self._then()
            finally:
                # A turn that published nothing says so: later holders need not list. Not one of a writer
                # that handed its commit over: holders after it then leave that request alone.
                if not self._publishing and not self.lock.requested:
                    self.lock.note_published(None)
                if not stands:  # else the standing turn releases the lock, and stops the heartbeat
                    self._release_lock()
        except RequestPublished as grouped:
            completed = self._published_by_another(grouped.noted)
        except CommitStateUnknownError:
            self.heartbeat.stop(delete=False)
            raise
        except BaseException as exc:
            settled = self._settle(exc)
            if settled is None:  # nothing was published: the write definitely did not commit
                self.abort(exc)
                raise
            completed = self._published_by_another(settled.file_name)
        finally:
            self.lock.request = None
        try:
            if not stands:
                self.heartbeat.stop(delete=True)
        except CowriteError as exc:  # committed all the same; the cleaner collects a stray heartbeat
            log.warning("committed %s, but could not delete its heartbeat: %s", completed, exc)
        log.info("committed %s on %s", completed, self.table)
        return completed

    def _hand_over(self, metadata: CommitMetadata, payload: bytes) -> None:
        """On an object store, hand the commit to the holders ahead of this writer in the lock's queue,
        for a while (:mod:`.group`): a plain commit, with the lease held long enough."""
        assert self.instant is not None and self.heartbeat is not None
        self.lock.requested, self._handed, noted = False, None, self.turns.noted
        lasts = min(group.WINDOW, self.heartbeat.remaining() - self.heartbeat.policy.margin)
        if not self.table.storage.round_trips or noted is None or lasts <= group.SLACK:
            return
        if self.options.txn is None and group.groupable(self.action, self.strategy):
            plans, keys = not self._ingestion_first(metadata), self._checks_keys(metadata)
            seen = self.begin_timeline.latest_completion_time or ""
            request = group.Request(self.instant, noted, time.time() + lasts, plans, keys, payload, seen)
            self.lock.request, self._handed = request.to_bytes(), request

    def _settle(self, failure: BaseException) -> Instant | None:
        """After ``failure``, for a writer that handed its commit over: its completed instant if a holder
        published it, once none can any more (raises :class:`CommitStateUnknownError` when that cannot be
        told); None for any other writer."""
        if not self.lock.requested or self.heartbeat is None or self._handed is None:
            return None
        # Nobody publishes it after this writer's own turn, which then ended unnoted; nor after a conflict
        # it found while waiting, which every holder finds as well.
        at_once = self._held or isinstance(failure, WriteConflictError)
        try:
            done = group.settle(self.table, self.instant_time, self._handed.until, at_once)
        except CowriteError as exc:
            self.heartbeat.stop(delete=False)
            raise CommitStateUnknownError(
                f"{self.instant_time} on {self.table.uri} failed ({failure}) after handing its commit to "
                f"other writers, and whether one published it cannot be told ({exc}); reload the timeline"
            ) from failure
        return done

    def _published_by_another(self, noted: str) -> Instant:
        """This writer's commit, which the holder of another turn published (:mod:`.group`): ``noted``
        names its completed file."""
        done = noted_instant(noted)
        assert done is not None and self._handed is not None  # the lock matched it
        self.table.published(done, self._handed.payload)  # the process's next write need not read it
        self.instant = done
        reached(
            Step.PUBLISHED, self.instant_time, completion=done.completion_time, lock=self.lock, grouped=True
        )
        return done

    def _with_txns(self, metadata: CommitMetadata, carried: CommittedTxns) -> CommitMetadata:
        """``metadata`` carrying ``carried`` forward, with this write's own txn added."""
        txns = carried.with_commit(self.options.txn, self.instant_time)
        return replace(metadata, extra={**metadata.extra, **txns.extra(self.options.txn)})

    def _publish(
        self,
        metadata: CommitMetadata,
        payload: bytes,
        revert: RevertClustering | None,
        begun: tuple[CommittedTxns, str, Rebase | None],
        known: Timeline | None,
    ) -> Instant:
        """Under the lock: check, then create the completed file. ``known`` is the timeline as it is now
        (None: list it). ``begun``: the map of versions and the table's schema the write began with, and
        how to rebase that schema; ``payload``, ``metadata`` encoded, is encoded again if either changed."""
        assert self.instant is not None and self.heartbeat is not None
        timeline = known if known is not None else self.table.timeline()
        mine = timeline.get(self.instant_time)
        if mine is not None and mine.is_completed and self.lock.requested and self._handed is not None:
            self.lock.note_published(None)  # a holder before published it: later ones skip the request
            self.table.published(mine, self._handed.payload)
            return mine
        if mine is None or mine.is_completed:
            raise LeaseLostError(
                f"instant {self.instant_time} of table {self.table.name} is no longer pending "
                f"({'gone: rolled back by someone' if mine is None else 'already completed'}); not publishing"
            )
        if self.table.being_rolled_back(timeline, self.instant_time):
            raise LeaseLostError(
                f"instant {self.instant_time} of table {self.table.name} was judged failed and is being "
                "rolled back (its heartbeat expired); not publishing"
            )
        # the commits completed meanwhile that no sketch ruled out, read at once; a newest one ruled out
        # carries the map of versions this write began with, and a schema its sketch's digest tells
        if known is None:
            self.turns.clear_listed(timeline.completed_since(self.begin_timeline.completed_times))
        cleared = self.turns.cleared
        candidates = completed_between(self.table, self.begin_timeline, timeline, cleared)
        newest = timeline.data_commits().in_completion_order()[-1:]
        carried, schema, rebase = begun
        current, recorded = carried, metadata.schema
        if newest and newest[0].requested_time not in cleared:
            current = CommittedTxns.of(self.table, timeline)
            recorded, schema = recorded_schema(
                self.table, self.instant_time, timeline, schema, recorded, rebase
            )
        elif newest:
            schema = sketch.carried_by(self.table, newest[0]).schema
        if self.options.txn is not None:  # another process of the application may have committed it
            current.check(self.options.txn, self.table.name, self.instant_time)
        if current != carried or recorded != metadata.schema:
            metadata = replace(self._with_txns(metadata, current), schema=recorded)
            payload = metadata.to_bytes(self.action)
        reverted = self._check_conflicts(metadata, timeline, revert, candidates)
        self.heartbeat.check()
        if known is None:
            # Listing and reading took round trips since the lock was taken. With a timeline known
            # current, only local work came after the lock's own listing, which showed it held.
            self.lock.check_held()
        reached(Step.CHECKED, self.instant_time)
        completion = self.table.completion_time(timeline, self.instant_time, int(self.options.clock() * 1000))
        done = self.instant.transition(State.COMPLETED, completion)
        self._publishing = True
        # the lock's release names the commit, now that it exists; a turn that publishes a second commit
        # (a revert, the schema) is not noted: later holders list the timeline. A noted one publishes
        # the commits of writers queued behind it too, their requests read beside its own (:mod:`.group`).
        alter = hidden(timeline, self.instant_time, metadata.schema, schema)
        noted = reverted is None and not alter
        requests: list[tuple[int, bytes]] = []

        def read_requests() -> None:
            requests.extend(self.lock.requests())

        try:
            create = partial(self.table.storage.create_if_absent, self.table.instant_path(done), payload)
            created = beside(self.table.storage, create, read_requests if noted else None)
        except StorageError as exc:
            raise CommitStateUnknownError(
                f"publishing {done} on {self.table.uri} failed midway ({exc}); reload the timeline and "
                f"look for instant {self.instant_time} before retrying"
            ) from exc
        if not created:
            raise CommitStateUnknownError(f"{done} already exists on {self.table.uri}; reload the timeline")
        self.table.published(done, payload)
        self.instant = done
        if noted:  # once this commit is reported: the commits of waiters follow it
            own, clock, heartbeat = (done, metadata), self.options.clock, self.heartbeat
            self._then = partial(
                standing.publish_waiting, self.table, self.lock, timeline, own, requests, clock, heartbeat
            )
        if reverted is not None:
            reverted.publish(self.table, metadata, int(self.options.clock() * 1000))
        elif alter:
            reached(Step.RECORDING_SCHEMA, self.instant_time)
            now, carries = int(self.options.clock() * 1000), {TXNS_KEY: metadata.extra[TXNS_KEY]}
            publish_schema(self.table, self.lock, now, metadata.schema, carries)
        return done

    def _release_lock(self) -> None:
        """Release the lock; a failure only delays the next writer until the lock expires."""
        try:
            self.lock.release()
        except CowriteError as exc:
            log.warning("could not release the lock of %s (it expires by itself): %s", self.table, exc)

    # -- abort -----------------------------------------------------------------------------------
    def abort(self, cause: BaseException | None = None) -> None:
        """Give up: delete the files this write created and mark the instant failed for the rollback."""
        instant = self.instant.requested_time if self.instant else None
        reached(Step.ABORTING, instant, cause=type(cause).__name__ if cause else None)
        if self.heartbeat is not None:
            self.heartbeat.mark_aborted(abort_reason_of(cause))
        if self.planned is not None and not (self.instant and self.instant.is_completed):
            for path in own_files(self.planned, self.instant_time):
                try:
                    self.table.storage.delete(path)
                except CowriteError as exc:  # best effort: the rollback finds them from the plan
                    log.warning("could not delete %s after abort: %s", path, exc)
        self._release_lock()
