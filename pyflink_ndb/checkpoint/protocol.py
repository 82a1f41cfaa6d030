"""The epoch protocol of one subtask (DESIGN.md, decision 4).

* epoch = epoch offset + Flink checkpoint id (the offset is 0 unless a fresh start resumed
  a namespace; the bridge keeps it in Flink's operator state);
* :meth:`EpochProtocol.snapshot` writes every dirty entry as the checkpoint's epoch and
  returns when it is durable;
* :meth:`EpochProtocol.complete` writes the commit marker and collects garbage;
* :meth:`EpochProtocol.restore` rolls back what never completed and empties tiers 1-2.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyflink_ndb.checkpoint.gc import VersionLedger
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import CheckpointError, NamespaceInUseError, ValueTooLargeError
from pyflink_ndb.stores.base import StateStore, now_ms
from pyflink_ndb.tiers.table import TieredTable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubtaskScope:
    """What identifies a subtask's share of the state."""

    operator: str
    subtask_index: int
    key_group_start: int
    key_group_end: int
    job_id: str = ""


def fresh_start_conflict(store: StateStore, options: NdbStateOptions, operator: str,
                         committed: int) -> NamespaceInUseError:
    """The error of a fresh start on a namespace with committed state (policy `fail`)."""
    return NamespaceInUseError(
        f"Namespace {options.namespace!r} in {store.describe()} already holds committed "
        f"state of operator {operator!r} (latest epoch {committed}) and this job starts "
        "without a checkpoint or savepoint. Restore the job from its checkpoint/savepoint "
        "(execution.savepoint.path), or set state.backend.ndb.on-fresh-start to `resume` "
        f"(continue from epoch {committed}) or `truncate` (delete it), or use another "
        "state.backend.ndb.namespace.")


def check_fresh_start(store: StateStore, options: NdbStateOptions, operator: str) -> None:
    """Raise :class:`NamespaceInUseError` when a fresh start would fail (see `on-fresh-start`).

    The client calls this when it builds a job without a savepoint to restore, so that the
    error is seen at once instead of in every restart of every subtask.
    """
    committed = store.latest_committed_epoch(operator)
    if committed is not None and options.on_fresh_start == "fail":
        raise fresh_start_conflict(store, options, operator, committed)


