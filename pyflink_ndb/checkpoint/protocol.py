"""The checkpoint protocol of one subtask attempt (docs/protocol.md).

* :meth:`CheckpointProtocol.open` claims the subtask's key groups under a new branch whose
  lineage comes from the restored snapshot's tokens (or from `on-fresh-start`), before
  any record; it reads and deletes no state row;
* :meth:`CheckpointProtocol.snapshot` (Flink's synchronous phase) freezes the dirty set and
  returns the token for Flink's union list state; the background writer
  (:mod:`pyflink_ndb.checkpoint.writer`) then writes every frozen entry as version
  `branch << 32 | checkpoint id`, fenced, and inserts the snapshot row last, which makes
  it restorable; the bridge's asynchronous phase completes when that is durable;
* :meth:`CheckpointProtocol.complete` has the writer mark the snapshot completed, move what
  readers see, apply retention, collect garbage and run a bounded batch of cleanup.

Threads: the task thread calls every public method; the writer thread runs the store work
(`_write_epoch`, `_complete_job`, `_abort_job` and the garbage collection under them) on
a connection of its own (`write_store`). Restore (:meth:`open`, :meth:`prefetch`) runs on
the task thread before the writer has any job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import secrets
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain

from pyflink_ndb.checkpoint.gc import Deletion, EntryRef, VersionLedger
from pyflink_ndb.checkpoint.writer import (
    WRITER_PACE,
    WRITER_PACE_WITH_PROCESS,
    BackgroundWriter,
    Job,
    Outcome,
    Preempted,
    WriteCancelled,
)
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.cpu_pin import usable_cpus
from pyflink_ndb.errors import (
    CheckpointError,
    FencedError,
    NamespaceInUseError,
    ValueTooLargeError,
)
from pyflink_ndb.serialization.values import PLAIN_JSON, JsonRenderer
from pyflink_ndb.stores.base import (
    COMPLETED,
    KIND_CHECKPOINT,
    KIND_FINAL,
    KIND_SAVEPOINT,
    PENDING,
    BranchOrigin,
    Fence,
    SnapshotRow,
    StateStore,
    WriteRow,
    left_to_the_user,
    now_ms,
    restored_by_other_jobs,
)
from pyflink_ndb.stores.lineage import (
    MAX_EPOCH,
    Descriptor,
    Lineage,
    OwnerMap,
    Ranges,
    Token,
    complement,
    fresh_lineage,
    in_ranges,
    lineage_from_tokens,
    normalize,
    own_range,
    subtract,
    version_of,
)
from pyflink_ndb.stores.render_process import STALL_SECONDS, Rendered, RenderProcess
from pyflink_ndb.tiers import handover
from pyflink_ndb.tiers.table import FrozenEpoch, TieredTable

log = logging.getLogger(__name__)

#: Epoch of the final flush of a bounded run without checkpointing.
FINAL_EPOCH = 1
#: Background cleanup statements per completed checkpoint.
CLEANUP_STATEMENTS_PER_CHECKPOINT = 64
#: Rows of the parent attempt's versions adopted for garbage collection per checkpoint.
ADOPT_ROWS_PER_CHECKPOINT = 5_000
#: Seconds that cleanup and adoption may spend per garbage-collection run.
BACKGROUND_SECONDS_PER_CHECKPOINT = 0.25
#: Entries of the ledger's pending set one garbage-collection run looks at; a pass over
#: them all goes on in further runs, each behind any checkpoint write.
GC_ENTRIES_PER_RUN = 20_000
#: Versions deleted between two yields of a garbage-collection run (where a closing
#: subtask stops it and a checkpoint job preempts it); version reads yield before each
#: statement.
GC_ENTRIES_PER_YIELD = 1_000
#: Makes a :class:`Deletion` from a 4-tuple without the named tuple's `__new__` in Python
#: (one per superseded version, on the writer thread: 1.6 µs each that way, 0.3 this).
_deletion: Callable[[tuple[int, int, bytes, int]], Deletion] = \
    partial(tuple.__new__, Deletion)  # type: ignore[assignment]


@dataclass(frozen=True)
class SubtaskScope:
    """What identifies a subtask attempt's share of the state."""

    operator: str
    subtask_index: int
    key_group_start: int
    key_group_end: int
    job_id: str = ""
    attempt: int = 0
    #: A restore at job submission in Flink's CLAIM mode (`execution.state-recovery.
    #: claim-mode: CLAIM`): the job owns the restored snapshot, and its retention
    #: subsumes it (as Flink deletes it). False (NO_CLAIM, Flink's default; LEGACY): the
    #: snapshot stays the user's, kept until `pyflink-ndb release`
    #: (:meth:`CheckpointProtocol._left_to_the_user`).
    claims_restored: bool = False
    #: This attempt restores the retained checkpoint the job was submitted with
    #: (`BindInfo.restores_at_submission`), not one the job took itself: a new run even
    #: where both runs have the same job id (a fixed job id).
    restores_at_submission: bool = False
    #: The job keeps its checkpoints when it ends (Flink's `execution.checkpointing.
    #: externalized-checkpoint-retention` RETAIN_ON_CANCELLATION or
    #: DELETE_ON_CANCELLATION): recorded in the branch's origin, so that later jobs'
    #: retention leaves them to the user (:func:`~pyflink_ndb.stores.base.left_to_the_user`).
    retains_checkpoints: bool = False


def _after_first(between: Callable[[], None]) -> Callable[[], None]:
    """`between` for every call but the first: a collection run does at least one
    statement (an adoption scan, a version read, a batch of deletions: each remembered
    when done) before a checkpoint job can preempt it, so runs preempted at every chance
    still finish their pass."""
    first = [True]

    def pause() -> None:
        if first[0]:
            first[0] = False
            return
        between()
    return pause


def _kept(rows: Iterable[WriteRow], into: list[WriteRow]) -> Iterator[WriteRow]:
    """`rows`, each also appended to `into` as it is taken: the write process takes an
    epoch's rows as it writes them, and the ledger needs the ones it took."""
    for row in rows:
        into.append(row)
        yield row


def _no_pause() -> None:
    """The `between` of work that runs inline (nothing to yield to)."""


def fresh_start_conflict(store: StateStore, options: NdbStateOptions, operator: str,
                         committed: Descriptor) -> NamespaceInUseError:
    """The error of a fresh start on a namespace with committed state (policy `fail`)."""
    who = f"operator {operator!r}"
    if re.fullmatch(r"[0-9a-f]{32}", operator):
        who += (" (the Flink operator ID of a switched operator, which Flink derives from "
                "its uid; the CLI's --operator takes the uid too)")
    return NamespaceInUseError(
        f"Namespace {options.namespace!r} in {store.describe()} already holds committed "
        f"state of {who} (latest completed checkpoint "
        f"{committed.checkpoint_id}) and this job starts without pyflink-ndb state to restore "
        "for it (no checkpoint or savepoint, or one that holds none for this operator). "
        "Restore the job from its checkpoint/savepoint (execution.state-recovery.path, "
        "formerly execution.savepoint.path; `flink run -s`), or set "
        "state.backend.ndb.on-fresh-start to `resume` (continue from that checkpoint) or "
        "`truncate` (start over; the old state is released), or use another "
        "state.backend.ndb.namespace.")