class EpochProtocol:
    """Snapshot, commit, abort, restore and garbage collection for one subtask."""

    def __init__(self, store: StateStore, table: TieredTable, options: NdbStateOptions,
                 scope: SubtaskScope, clock_ms: Callable[[], int] = now_ms) -> None:
        self.store = store
        self.table = table
        self.options = options
        self.scope = scope
        self.clock_ms = clock_ms
        self.epoch_offset = 0
        self.restored_epoch: int | None = None
        self.ledger = VersionLedger()
        self._ttl_states: set[int] = set()
        self._invalidated: set[int] | None = None
        self._json_of: Callable[[int, bytes], str | None] = lambda sid, value: None
        self.completed = 0

    def set_json_renderer(self, json_of: Callable[[int, bytes], str | None]) -> None:
        self._json_of = json_of

    def add_ttl_state(self, state_id: int) -> None:
        self._ttl_states.add(state_id)

    # -- restore --------------------------------------------------------------------------
    def restore(self, restored_checkpoint_id: int | None,
                restored_epoch_offset: int | None) -> None:
        """Bring tier 3 to the restored checkpoint (or a fresh start) before any record.

        :raises NamespaceInUseError: a fresh start found committed state and
            `on-fresh-start` is `fail`.
        """
        s = self.scope
        state_ids = self.store.state_ids(s.operator)
        self.table.clear()
        if restored_checkpoint_id is not None:
            self.epoch_offset = restored_epoch_offset or 0
            epoch = self.epoch_offset + restored_checkpoint_id
            if self.store.is_invalidated(s.operator, epoch):
                raise CheckpointError(
                    f"Savepoint/checkpoint {restored_checkpoint_id} (epoch {epoch}) of "
                    f"operator {s.operator!r} can no longer be restored: the job restored an "
                    "older checkpoint after it was taken, which rolled its state back in "
                    f"{self.store.describe()}. Restore a later checkpoint or savepoint.")
            self._invalidate_savepoints_after(epoch)
            removed = self.store.rollback_after(state_ids, s.key_group_start,
                                                s.key_group_end, epoch)
            # The restored checkpoint completed, even if its notification was lost.
            self.store.commit_epoch(s.operator, epoch, job_id=s.job_id)
            if s.subtask_index == 0:
                self.store.delete_commit_markers(s.operator, after_epoch=epoch)
            self.restored_epoch = epoch
            log.info("pyflink-ndb %s/%d restored epoch %d (checkpoint %d), rolled back %d rows",
                     s.operator, s.subtask_index, epoch, restored_checkpoint_id, removed)
            return
        # A fresh start of the same job (a restart with checkpointing off, or before its
        # first checkpoint) re-reads its input: what it committed before is not state.
        committed = self.store.latest_committed_epoch(s.operator, exclude_job=s.job_id)
        if s.subtask_index == 0:
            self.store.delete_job_markers(s.operator, s.job_id)
        if committed is None:
            # Only leftovers of attempts that never completed a checkpoint: not state.
            self._invalidate_savepoints_after(-1)
            self.store.delete_all(state_ids, s.key_group_start, s.key_group_end)
            self.epoch_offset = 0
            return
        policy = self.options.on_fresh_start
        if policy == "fail":
            raise fresh_start_conflict(self.store, self.options, s.operator, committed)
        if policy == "truncate":
            self._invalidate_savepoints_after(-1)
            self.store.delete_all(state_ids, s.key_group_start, s.key_group_end)
            if s.subtask_index == 0:
                self.store.delete_commit_markers(s.operator)
            self.epoch_offset = 0
            return
        self._invalidate_savepoints_after(committed)
        removed = self.store.rollback_after(state_ids, s.key_group_start, s.key_group_end,
                                            committed)
        # New epochs must not collide with any epoch named by a marker, pin or mark.
        self.epoch_offset = max(committed, self.store.highest_marked_epoch(s.operator) or 0)
        self.restored_epoch = committed
        log.info("pyflink-ndb %s/%d resumed epoch %d, rolled back %d rows", s.operator,
                 s.subtask_index, committed, removed)

    def _invalidate_savepoints_after(self, epoch: int) -> None:
        """Savepoints newer than `epoch` lose their rows in the coming roll-back: mark them,
        so that restoring one later fails loudly instead of reading wrong state. (Subtask 0
        does it for all; a known limit, see README "Savepoints".)"""
        if self.scope.subtask_index != 0:
            return
        lost = self.store.invalidate_savepoints_after(self.scope.operator, epoch)
        if lost:
            log.warning("pyflink-ndb %s: rolling back to epoch %d invalidates savepoints at "
                        "epochs %s", self.scope.operator, epoch, lost)

    def prefetch(self, state_ids: Sequence[int]) -> int:
        """Eager restore: copy the subtask's newest versions into tiers 1-2 (clean)."""
        s = self.scope
        count = 0
        for state_id, key_group, ukey, version in self.store.scan_key_groups(
                state_ids, s.key_group_start, s.key_group_end):
            if not version.tombstone:
                self.table.preload(state_id, ukey, key_group, version.value,
                                   version.expires_at_ms)
                count += 1
        return count

    # -- checkpoints ----------------------------------------------------------------------
    def epoch_of(self, checkpoint_id: int) -> int:
        return self.epoch_offset + checkpoint_id

    def snapshot(self, checkpoint_id: int, is_savepoint: bool = False) -> int:
        """Write every dirty entry as epoch `offset + checkpoint_id`; durable on return.

        :returns: rows written.
        :raises ValueTooLargeError: a value exceeds `value.max-bytes` or an encoded key
            exceeds the store's key limit (nothing written).
        :raises CheckpointError: the store failed; the checkpoint must fail.
        """
        epoch = self.epoch_of(checkpoint_id)
        if self._invalidated is None:
            self._invalidated = set(self.store.invalidated_epochs(self.scope.operator))
        if epoch in self._invalidated:
            # A restore rolled this epoch back earlier; this checkpoint re-uses it.
            self.store.clear_invalidation(self.scope.operator, epoch)
            self._invalidated.discard(epoch)
        rows = self.table.dirty_rows(self._json_of)
        try:
            self.store.write_epoch(epoch, rows, self.options.value_max_bytes)
        except ValueTooLargeError:
            raise
        except Exception as err:
            raise CheckpointError(
                f"Checkpoint {checkpoint_id} (epoch {epoch}) could not be written to "
                f"{self.store.describe()}: {err}") from err
        for row in rows:
            self.ledger.record((row.key_group, row.state_id, row.ukey), epoch, row.tombstone)
        self.table.mark_clean()
        if is_savepoint:
            # Pin now: Flink notifies completion of a savepoint only on stop-with-savepoint.
            self.store.commit_epoch(self.scope.operator, epoch, is_savepoint=True,
                                    job_id=self.scope.job_id)
        return len(rows)

    def complete(self, checkpoint_id: int) -> None:
        """Commit marker for the checkpoint, then garbage collection."""
        epoch = self.epoch_of(checkpoint_id)
        self.store.commit_epoch(self.scope.operator, epoch, job_id=self.scope.job_id)
        self.completed += 1
        self.collect_garbage()

    def abort(self, checkpoint_id: int) -> None:
        """Nothing to undo: the rows stay part of this attempt's history and the next
        completed checkpoint covers them; only a restore rolls back."""
        log.info("pyflink-ndb %s/%d: checkpoint %d aborted", self.scope.operator,
                 self.scope.subtask_index, checkpoint_id)

    def final_flush(self) -> int:
        """Bounded input without checkpointing: write and commit one final epoch."""
        latest = self.store.latest_committed_epoch(self.scope.operator) or 0
        checkpoint_id = max(latest, self.restored_epoch or 0) + 1 - self.epoch_offset
        written = self.snapshot(checkpoint_id)
        self.complete(checkpoint_id)
        return written

    def protected_epochs(self) -> tuple[list[int], int, int | None]:
        """(protected epochs, latest completed epoch, keep-from epoch) from the markers.

        Flink retains the last `checkpoints.retained` completed checkpoints, but may skip
        the notification of a checkpoint that another one completes right after: such a
        checkpoint has no marker. So every version at or above the oldest retained marker
        is kept (keep-from), which covers any unmarked checkpoint in between.
        """
        markers = self.store.committed_epochs(self.scope.operator)
        checkpoints = sorted({e for e, sp in markers if not sp})
        savepoints = [e for e, sp in markers if sp]
        retained = checkpoints[-(self.options.checkpoints_retained or 1):]
        latest = checkpoints[-1] if checkpoints else -1
        keep_from = retained[0] if retained else None
        return sorted(set(retained + savepoints)), latest, keep_from

    def collect_garbage(self) -> int:
        """Delete versions no retained checkpoint or savepoint needs, and expired rows;
        subtask 0 also prunes commit markers older than the retained ones."""
        protected, latest, keep_from = self.protected_epochs()
        deletions = self.ledger.collect(protected, latest, keep_from)
        removed = 0
        if deletions:
            removed += self.store.delete_versions(deletions)
        if self._ttl_states:
            s = self.scope
            removed += self.store.delete_expired(sorted(self._ttl_states), s.key_group_start,
                                                 s.key_group_end, self.clock_ms())
        if self.scope.subtask_index == 0 and keep_from is not None:
            self.store.prune_commit_markers(self.scope.operator, keep_from)
        return removed