def check_fresh_start(store: StateStore, options: NdbStateOptions, operator: str) -> None:
    """Raise :class:`NamespaceInUseError` when a fresh start would fail (see `on-fresh-start`).

    The client calls this when it builds a job without a savepoint to restore, so that the
    error is seen at once instead of in every restart of every subtask.
    """
    row = store.read_operator(operator)
    if row is not None and row.committed is not None and options.on_fresh_start == "fail":
        raise fresh_start_conflict(store, options, operator, row.committed)


class CheckpointProtocol:
    """Claim, snapshot, commit, abort, garbage collection and cleanup for one attempt.

    :param store: the task thread's store (restore, and reads of the tiers).
    :param table: the subtask's tiered table.
    :param options: resolved options (`write.async`, `write.max-pending-bytes`, ...).
    :param scope: the subtask attempt.
    :param clock_ms: processing-time clock for TTL.
    :param write_store: a second connection to the same store for the background writer;
        None: the store work runs inline on the task thread (synchronous flush).
    :param on_durable: called (on the writer thread) with a checkpoint id once its epoch is
        durable and restorable.
    :param on_failed: called with a checkpoint id and a message when its write failed.
    """

    def __init__(self, store: StateStore, table: TieredTable, options: NdbStateOptions,
                 scope: SubtaskScope, clock_ms: Callable[[], int] = now_ms, *,
                 write_store: StateStore | None = None,
                 on_durable: Callable[[int], None] | None = None,
                 on_failed: Callable[[int, str], None] | None = None) -> None:
        self.store = store
        #: The store the writer's jobs use (the task thread's one when inline).
        self.wstore = write_store if write_store is not None else store
        self.writer = BackgroundWriter(
            f"pyflink-ndb-writer-{scope.operator[:12]}-{scope.subtask_index}",
            options.write_max_pending_bytes, on_durable, on_failed,
            inline=write_store is None)
        #: Frozen epochs whose write job has not reported yet, by checkpoint id.
        self._in_flight: dict[int, FrozenEpoch] = {}
        #: The latest failed writes, by checkpoint id: what failed them (the root failure
        #: for the writes it poisoned). For LocalSubtask.wait_durable; bounded.
        self.failed_writes: dict[int, BaseException] = {}
        #: Entries taken back from failed writes into a later epoch (total).
        self.entries_taken_back = 0
        #: A garbage-collection run is queued (they are coalesced).
        self._gc_queued = False
        #: The entries the current garbage-collection pass has yet to look at.
        self._gc_todo: list[tuple[int, int, bytes]] = []
        #: Adoption and cleanup (with TTL deletes) owed: once per completed checkpoint, in
        #: the first garbage-collection run after it, not in every run of a pass (a pass
        #: of many chunks, or a run preempted by a checkpoint job and queued again, would
        #: otherwise repeat their budgets).
        self._adopt_due = False
        self._cleanup_due = False
        #: Totals for metrics and logs (written by the writer thread, read anywhere).
        self.entries_written = 0
        self.bytes_written = 0
        self.epochs_written = 0
        self.epochs_failed = 0
        self.last_flush_ms = 0.0
        self.last_sync_ms = 0.0
        self.last_dirty_entries = 0
        self.restore_ms = 0.0
        self.table = table
        table.track_epochs = options.local_recovery
        #: Entries of a failed attempt's tier 2 this attempt took over (`local.recovery`),
        #: and those it deleted from it as changed after the restored checkpoint (None: no
        #: take-over).
        self.taken_over: tuple[int, int] | None = None
        self.options = options
        self.scope = scope
        self.clock_ms = clock_ms
        self.ledger = VersionLedger(max(200_000, options.cache_max_entries * 4))
        self._ttl_states: set[int] = set()
        self._json_renderers: Mapping[int, JsonRenderer] = {}
        #: Renders epochs off the interpreter lock (`write.render-process`; created at the
        #: first epoch written).
        self.render_process: RenderProcess | None = None
        #: The option that asks for it was logged as not applying here.
        self._process_refused = False
        #: `write.process` resolved on this TaskManager (`auto`: by its usable CPUs).
        cpus = usable_cpus()
        self.write_process = options.write_process_wanted(cpus)
        self.writer.pace = self._writer_pace
        if options.write_process == "auto" and self._child_applies:
            log.info("pyflink-ndb %s/%d: write.process auto: %s (this TaskManager may use "
                     "%g CPUs; on from 2)", scope.operator, scope.subtask_index,
                     "on" if self.write_process else "off", cpus)
        self.branch = 0
        #: The random identity of this attempt's branch (its origin's `nonce`, and every
        #: token's): a restore checks it against the branch row it finds (:class:`Token`).
        self.nonce = secrets.token_hex(8)
        #: The run of the job this attempt belongs to (:meth:`_run_of`).
        self.run = ""
        self.lineage: Lineage | None = None
        self.fence: Fence | None = None
        #: Epoch of this branch's latest completed checkpoint (0: none yet).
        self.latest_completed = 0
        #: The snapshot this attempt restored (None: fresh start without state).
        self.restored: Descriptor | None = None
        self.completed = 0
        self.rows_written = 0
        self.cleanup_rows = 0
        self._cleaned: dict[tuple[int, int, int], Ranges] = {}
        #: Kind of each snapshot this attempt took, by checkpoint id.
        self._kinds: dict[int, str] = {}
        #: The synchronous savepoint of a stop-with-savepoint this attempt took, and
        #: whether Flink completed it (then a normal close records the stop).
        self._stop_savepoint: int | None = None
        self._stop_completed = False
        #: Version ranges of the parent attempt whose entries garbage collection has yet
        #: to look at: (kg_start, kg_end, lo, hi) -> per state id the scan cursor.
        self._adopt: dict[tuple[int, int, int, int], dict[int, tuple[int, int, bytes] | None]] = {}
        self._adopted_done: set[tuple[int, int, int, int, int]] = set()
        self._lineages: dict[int, Lineage] = {}
        #: Per branch of the operator, what retention needs of its origin. Loaded once
        #: per attempt, at its first garbage collection (:meth:`_left_to_the_user`):
        #: branch rows change only when a stop-with-savepoint ends their subtask
        #: (:meth:`StateStore.record_end`), which only the listing reads.
        self._origins: dict[int, BranchOrigin] = {}

    def set_json_renderers(self, renderers: Mapping[int, JsonRenderer]) -> None:
        """How each state's values are rendered for the JSON column (by state id; read
        when each epoch is rendered, so states registered later are included)."""
        self._json_renderers = renderers

    def _json_of(self, state_id: int, value: bytes) -> str | None:
        return self._json_renderers.get(state_id, PLAIN_JSON)(value)

    def add_ttl_state(self, state_id: int) -> None:
        self._ttl_states.add(state_id)

    # -- open: claim the key groups -------------------------------------------------------
    def open(self, restored_tokens: Sequence[Token] | None) -> None:
        """Claim this subtask's key groups before any record.

        :param restored_tokens: the tokens of the restored snapshot (Flink's union list
            state; all subtasks' tokens), or None on a fresh start.
        :raises CheckpointError: a restored snapshot is no longer restorable.
        :raises NamespaceInUseError: a fresh start found committed state and
            `on-fresh-start` is `fail`.
        """
        s = self.scope
        started = time.perf_counter()
        self.table.clear()
        origin: dict[str, object]
        reset = False
        tokens: list[Token] | None = None
        restored: Descriptor | None = None
        if restored_tokens:
            tokens = list(restored_tokens)
            restored = Descriptor(tuple(sorted(tokens, key=lambda t: t.kg_start)))
            origin = {"kind": "restore", "tokens": restored.to_json()}
            if s.claims_restored:
                origin["claim"] = True
            if s.restores_at_submission:
                origin["submission"] = True
        else:
            row = self.store.read_operator(s.operator)
            committed = row.committed if row is not None else None
            policy = self.options.on_fresh_start
            if committed is None:
                origin = {"kind": "fresh"}
            elif policy == "fail":
                raise fresh_start_conflict(self.store, self.options, s.operator, committed)
            elif policy == "resume":
                tokens = list(committed.parts)
                restored = committed
                origin = {"kind": "resume", "tokens": committed.to_json()}
            else:
                origin = {"kind": "truncate"}
                reset = True
        snapshots = self.store.list_snapshots(s.operator)
        mine = [t for t in tokens or () if t.kg_end >= s.key_group_start
                and t.kg_start <= s.key_group_end]
        origin["nonce"] = self.nonce
        if s.retains_checkpoints:
            origin["retains"] = True
            origin["retained"] = self.options.checkpoints_retained or 1
        # The restored tokens' branch rows, read once: their lineages (the new lineage)
        # and origins (identity, run). After a failover, every branch's origin (which
        # previous owners' pending snapshots are this run's).
        parent_rows = self.store.load_branches({t.branch for t in mine}) if mine else {}
        self._lineages.update((b, row.lineage) for b, row in parent_rows.items())
        origins = (self.store.branch_origins(s.operator) if s.attempt > 0 and not reset
                   else {b: BranchOrigin.parse(row.job_id, row.origin)
                         for b, row in parent_rows.items()})
        if tokens is not None:
            self._check_identity(mine, origins)
            self._check_restorable(mine, snapshots)
            parents = self._load_lineages({t.branch for t in mine})
            unnamed = lineage_from_tokens(0, s.key_group_start, s.key_group_end, mine, parents)
        else:
            unnamed = fresh_lineage(0, s.key_group_start, s.key_group_end)
        self.run = origin["run"] = self._run_of(origin, mine, snapshots, origins)

        def abandoned(before: OwnerMap, branch: int, rows: list[SnapshotRow]
                      ) -> list[tuple[int, int]]:
            return self._abandoned(rows, before, reset,
                                   dataclasses.replace(unnamed, branch=branch), origins)

        # One transaction allocates the branch, claims the key groups and forgets the
        # snapshots the claim abandons (StateStore.claim_new_branch: one commit). The
        # stored lineage (what is inherited) does not depend on the branch id. The check
        # covers every part of the restored snapshot, not only this subtask's: the claim
        # makes it what readers see, and retention is decided per subtask (another subtask
        # may have released its part and collected the versions only that part saw; its
        # claim fails, and readers must not see the snapshot meanwhile).
        self.branch, _, _ = self.store.claim_new_branch(
            s.operator, s.key_group_start, s.key_group_end, unnamed.to_json(), origin,
            s.job_id, s.subtask_index, s.attempt, restored, reset=reset,
            check=(lambda rows: self._check_restorable(tokens or (), rows)) if mine else None,
            abandoned=abandoned)
        self.lineage = dataclasses.replace(unnamed, branch=self.branch)
        self._lineages[self.branch] = self.lineage
        self.fence = Fence(s.operator, self.branch, s.key_group_start, s.key_group_end)
        self.restored = restored
        self.table.visibility = self.lineage.head
        for seg in self.lineage.segments:
            if seg.inherited:
                # The parent's own versions there: it may have died before collecting
                # them (lost notifications, entries kept for retention). Adopted in the
                # background (collect_garbage); older ancestors' were the parent's job.
                lo, hi = seg.inherited[-1]
                self._adopt[(seg.kg_start, seg.kg_end, lo, hi)] = {}
        if self.table.local is not None:
            lineage = self.lineage
            # Nothing inherited there: every version of these key groups is this attempt's
            # own, and tier 2 holds all of them (docs/protocol.md, "Visibility").
            self.table.store_has_nothing = lambda kg: not lineage.segment(kg).inherited
        self._take_over(mine)
        self.restore_ms = (time.perf_counter() - started) * 1000
        log.info("pyflink-ndb %s/%d (attempt %d) claimed key groups %d-%d as branch %d (%s) "
                 "in %.0f ms", s.operator, s.subtask_index, s.attempt, s.key_group_start,
                 s.key_group_end, self.branch, origin["kind"], self.restore_ms)
        if restored is not None and s.subtask_index == 0 and restored_by_other_jobs(
                {self.branch: BranchOrigin.parse(s.job_id, json.dumps(origin))}, snapshots):
            taken_by = {r.job_id for r in snapshots
                        if (r.branch, r.epoch) in {(t.branch, t.epoch) for t in restored.parts}}
            log.info("pyflink-ndb %s: restored checkpoint %d of job %s without claiming it "
                     "(Flink's claim mode NO_CLAIM or LEGACY): it stays restorable until "
                     "`pyflink-ndb release` (listed by `pyflink-ndb savepoints --all`)",
                     s.operator, restored.checkpoint_id, ", ".join(sorted(taken_by)))

    def _take_over(self, mine: Sequence[Token]) -> None:
        """Task-local recovery (`local.recovery`): take over the tier 2 that the attempt
        which took the restored snapshot parked when it failed or was cancelled
        (:mod:`pyflink_ndb.tiers.handover`), when it ran in this interpreter with the same
        key groups; what it changed after the snapshot is deleted from it
        (:meth:`TieredTable.adopt`). Its branch's nonce, which the token carries, names
        it: a tier of another namespace, database or run is never taken."""
        s = self.scope
        if not self.options.local_recovery or self.table.local is None or len(mine) != 1:
            return
        token = mine[0]
        if (token.kg_start, token.kg_end) != (s.key_group_start, s.key_group_end):
            return
        parked = handover.take(token.nonce)
        if parked is None:
            return
        if parked.operator != s.operator or (parked.kg_start, parked.kg_end) != (
                s.key_group_start, s.key_group_end):
            parked.local.destroy(wait=False)
            return
        dropped = self.table.adopt(parked, token.epoch)
        if dropped is None:
            log.info("pyflink-ndb %s/%d: the failed attempt's tier 2 does not track "
                     "checkpoint %d any more: not taken over", s.operator, s.subtask_index,
                     token.epoch)
            return
        self.taken_over = (parked.local.entry_count(), dropped)
        log.info("pyflink-ndb %s/%d: took over the failed attempt's tier 2 for checkpoint "
                 "%d (local.recovery): about %d entries, %d changed after it deleted",
                 s.operator, s.subtask_index, token.epoch, self.taken_over[0], dropped)

    def park_tier(self) -> bool:
        """The attempt ends without a normal close (failure, cancel): leave tier 2 for
        the next attempt (`local.recovery`); True when parked (the table no longer holds
        it). Not while the writer may still read it."""
        if not self.options.local_recovery or self.writer.alive or self.branch == 0:
            return False
        s = self.scope
        parked = self.table.park(s.operator, s.key_group_start, s.key_group_end)
        if parked is None:
            return False
        handover.park(self.nonce, parked)
        return True

    def _check_restorable(self, tokens: Sequence[Token], snapshots: Sequence[SnapshotRow]
                          ) -> None:
        known = {(r.branch, r.epoch) for r in snapshots}
        for token in tokens:
            if (token.branch, token.epoch) not in known:
                raise CheckpointError(
                    f"The restored snapshot (checkpoint {token.epoch} of branch "
                    f"{token.branch}, key groups {token.kg_start}-{token.kg_end}) of operator "
                    f"{self.scope.operator!r} can no longer be restored from "
                    f"{self.store.describe()}: it was subsumed by later checkpoints, "
                    "released, aborted, or the namespace was truncated, and its versions may "
                    "be gone. Restore a snapshot that is still restorable: `pyflink-ndb "
                    f"savepoints --all --url URL --namespace {self.options.namespace}` lists "
                    "them, with the checkpoint id and job of each (URL: "
                    "state.backend.ndb.url, with the password if it needs one).")

    def _check_identity(self, mine: Sequence[Token], origins: Mapping[int, BranchOrigin]
                        ) -> None:
        """Each of this subtask's restored tokens that carries its branch's nonce names a
        branch of this namespace with that nonce: not a branch of the same number in
        another database's or namespace's history, nor in this namespace's before it was
        dropped and used again (branch ids count from 1 in each). Every token is some
        subtask's own, so every one is checked. Checked before the snapshot rows: a
        snapshot of another history most often has no row of its numbers here, and
        "subsumed or released" would send its user to the wrong place.

        :param origins: :meth:`StateStore.branch_origins` of at least `mine`'s branches.
        :raises CheckpointError: a token's branch has another nonce, or none."""
        for token in mine:
            if token.nonce is None:
                continue  # written before the nonce: not checked
            origin = origins.get(token.branch)
            if origin is None or origin.nonce != token.nonce:
                made = "" if origin is None else (
                    f" (its branch {token.branch} there was made by job {origin.job_id})")
                raise CheckpointError(
                    f"The restored snapshot (checkpoint {token.epoch} of branch "
                    f"{token.branch}) of operator {self.scope.operator!r} was not taken in "
                    f"{self.store.describe()} namespace {self.store.namespace!r}{made}: "
                    "the job points at another database or namespace than the job that "
                    "took it, or the namespace was dropped and used again since. Restore "
                    "it with the state.backend.ndb.url and namespace of the job that took "
                    "it; if that namespace was dropped, its state is gone: start without "
                    "the checkpoint (or from a later one).")

    def _run_of(self, origin: Mapping[str, object], mine: Sequence[Token],
                snapshots: Sequence[SnapshotRow], origins: Mapping[int, BranchOrigin]) -> str:
        """The run of the job that this attempt's branch belongs to
        (:attr:`~pyflink_ndb.stores.base.BranchOrigin.run`): a failover (a restore of this
        job's own checkpoint, not the one it was submitted with) continues the run of the
        branches it restores; anything else starts a run, named after the job and where it
        started, so that the attempts of one run agree (a failover before the run's first
        completed checkpoint restores its starting point again)."""
        s = self.scope
        keys = {(t.branch, t.epoch) for t in mine}
        if origin["kind"] == "restore" and not s.restores_at_submission and keys and {
                r.job_id for r in snapshots if (r.branch, r.epoch) in keys} == {s.job_id}:
            runs = {origins[b].run for b, _ in keys if b in origins}
            if len(runs) == 1:
                return runs.pop()
        start = json.dumps([s.job_id, origin["kind"], origin.get("tokens")])
        return hashlib.sha1(start.encode()).hexdigest()[:16]

    def _abandoned(self, snapshots: Sequence[SnapshotRow], before: OwnerMap, reset: bool,
                   lineage: Lineage, origins: Mapping[int, BranchOrigin]
                   ) -> list[tuple[int, int]]:
        """Snapshots (branch, epoch) that a claim with `lineage` makes unrestorable: with
        truncate every snapshot of the operator; after a task failover (attempt >= 1) the
        pending checkpoints of the previous owners (`before`) of these key groups that the
        new lineage does not contain and that belong to this run (`origins`: every
        branch's) — a failover restores the run's latest completed checkpoint, so Flink
        never completed them. A previous owner of another run (this job's first attempt
        failed before it claimed) may have a pending checkpoint Flink completed and keeps."""
        s = self.scope
        if reset:
            return [(r.branch, r.epoch) for r in snapshots]
        if s.attempt == 0:
            # A new job (or a JobManager failover) may have restored an older snapshot:
            # a pending one of the previous owners may have completed without telling
            # anybody; it stays restorable, as a side branch, until released.
            return []
        previous = {br for a, b, br in before
                    if b >= s.key_group_start and a <= s.key_group_end}
        return [(r.branch, r.epoch) for r in snapshots
                if r.branch in previous and r.status == PENDING
                and r.kind != KIND_SAVEPOINT and not self._in_lineage(r, lineage)
                and (o := origins.get(r.branch)) is not None and o.run == self.run]

    def _in_lineage(self, snap: SnapshotRow, lineage: Lineage) -> bool:
        """True when the snapshot's own versions are visible to `lineage`'s head in the
        key groups they share, i.e. it is an ancestor state of that branch."""
        a = max(snap.kg_start, self.scope.key_group_start)
        b = min(snap.kg_end, self.scope.key_group_end)
        if a > b:
            return False
        return in_ranges(version_of(snap.branch, snap.epoch), lineage.head(a))

    def _load_lineages(self, branches: set[int]) -> dict[int, Lineage]:
        missing = branches - self._lineages.keys()
        if missing:
            for bid, row in self.wstore.load_branches(missing).items():
                self._lineages[bid] = row.lineage
        absent = branches - self._lineages.keys()
        if absent:
            raise CheckpointError(f"Branches {sorted(absent)} of operator "
                                  f"{self.scope.operator!r} are missing from "
                                  f"{self.store.describe()}.")
        return {b: self._lineages[b] for b in branches}

    def prefetch(self, state_ids: Sequence[int]) -> int:
        """Eager restore: copy the subtask's visible versions into tiers 1-2 (clean)."""
        s = self.scope
        assert self.lineage is not None
        count = 0
        for state_id, key_group, ukey, version in self.store.scan_key_groups(
                state_ids, s.key_group_start, s.key_group_end, self.lineage.head):
            if not version.tombstone:
                self.table.preload(state_id, ukey, key_group, version.value,
                                   version.expires_at_ms)
                count += 1
        return count

    # -- checkpoints ----------------------------------------------------------------------
    def _require_open(self) -> Fence:
        if self.fence is None:
            raise CheckpointError("The checkpoint protocol was used before open().")
        return self.fence

    def snapshot(self, checkpoint_id: int, is_savepoint: bool = False,
                 kind: str | None = None, ends_job: bool = False) -> Token:
        """Flink's synchronous phase: freeze the dirty set as checkpoint `checkpoint_id` and
        hand it to the background writer; O(1) in the dirty entries (it waits only when
        `write.max-pending-bytes` is reached: back-pressure). Inline, the epoch is written
        before this returns.

        :param ends_job: the savepoint is synchronous: a stop-with-savepoint's, after which
            the job finishes (Flink's `SavepointType.isSynchronous`). Once Flink completed
            it, a normal :meth:`close` records the stop (:meth:`StateStore.record_end`).

        :returns: the token to store in Flink's union list state.
        :raises FencedError: a newer attempt owns these key groups (seen by an earlier job).
        :raises CheckpointError: the id is out of range; inline: the store failed.
        :raises ValueTooLargeError: inline: an oversized key or value (nothing written).
        """
        fence = self._require_open()
        self.settle()
        if not 0 < checkpoint_id <= MAX_EPOCH:
            raise CheckpointError(f"Checkpoint id {checkpoint_id} is outside 1..{MAX_EPOCH}.")
        kind = kind or (KIND_SAVEPOINT if is_savepoint else KIND_CHECKPOINT)
        started = time.perf_counter()
        frozen = self.table.freeze()
        self.table.note_epoch(checkpoint_id, frozen)
        self.last_dirty_entries = len(frozen.entries)
        self._in_flight[checkpoint_id] = frozen
        self._kinds[checkpoint_id] = kind
        if ends_job and kind == KIND_SAVEPOINT:
            self._stop_savepoint, self._stop_completed = checkpoint_id, False
        self.last_sync_ms = (time.perf_counter() - started) * 1000
        job = Job(lambda: self._write_epoch(fence, checkpoint_id, kind, frozen),
                  checkpoint_id, frozen.approx_bytes, fail_fast=True,
                  name=f"write of checkpoint {checkpoint_id}")
        try:
            self.writer.submit(job)
        except BaseException:
            self.settle(raise_fenced=False)  # inline failure: the entries go back
            raise
        if self.writer.inline:
            self.settle()
        self.last_sync_ms = (time.perf_counter() - started) * 1000
        return Token(self.branch, checkpoint_id, self.scope.key_group_start,
                     self.scope.key_group_end, self.nonce)

    def _write_epoch(self, fence: Fence, checkpoint_id: int, kind: str,
                     frozen: FrozenEpoch) -> int:
        """Writer thread: render and write `frozen`, then the snapshot row (last: the
        epoch becomes restorable only once every row is committed)."""
        version = version_of(self.branch, checkpoint_id)
        started = time.perf_counter()
        between = None if self.writer.inline else self.writer.check_cancelled
        process = self._render_process() if self.write_process else None
        rows: list[WriteRow] = []
        if process is None:
            rows, slices = self._render(frozen, version, between)
        else:  # rendered and written by the write process, read as it writes
            slices = None
        try:
            if process is not None:
                written = process.write(
                    self.wstore, fence, version,
                    _kept(self.table.rows_of(frozen, None, between), rows),
                    self._json_renderers, self._json_of, self.table.key_json, between,
                    self.options.value_max_bytes, stall_s=self._process_stall_s,
                    connections=self.options.write_process_connections)
            else:
                written = self.wstore.write_versions(
                    fence, version, rows, self.options.value_max_bytes, between,
                    rendered=None if slices is None else chain.from_iterable(slices))
            if between is not None:
                between()
            self.wstore.insert_snapshot(fence, checkpoint_id, kind, self.scope.job_id)
        except BaseException as err:
            # Some rows may be committed without the ledger knowing them: the epoch's
            # entries are read from the store before garbage collection, and (to be
            # safe) so is every new entry from now on. (With the write process, `rows`
            # holds the rows read so far: the others were never sent.)
            self.ledger.doubt((row[0], row[1], row[2]) for row in rows)
            self.ledger.forgot = True
            if isinstance(err, (ValueTooLargeError, CheckpointError, WriteCancelled)) or not \
                    isinstance(err, Exception):
                raise
            raise CheckpointError(
                f"Checkpoint {checkpoint_id} of {self.scope.operator!r} could not be "
                f"written to {self.wstore.describe()}: {err}") from err
        finally:
            if slices is not None:
                slices.close()
        lineage = self.lineage
        assert lineage is not None
        self.ledger.record_epoch(
            rows, version, lambda key_group: not lineage.segment(key_group).inherited)
        size = sum(len(row.ukey) + (len(row.value) if row.value else 0) for row in rows)
        self.rows_written += written
        self.entries_written += len(rows)
        self.bytes_written += size
        self.epochs_written += 1
        self.last_flush_ms = (time.perf_counter() - started) * 1000
        log.info("pyflink-ndb %s/%d: checkpoint %d durable: %d entries, %d rows, %d bytes "
                 "in %.0f ms (%s)", self.scope.operator, self.scope.subtask_index,
                 checkpoint_id, len(rows), written, size, self.last_flush_ms,
                 "written in the synchronous phase" if self.writer.inline else
                 f"synchronous phase {self.last_sync_ms:.2f} ms")
        return written

    def _render(self, frozen: FrozenEpoch, version: int, between: Callable[[], None] | None
                ) -> tuple[list[WriteRow], Generator[Rendered, None, None] | None]:
        """Writer thread: the rows of `frozen`, and, when the render process renders them
        (`write.render-process`), the generator of their SQL literals slice by slice
        (:meth:`RenderProcess.slices`; the caller closes it); None: the store renders
        them from the rows' JSON, made here."""
        process = self._render_process()
        if process is None:
            return self.table.render(frozen, self._json_of, between), None
        rows = self.table.render(frozen, None, between)
        return rows, process.slices(version, rows, self._json_renderers, self._json_of,
                                    self.table.key_json, between)

    @property
    def _process_stall_s(self) -> float:
        """Seconds a store call of the write process may go without a byte from it: the
        child retries as the store does, so at least the retry deadline plus one more
        try's socket timeout (the deadline bounds when the last try starts; found by a
        breaker: with a socket timeout over 60 s a partition was blamed on the child)."""
        return (self.options.db_retry_deadline_ms + self.options.db_socket_timeout_ms) / 1000 \
            + STALL_SECONDS

    @property
    def _child_applies(self) -> bool:
        """A render or write process can serve this subtask: a store that renders SQL
        literals (MySQL protocol), written by the background writer (`write.async`)."""
        return self.wstore.renders_literals and not self.writer.inline

    def _render_process(self) -> RenderProcess | None:
        """The render process, created at the first epoch that may use it; None without
        the option, on a store that renders no literals, inline or after it gave up."""
        if self.render_process is None:
            wanted = self.options.write_render_process or self.write_process
            if not (wanted and self._child_applies):
                # `write.process: auto` where it does not apply says nothing: it is the
                # default; an option set to true does.
                explicit = self.options.write_render_process or \
                    self.options.write_process == "true"
                if explicit and not self._process_refused:
                    self._process_refused = True
                    log.warning(
                        "pyflink-ndb %s/%d: state.backend.ndb.write.%s is ignored: it "
                        "applies to MySQL-protocol stores with write.async: true (this "
                        "subtask writes %s)", self.scope.operator, self.scope.subtask_index,
                        "process" if self.options.write_process == "true"
                        else "render-process",
                        "in the synchronous phase" if self.writer.inline
                        else f"to {self.wstore.describe()}")
                return None
            self.render_process = RenderProcess(
                f"{self.scope.operator}/{self.scope.subtask_index}",
                kind="write" if self.write_process else "render")
        return self.render_process if self.render_process.usable else None

    def _writer_pace(self) -> float:
        """The writer's pace (:attr:`BackgroundWriter.pace`): a plain yield while the
        write process runs its statements (:attr:`RenderProcess.delegates`), else
        :data:`WRITER_PACE` (no child yet, `write.render-process` alone, a child given
        up, a store it cannot take, an epoch or deletion it fell back on)."""
        process = self.render_process
        if self.write_process and process is not None and process.delegates:
            return WRITER_PACE_WITH_PROCESS
        return WRITER_PACE

    def settle(self, raise_fenced: bool = True) -> None:
        """Task thread, at every hook: take the writer's outcomes. A durable epoch stops
        answering reads from memory; failed epochs (the failed write and the later ones,
        which fail with it) go back into the current epoch, so the next checkpoint writes
        them; a fenced writer fails the task.

        :raises FencedError: a job found that a newer attempt owns the key groups.
        """
        outcomes = self.writer.take_outcomes()
        if self.writer.failure() is not None or any(
                o.error is not None and o.job.fail_fast for o in outcomes):
            self.writer.wait_writes_settled()
            outcomes += self.writer.take_outcomes()
            failed = self._handle(outcomes)
            if failed:
                self.entries_taken_back += self.table.take_back(failed)
            self.writer.clear_failure()
        else:
            self._handle(outcomes)
        if raise_fenced:
            for o in outcomes:
                if isinstance(o.error, FencedError):
                    raise o.error

    def _handle(self, outcomes: Sequence[Outcome]) -> list[FrozenEpoch]:
        failed = []
        for o in outcomes:
            cid = o.job.checkpoint_id
            if not o.job.fail_fast or cid is None:
                if o.error is not None and not isinstance(o.error, FencedError):
                    log.warning("pyflink-ndb %s/%d: %s failed: %s", self.scope.operator,
                                self.scope.subtask_index, o.job.name, o.error)
                continue
            frozen = self._in_flight.pop(cid, None)
            if frozen is None:
                continue
            if o.error is None:
                self.table.release(frozen)
            else:
                self._kinds.pop(cid, None)
                self.epochs_failed += 1
                self.failed_writes[cid] = self.writer.failure() or o.error
                while len(self.failed_writes) > 64:
                    del self.failed_writes[next(iter(self.failed_writes))]
                failed.append(frozen)
                log.warning("pyflink-ndb %s/%d: checkpoint %d failed in the background "
                            "(%s); its %d entries go into the next checkpoint",
                            self.scope.operator, self.scope.subtask_index, cid, o.error,
                            len(frozen.entries))
        return failed

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until the writer finished every job, then :meth:`settle`; False on timeout.

        :raises FencedError: see :meth:`settle`.
        """
        done = self.writer.wait_idle(timeout_s)
        self.settle()
        return done

    def complete(self, checkpoint_id: int) -> None:
        """Flink completed checkpoint `checkpoint_id` (so its epoch is durable: Flink
        completes a checkpoint only after every asynchronous phase finished). The writer
        marks it, moves readers to it (not for a savepoint), applies retention, collects
        garbage and cleans up a bounded batch, after the writes queued before.

        :raises FencedError: an earlier job found a newer attempt owning the key groups.
        """
        fence = self._require_open()
        self.settle()
        kind = self._kinds.pop(checkpoint_id, None)
        if checkpoint_id == self._stop_savepoint:
            self._stop_completed = True
        if kind is not None and kind != KIND_SAVEPOINT:
            self.table.forget_epochs_through(checkpoint_id)
        self.writer.submit(Job(lambda: self._complete_job(fence, checkpoint_id, kind),
                               name=f"completion of checkpoint {checkpoint_id}"))
        if self.writer.inline:
            self.settle()

    def _complete_job(self, fence: Fence, checkpoint_id: int, kind: str | None) -> None:
        self.wstore.mark_completed(self.scope.operator, [(self.branch, checkpoint_id)], fence)
        if kind is not None and kind != KIND_SAVEPOINT:
            # Readers and `resume` follow checkpoints only: Flink never fails over to a
            # savepoint, so neither does what a fresh start continues from.
            self.latest_completed = max(self.latest_completed, checkpoint_id)
            self.wstore.advance_committed(fence, checkpoint_id)
        self.completed += 1
        self._adopt_due = self._cleanup_due = True
        self._queue_gc(fence)

    def _queue_gc(self, fence: Fence) -> None:
        """Queue one garbage-collection run as a background job: it runs when no
        checkpoint write or completion waits (those go first), one at a time."""
        if self._gc_queued:
            return
        self._gc_queued = True
        # skip_at_drain: a subtask that ends normally (stop-with-savepoint, end of input)
        # leaves the rest of the pass to the attempt that restores its snapshot, which
        # adopts every entry this attempt wrote (docs/protocol.md, "Garbage collection").
        self.writer.submit(Job(lambda: self._gc_job(fence), name="garbage collection",
                               background=True, preemptible=True, skip_at_drain=True))

    def _gc_job(self, fence: Fence) -> None:
        """One run: the next chunk of this pass over the entries pending at its start (a
        pass starts with the first run after a completion and ends when the chunks are
        done; entries kept for retention stay pending for the next pass)."""
        self._gc_queued = False
        if not self._gc_todo:
            # Unsorted (each chunk is sorted): sorting half a million entries at once holds
            # the GIL for most of a second.
            self._gc_todo = list(self.ledger.pending)
        chunk = sorted(self._gc_todo[-GC_ENTRIES_PER_RUN:])
        del self._gc_todo[-GC_ENTRIES_PER_RUN:]
        try:
            self.collect_garbage(chunk,
                                 None if self.writer.inline else self.writer.check_cancelled,
                                 adopt=self._adopt_due, cleanup=self._cleanup_due)
        except Preempted:
            # A checkpoint job waits: it goes first, this chunk comes again after it (its
            # collected entries are no longer pending and are skipped then).
            self._gc_todo.extend(chunk)
            self._queue_gc(fence)
            raise
        if self._gc_todo and not self.writer.inline:
            self._queue_gc(fence)  # the pass goes on when the writer is idle again

    def abort(self, checkpoint_id: int) -> None:
        """An aborted savepoint releases its pin (after its write, if that is still
        queued). An aborted checkpoint's rows stay: they are this branch's history and
        the next snapshot's delta builds on them."""
        fence = self._require_open()
        self.settle()
        self._kinds.pop(checkpoint_id, None)
        self.writer.submit(Job(lambda: self._abort_job(fence, checkpoint_id),
                               name=f"abort of checkpoint {checkpoint_id}"))
        log.info("pyflink-ndb %s/%d: checkpoint %d aborted", self.scope.operator,
                 self.scope.subtask_index, checkpoint_id)

    def _abort_job(self, fence: Fence, checkpoint_id: int) -> None:
        snaps = [r for r in self.wstore.list_snapshots(self.scope.operator)
                 if r.branch == self.branch and r.epoch == checkpoint_id]
        if snaps and snaps[0].kind == KIND_SAVEPOINT:
            self.wstore.delete_snapshots(self.scope.operator, [(self.branch, checkpoint_id)],
                                         fence)

    def final_flush(self) -> int:
        """Bounded input without checkpointing: write and commit one final epoch; returns
        when it is committed.

        :raises CheckpointError: the write failed.
        """
        before = self.rows_written
        self.snapshot(FINAL_EPOCH, kind=KIND_FINAL)
        self.writer.wait_idle()
        if self._in_flight.get(FINAL_EPOCH) is not None and self.writer.failure() is not None:
            error = self.writer.failure()
            self.settle()
            raise CheckpointError(f"The final flush of {self.scope.operator!r} failed: {error}")
        self.complete(FINAL_EPOCH)
        self.drain()
        return self.rows_written - before

    def close(self, drain: bool = False) -> None:
        """Stop the writer: with `drain`, after it finished its checkpoint writes and
        completions (at most the retry deadline plus 10 s). Background work is dropped
        even then: the pages of a prefetch (a stop-with-savepoint need not wait for a
        prefetch of the whole state) and garbage collection, which stops at its next
        yield (the attempt that restores this one's snapshot adopts the entries it wrote
        and collects their superseded versions; if none ever does, `pyflink-ndb gc`
        does: docs/protocol.md, "Garbage collection"); a background statement in flight is
        interrupted. Without `drain` queued jobs are dropped (their checkpoints fail) and
        a running one stops at its next yield, its statement in flight interrupted at once
        (:meth:`BackgroundWriter.close`).
        Nothing partial becomes visible (the snapshot row of an epoch is written after all
        its rows).

        With `drain`, after a stop-with-savepoint whose savepoint Flink completed, the
        branch records that the stop ended it (:meth:`_record_end`) before the writer stops."""
        if drain and self._stop_completed and self.fence is not None:
            fence, savepoint = self.fence, self._stop_savepoint
            assert savepoint is not None
            self.writer.submit(Job(lambda: self._record_end(fence, savepoint),
                                   name="record of the stop"))
        if drain and not self.writer.wait_idle(self.options.db_retry_deadline_ms / 1000 + 10,
                                               foreground_only=True):
            log.warning("pyflink-ndb %s/%d: the background writer did not finish its queue "
                        "at close; the rest is dropped", self.scope.operator,
                        self.scope.subtask_index)
        # The writer's own connection (write.async) may be interrupted: no other thread
        # uses it. The task thread's store (write.async false) is not.
        # Without `drain` (a cancel or failure) the statement in flight is interrupted at
        # once: Flink deploys the next attempt only after this close.
        self.writer.close(interrupt=self._interrupt if self.wstore is not self.store
                          else None, cancel=not drain)
        if self.render_process is not None:
            self.render_process.close()

    def _record_end(self, fence: Fence, savepoint: int) -> None:
        """Writer: record in this branch's origin that stop-with-savepoint `savepoint`
        ended this subtask (:meth:`StateStore.record_end`). Flink deletes a finished job's
        retained checkpoints (`CheckpointProperties`), but the job may still fail while
        stopping (another task's failure): the record only tells the listing
        (:func:`~pyflink_ndb.stores.base.stopped_runs`), and retention keeps the
        checkpoints. A failure is logged; the close goes on."""
        try:
            self.wstore.record_end(fence, savepoint)
        except Exception as err:  # storage only: never fail a normal end for it
            log.warning("pyflink-ndb %s/%d: could not record that stop-with-savepoint %d "
                        "ended the subtask (the listing does not say so): %s",
                        self.scope.operator, self.scope.subtask_index, savepoint, err)

    def _interrupt(self) -> None:
        """End the writer's statement in flight, on its own connection and on the write
        process's (the server ends that one: :meth:`RenderProcess.interrupt`)."""
        if self.render_process is not None:
            self.render_process.interrupt(self.wstore)
        self.wstore.interrupt()

    # -- retention, garbage collection, cleanup -----------------------------------------
    def protected_snapshots(self) -> list[SnapshotRow]:
        """The snapshots whose versions must stay, after applying retention to the
        lineage (which deletes the snapshot rows that fell out of it).

        Retention runs per key group: the lineage snapshots that cover one key group form
        one chain (ancestors have lower branch ids), in which everything from the
        (retained + 1)-th newest completed one on stays — Flink's own retained
        checkpoints are among them even when notifications were lost, and readers keep
        one more. A row is dropped when every key group of this subtask that it covers
        drops it (after a rescale one row can cover several chains' key groups).
        """
        s = self.scope
        assert self.lineage is not None
        retained = (self.options.checkpoints_retained or 1) + 1  # +1 for readers (P4)
        every = self.wstore.list_snapshots(s.operator)
        rows = [r for r in every
                if r.kg_end >= s.key_group_start and r.kg_start <= s.key_group_end]
        # A snapshot another job restored, or another job's checkpoint that Flink keeps,
        # counts in its chain (it bounds what stays) but is never dropped by retention, as
        # a savepoint (_left_to_the_user).
        unclaimed = self._left_to_the_user(every)
        # A savepoint stays until released, unless a job restored it in CLAIM mode: that
        # job owns it and Flink deletes it once subsumed (a breaker's find on a cluster:
        # `flink run -s SAVEPOINT -claimMode CLAIM` left it pinned).
        claimed = {key for o in self._origins.values() for key in o.claimed}
        candidates = [r for r in rows
                      if r.kind != KIND_SAVEPOINT or (r.branch, r.epoch) in claimed]
        edges = self._edges([self.lineage], candidates)
        dropped: dict[tuple[int, int], bool] = {}
        for a in edges[:-1]:
            head = self.lineage.head(a)
            chain = sorted((r for r in candidates if r.kg_start <= a <= r.kg_end
                            and in_ranges(version_of(r.branch, r.epoch), head)),
                           key=lambda r: version_of(r.branch, r.epoch))
            completed = [r for r in chain if r.status == COMPLETED]
            bound = (version_of(completed[-retained].branch, completed[-retained].epoch)
                     if len(completed) > retained else None)
            for r in chain:
                key = (r.branch, r.epoch)
                here = (bound is not None and version_of(r.branch, r.epoch) < bound
                        and key not in unclaimed)
                dropped[key] = dropped.get(key, True) and here
        gone = {key for key, drop in dropped.items() if drop}
        if gone:
            self.wstore.delete_snapshots(s.operator, sorted(gone), self.fence)
            rows = [r for r in rows if (r.branch, r.epoch) not in gone]
        return rows

    def _left_to_the_user(self, snapshots: Sequence[SnapshotRow]) -> set[tuple[int, int]]:
        """The snapshots (branch, epoch) that this job's retention leaves to the user
        (:func:`~pyflink_ndb.stores.base.left_to_the_user`): a snapshot another job (or a
        new run of a fixed job id, `SubtaskScope.restores_at_submission`) restored in
        NO_CLAIM mode, and the checkpoints of another job that keeps its checkpoints when
        it ends. Flink never deletes those for this job, so they stay restorable until
        `pyflink-ndb release`. Before 2026-12-07 this job's checkpoints subsumed them: a
        second restore of one retained checkpoint failed (a new user's trial), and so did a
        restore of a cancelled job's older retained checkpoint once a later job ran on
        (a breaker's). A restore in CLAIM mode (`execution.state-recovery.claim-mode:
        CLAIM`) makes the snapshot the restoring job's: its retention subsumes it as Flink
        deletes it. Another job's checkpoints where that job kept none when it ended
        (`NO_EXTERNALIZED_CHECKPOINTS`, Flink's default; or a branch made before this was
        recorded) are subsumed as before.

        The branches' origins are read once per attempt (job id and origin only): a
        branch made later by another job claims these key groups and fences this attempt,
        and sibling subtasks' branches restore the same descriptor as this one's (its
        origin holds every subtask's tokens)."""
        if not self._origins:
            self._origins = self.wstore.branch_origins(self.scope.operator)
        return left_to_the_user(self._origins, snapshots, self.run)

    def _views(self, key_group: int, protected: Sequence[SnapshotRow]) -> list[Ranges]:
        assert self.lineage is not None
        lineages = self._load_lineages({r.branch for r in protected})
        views = [self.lineage.head(key_group)]
        for r in protected:
            if r.kg_start <= key_group <= r.kg_end:
                views.append(lineages[r.branch].at(key_group, r.epoch))
        return views

    def collect_garbage(self, refs: Sequence[tuple[int, int, bytes]] | None = None,
                        between: Callable[[], None] | None = None, adopt: bool = True,
                        cleanup: bool = True) -> int:
        """Delete versions no protected snapshot needs, expired rows, and a bounded batch
        of abandoned versions; returns rows removed.

        :param refs: the pending entries to look at (default: every pending one).
        :param between: called between statements, from the second on (the background
            writer's :meth:`~BackgroundWriter.check_cancelled`: a closing subtask stops a
            run there instead of waiting for it, a queued checkpoint job preempts it).
        :param adopt: first adopt a bounded batch of the parent attempt's entries.
        :param cleanup: delete expired rows (TTL) and a bounded batch of abandoned
            versions after the collection. The background runs do both once per
            completed checkpoint."""
        pause = _after_first(between) if between is not None else _no_pause
        fence = self._require_open()
        assert self.lineage is not None
        protected = self.protected_snapshots()
        keep_above = version_of(self.branch, self.latest_completed)
        removed = 0
        state_ids = self.wstore.state_ids(self.scope.operator)
        if adopt:
            self._adopt_some(state_ids, ADOPT_ROWS_PER_CHECKPOINT, pause)
            self._adopt_due = False
        pending = sorted(self.ledger.pending) if refs is None else [
            r for r in refs if r in self.ledger.pending]
        unknown = self.ledger.unknown(pending)
        # One statement per yield: a closing subtask waits for at most one read.
        step = min(GC_ENTRIES_PER_YIELD, self.wstore.max_or_terms)
        for start in range(0, len(unknown), step):
            pause()
            part = unknown[start:start + step]
            for ref, stored in self.wstore.read_versions(part).items():
                self.ledger.learn(ref, stored)
        # No yield while deciding (CPU only, about 2 µs per entry): a run stopped here
        # would have to decide again, and a run stopped at each of its yields must still
        # get on (see _after_first).
        dropped, done = self.ledger.decide(
            pending, lambda kg: self._views(kg, protected), keep_above)
        removed += self._delete_versions(fence, dropped, pause)
        self.ledger.pending.difference_update(done)
        if not cleanup:
            return removed
        if self._ttl_states:
            for seg in self.lineage.segments:
                removed += self.wstore.delete_expired(
                    fence, sorted(self._ttl_states), seg.kg_start, seg.kg_end,
                    self.lineage.head(seg.kg_start), self.clock_ms())
        removed += self.clean_up(protected, state_ids, pause=pause)
        self._cleanup_due = False
        return removed

    def _delete_versions(self, fence: Fence,
                         dropped: Sequence[tuple[EntryRef, Sequence[int]]],
                         pause: Callable[[], None]) -> int:
        """Delete the `dropped` versions of their entries, about
        :data:`GC_ENTRIES_PER_YIELD` versions per yield; the ledger forgets each batch's
        versions only once the batch is deleted, so a run stopped at a yield (a
        preempting checkpoint job, a close) loses nothing and a later run does not
        delete the same versions again."""
        removed = 0
        batch: list[Deletion] = []
        refs: list[tuple[EntryRef, Sequence[int]]] = []
        process = self._render_process() if self.write_process else None
        for n, (ref, drop) in enumerate(dropped, 1):
            batch.extend(_deletion((ref[0], ref[1], ref[2], v)) for v in drop)
            refs.append((ref, drop))
            if len(batch) >= GC_ENTRIES_PER_YIELD or n == len(dropped):
                pause()
                if process is not None:  # deleted by the write process
                    removed += process.delete_exact(
                        self.wstore, fence, batch, self.writer.check_closing,
                        self._process_stall_s)
                else:
                    removed += self.wstore.delete_exact(fence, batch)
                self.ledger.forget_many(refs)
                batch, refs = [], []
        return removed

    def _adopt_some(self, state_ids: Sequence[int], budget: int,
                    pause: Callable[[], None] = _no_pause) -> int:
        """Put up to `budget` entries that the parent attempt wrote into the ledger's
        pending set (unknown versions: collect_garbage reads them), so that versions it
        left behind are collected even when nobody writes those entries again; `pause`
        runs before each statement (see :meth:`collect_garbage`)."""
        if not self._adopt:
            return 0
        adopted = 0
        limit = min(self.wstore.write_batch_rows * 2, budget)
        deadline = time.monotonic() + BACKGROUND_SECONDS_PER_CHECKPOINT
        for (a, b, lo, hi), cursors in list(self._adopt.items()):
            for sid in state_ids:
                if (a, b, lo, hi, sid) in self._adopted_done:
                    continue
                while adopted < budget and time.monotonic() < deadline:
                    pause()
                    rows = self.wstore.scan_entries(sid, a, b, lo, hi, cursors.get(sid), limit)
                    for _, kg, ukey in rows:
                        self.ledger.pending.add((kg, sid, ukey))
                    adopted += len(rows)
                    if len(rows) < limit:
                        self._adopted_done.add((a, b, lo, hi, sid))
                        break
                    cursors[sid] = rows[-1]
                if adopted >= budget or time.monotonic() >= deadline:
                    return adopted
            if all((a, b, lo, hi, sid) in self._adopted_done for sid in state_ids):
                del self._adopt[(a, b, lo, hi)]
        return adopted

    def _edges(self, lineages: Sequence[Lineage], rows: Sequence[SnapshotRow]) -> list[int]:
        """Sorted key groups of this subtask's range where a segment of `lineages` or the
        range of a snapshot of `rows` starts or ends (exclusive ends): between two edges
        every key group sees the same."""
        s = self.scope
        cuts = {s.key_group_start, s.key_group_end + 1}
        for lin in lineages:
            for seg in lin.segments:
                cuts.update((seg.kg_start, seg.kg_end + 1))
        for r in rows:
            cuts.update((r.kg_start, r.kg_end + 1))
        return sorted(c for c in cuts if s.key_group_start <= c <= s.key_group_end + 1)

    def _uniform_intervals(self, protected: Sequence[SnapshotRow]
                           ) -> list[tuple[int, int, list[Ranges]]]:
        """This subtask's key groups cut where any view changes: (kg_start, kg_end,
        views) with the same views for every key group inside."""
        assert self.lineage is not None
        lineages = self._load_lineages({r.branch for r in protected})
        edges = self._edges([self.lineage, *lineages.values()], protected)
        return [(a, b - 1, self._views(a, protected))
                for a, b in zip(edges, edges[1:], strict=False)]

    def clean_up(self, protected: Sequence[SnapshotRow], state_ids: Sequence[int],
                 budget: int = CLEANUP_STATEMENTS_PER_CHECKPOINT,
                 pause: Callable[[], None] = _no_pause) -> int:
        """Delete, in at most `budget` bounded statements, rows of this operator's states
        in this subtask's key groups that neither this branch nor any protected snapshot
        sees (abandoned branches, epochs after a restore point, zombies' writes). One
        statement covers one version gap of one state over key groups that share their
        views; a gap is remembered as clean once a statement deletes less than its limit
        (fencing keeps new rows out of it). `pause` runs before each statement (see
        :meth:`collect_garbage`)."""
        fence = self._require_open()
        limit = self.wstore.delete_limit_rows
        upper = own_range(self.branch)[1]
        removed = 0
        deadline = time.monotonic() + BACKGROUND_SECONDS_PER_CHECKPOINT
        for kg_start, kg_end, views in self._uniform_intervals(protected):
            gaps = complement([r for view in views for r in view], 0, upper)
            for sid in state_ids:
                done = self._cleaned.get((kg_start, kg_end, sid), ())
                for lo, hi in subtract(gaps, done):
                    while True:  # the same gap again while a statement deletes its limit
                        if budget <= 0 or time.monotonic() > deadline:
                            self.cleanup_rows += removed
                            return removed
                        budget -= 1
                        pause()
                        n = self.wstore.delete_range(fence, sid, kg_start, kg_end, lo, hi,
                                                    limit)
                        removed += n
                        if n < limit:
                            break
                    done = normalize(done + ((lo, hi),))
                    self._cleaned[(kg_start, kg_end, sid)] = done
        self.cleanup_rows += removed
        return removed
