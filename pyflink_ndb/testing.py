"""Test helpers shipped with the package: run tiered state without Flink.

:class:`LocalSubtask` builds a subtask backend as the bridge would, with key groups
computed in Python (CRC32, not Flink's hashing: fine for tests of the logic above the
bridge), a controllable clock and a runtime context whose `get_*_state` calls return
tiered states. Crash = drop the object without `snapshot`; restore = a new
`LocalSubtask` with `restored_checkpoint_id`.
"""

from __future__ import annotations

import time
import uuid
import weakref
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyflink.datastream import KeyedProcessFunction

from pyflink_ndb.api.context import TieredRuntimeContext
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.runtime.backend import BindInfo, SubtaskStateBackend
from pyflink_ndb.serialization.keys import encode_key
from pyflink_ndb.stores.base import StateStore
from pyflink_ndb.stores.lineage import Token
from pyflink_ndb.tiers import handover


@dataclass
class ManualClock:
    """A processing-time clock (ms) that only moves when told."""

    now_ms: int = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def key_group_ranges(parallelism: int, max_parallelism: int = 128) -> list[tuple[int, int]]:
    """The key groups (first, last) of each subtask, as Flink's
    `KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex` computes them."""
    return [((i * max_parallelism + parallelism - 1) // parallelism,
             ((i + 1) * max_parallelism - 1) // parallelism) for i in range(parallelism)]


def local_key_group(key: Any, max_parallelism: int = 128) -> int:
    """The key group LocalSubtask gives `key` (CRC32 of its canonical encoding, not
    Flink's hash: fine for tests of the logic above the bridge)."""
    return zlib.crc32(encode_key(key)) % max_parallelism


@dataclass
class _CrcKeyGroups:
    max_parallelism: int
    backend: Any = field(default=None)

    def currentKeyGroup(self) -> int:  # noqa: N802 (the Java method name)
        return zlib.crc32(self.backend.current_key_bytes) % self.max_parallelism


class CheckpointStorage:
    """What Flink keeps of each snapshot for tests without Flink: the tokens every subtask
    stored in the union list state, by checkpoint id (the latest run's, as Flink restores
    the checkpoint of the job that wrote it)."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, int], dict[int, str]] = {}

    def record(self, operator: str, checkpoint_id: int, token_json: str) -> None:
        token = Token.from_json(token_json)
        slot = self._tokens.setdefault((operator, checkpoint_id), {})
        for kg, old in list(slot.items()):
            other = Token.from_json(old)
            if other.kg_end >= token.kg_start and other.kg_start <= token.kg_end:
                del slot[kg]
        slot[token.kg_start] = token_json

    def tokens(self, operator: str, checkpoint_id: int) -> tuple[str, ...]:
        """The tokens of checkpoint `checkpoint_id` (empty when it was never taken)."""
        slot = self._tokens.get((operator, checkpoint_id), {})
        return tuple(slot[k] for k in sorted(slot))


#: Default storage shared by LocalSubtasks that are not given one, per namespace.
_STORAGES: dict[tuple[str, str], CheckpointStorage] = {}


def checkpoint_storage(store: StateStore) -> CheckpointStorage:
    """The :class:`CheckpointStorage` that LocalSubtasks on `store`'s namespace share by
    default (also across store objects, as Flink's checkpoints outlive connections)."""
    return _STORAGES.setdefault((store.describe(), store.namespace), CheckpointStorage())


class LocalSubtask:
    """One subtask's tiered state outside Flink.

    :param store: an opened store (kept open when the subtask closes: tests reuse it).
    :param options: options; `url` is ignored since `store` is given.
    :param operator: operator name (states are registered under it).
    :param restored_checkpoint_id: restore from this checkpoint (None: fresh start).
    :param restored_tokens: the tokens to restore (default: those `storage` recorded for
        `restored_checkpoint_id`).
    :param restored_epoch_offset: the epoch offset of a restored format-1 checkpoint.
    :param storage: where snapshots' tokens are kept (default: one per store).
    :param checkpointing_enabled: False makes `finish()` commit a final epoch.
    :param job_id: the Flink job id; None: a new one, i.e. each LocalSubtask is its own job
        (pass the same id to simulate a restart of one job).
    :param listener: told when each snapshot is durable or failed (as the Java bridge's
        `DurabilityListener`); None: nobody listens.
    :param restore_claim_mode: Flink's claim mode of the restore (`execution.state-recovery.
        claim-mode`, as the bridge reads it): "NO_CLAIM" (default), "CLAIM" or "LEGACY".
    :param restore_path: the job's `execution.state-recovery.path` (as the bridge reads
        it); None: the job was submitted without one.
    :param externalized_retention: the job's `execution.checkpointing.externalized-
        checkpoint-retention` (as the bridge reads it).

    With `write.async` (the default) snapshots are written by a background thread on a
    second connection; :meth:`snapshot` waits for it unless told otherwise.
    """

    def __init__(self, store: StateStore, options: NdbStateOptions | None = None, *,
                 operator: str = "op", subtask_index: int = 0, max_parallelism: int = 128,
                 key_group_start: int = 0, key_group_end: int | None = None,
                 restored_checkpoint_id: int | None = None,
                 restored_tokens: tuple[str, ...] | None = None,
                 restored_epoch_offset: int | None = None,
                 storage: CheckpointStorage | None = None, attempt: int = 0,
                 checkpointing_enabled: bool = True, clock: ManualClock | None = None,
                 local_dir: str | None = None, job_id: str | None = None,
                 listener: Any = None, restore_claim_mode: str = "NO_CLAIM",
                 restore_path: str | None = None,
                 externalized_retention: str = "NO_EXTERNALIZED_CHECKPOINTS") -> None:
        self.clock = clock or ManualClock()
        self.storage = storage or checkpoint_storage(store)
        self.operator = operator
        if restored_tokens is None and restored_checkpoint_id is not None:
            restored_tokens = self.storage.tokens(operator, restored_checkpoint_id)
            if not restored_tokens:
                raise ValueError(
                    f"No snapshot {restored_checkpoint_id} of operator {operator!r} was "
                    "recorded: take it with LocalSubtask.snapshot/checkpoint, or pass "
                    "restored_tokens (() for a checkpoint without pyflink-ndb state).")
        oracle = _CrcKeyGroups(max_parallelism)
        info = BindInfo(
            operator=operator, subtask_index=subtask_index, max_parallelism=max_parallelism,
            key_group_start=key_group_start,
            key_group_end=max_parallelism - 1 if key_group_end is None else key_group_end,
            restored_checkpoint_id=restored_checkpoint_id,
            restored_tokens=tuple(restored_tokens or ()),
            restored_epoch_offset=restored_epoch_offset, attempt=attempt,
            checkpointing_enabled=checkpointing_enabled, local_dir=local_dir,
            job_id=job_id or f"local-{uuid.uuid4().hex[:12]}",
            restore_claim_mode=restore_claim_mode, restore_path=restore_path,
            externalized_retention=externalized_retention)
        self.backend = SubtaskStateBackend(options or NdbStateOptions(), info, oracle,
                                           store=store, clock_ms=self.clock,
                                           listener=listener)
        oracle.backend = self.backend
        self.context = TieredRuntimeContext(_NoRuntimeContext(), self.backend)
        #: The folder given for tier 2 (None: the default).
        self.local_dir = local_dir
        self._stopped = False
        _open_subtasks.add(self)

    def key(self, key: Any) -> LocalSubtask:
        """Make `key` the current key (as Flink does before each record)."""
        self.backend.set_current_key(key)
        return self

    def snapshot(self, checkpoint_id: int, is_savepoint: bool = False,
                 durable: bool = True, ends_job: bool = False) -> str:
        """Snapshot and keep the token in the storage, as Flink would; returns the token.

        :param durable: wait until the background writer made it durable (as Flink waits
            for the asynchronous phase before it acknowledges a checkpoint); False: return
            after the synchronous phase.
        :param ends_job: a stop-with-savepoint's savepoint (with `is_savepoint`): complete
            it, then :meth:`close`, as the job does when it finishes.
        :raises CheckpointError: `durable` and the background write failed.
        """
        token = self.backend.snapshot(checkpoint_id, is_savepoint, ends_job)
        self.storage.record(self.operator, checkpoint_id, token)
        if durable:
            self.wait_durable(checkpoint_id)
        return token

    def wait_durable(self, checkpoint_id: int) -> None:
        """Wait until the write of `checkpoint_id` finished.

        :raises CheckpointError: it failed (its entries went back into the current epoch).
        :raises FencedError: the writer was fenced.
        """
        protocol = self.backend.protocol
        protocol.writer.wait_for(lambda: not protocol.writer.checkpoint_pending(checkpoint_id))
        protocol.settle()
        failure = protocol.failed_writes.pop(checkpoint_id, None)
        if failure is not None:
            raise failure  # what failed the write (the store's error, not a wrapper)

    def checkpoint(self, checkpoint_id: int, complete: bool = True) -> None:
        """Snapshot, then (when `complete`) notify completion and wait for its work."""
        self.snapshot(checkpoint_id)
        if complete:
            self.complete(checkpoint_id)

    def complete(self, checkpoint_id: int, wait: bool = True) -> None:
        """Notify that Flink completed `checkpoint_id`; `wait`: until the background
        writer marked it, moved the readers and collected garbage."""
        self.backend.notify_checkpoint_complete(checkpoint_id)
        if wait:
            self.backend.drain()

    def abort(self, checkpoint_id: int, wait: bool = True) -> None:
        """Notify that Flink aborted `checkpoint_id`; `wait`: until its work is done."""
        self.backend.notify_checkpoint_aborted(checkpoint_id)
        if wait:
            self.backend.drain()

    def crash(self) -> None:
        """Lose tiers 1-2 without any flush and stop the background writer where it is
        (the store stays open for the next attempt)."""
        self._stop(drain=False)

    def close(self) -> None:
        """End normally: the writer finishes its queue, then the tiers and the writer's
        connection are released (the store stays open: tests reuse it)."""
        self._stop(drain=True)

    def _stop(self, drain: bool) -> None:
        if self._stopped:
            return
        self._stopped = True
        _open_subtasks.discard(self)
        self.backend.protocol.close(drain)
        if not drain:  # as SubtaskStateBackend.close: a crash leaves tier 2 to the next
            self.backend.protocol.park_tier()
        self.backend.table.close()
        if self.backend.write_store is not None:
            self.backend.write_store.close()


#: The LocalSubtasks neither closed nor crashed yet (a running background writer keeps an
#: abandoned one alive).
_open_subtasks: weakref.WeakSet[LocalSubtask] = weakref.WeakSet()


def open_subtasks() -> set[LocalSubtask]:
    """The LocalSubtasks of this process that were neither closed nor crashed."""
    return set(_open_subtasks)


def crash_open_subtasks(under: str | None = None,
                        keep: set[LocalSubtask] | None = None) -> int:
    """Crash (:meth:`LocalSubtask.crash`) every LocalSubtask of this process that was
    neither closed nor crashed; for a test's teardown, before it deletes the subtasks'
    local folders. An abandoned subtask keeps its background writer thread and its tier-2
    RocksDB open; a RocksDB whose folder is deleted under it and that is dropped later
    (a garbage collection, anywhere in the process) flushes its memtable into the missing
    folder at close and can wait there for ever, holding the interpreter lock.

    :param under: only those whose `local_dir` is this folder or inside it (None: all).
    :param keep: subtasks to leave open (e.g. those :func:`open_subtasks` listed before
        the test began).
    :returns: how many were crashed.
    """
    left = [t for t in list(_open_subtasks) if t not in (keep or set()) and (
        under is None or (t.local_dir is not None
                          and Path(t.local_dir).resolve().is_relative_to(Path(under).resolve())))]
    for subtask in left:
        subtask.crash()
        # and no tier it parked for a next attempt (`local.recovery`) outlives the folder
        parked = handover.take(subtask.backend.protocol.nonce)
        if parked is not None:
            parked.local.destroy(wait=True)
    return len(left)


class InjectedFailure(RuntimeError):
    """The failure :class:`FailOnceAfterCheckpoint` raises on purpose."""


class FailOnceAfterCheckpoint(KeyedProcessFunction):
    """Wraps a `KeyedProcessFunction` so that its first attempt fails mid-stream.

    On attempt 0 of subtask `subtask`, the first record after at least one checkpoint
    completed and at least `min_records` records were processed raises
    :class:`InjectedFailure` and writes `marker` (so a test can assert the failure
    happened). Until the first checkpoint completes, each record waits `throttle_ms` so
    that a checkpoint can complete mid-stream. With `while_writing`, the failure waits
    (records keep waiting `throttle_ms`) until the background writer is writing an epoch,
    so the task dies with a write in flight. Later attempts run unchanged.

    A module-level class with instance attributes, not a closure: cloudpickle shares a
    dynamic class between the subtasks that unpickle it, closure cells included.
    """

    def __init__(self, function: KeyedProcessFunction, marker: str, min_records: int = 1000,
                 subtask: int = 0, throttle_ms: float = 1.0,
                 while_writing: bool = False) -> None:
        self.function = function
        self.while_writing = while_writing
        self.marker = marker
        self.min_records = min_records
        self.subtask = subtask
        self.throttle_ms = throttle_ms
        self.seen = 0

    def open(self, runtime_context: Any) -> None:
        self.backend = runtime_context.backend
        self.armed = (runtime_context.get_attempt_number() == 0
                      and runtime_context.get_index_of_this_subtask() == self.subtask)
        self.function.open(runtime_context)

    def close(self) -> None:
        self.function.close()

    def process_element(self, value: Any, ctx: Any) -> Any:
        if self.armed:
            self.seen += 1
            writing = self.backend.protocol.writer.writing()
            if self.backend.protocol.completed == 0:
                time.sleep(self.throttle_ms / 1000)
            elif self.seen >= self.min_records and self.while_writing and writing is None:
                time.sleep(self.throttle_ms / 1000)
            elif self.seen >= self.min_records:
                Path(self.marker).write_text(
                    f"failed after {self.seen} records, "
                    f"{self.backend.protocol.completed} checkpoints, keys from "
                    f"records: {self.backend.keys_from_records}, writing checkpoint "
                    f"{writing}\n")
                raise InjectedFailure("injected failure (pyflink_ndb.testing)")
        return self.function.process_element(value, ctx)

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        return self.function.on_timer(timestamp, ctx)


class Throttled(KeyedProcessFunction):
    """Wraps a `KeyedProcessFunction` so that each record first waits `per_record_ms`: keeps
    a short bounded job running long enough to take a savepoint or stop it mid-stream."""

    def __init__(self, function: KeyedProcessFunction, per_record_ms: float) -> None:
        self.function = function
        self.per_record_ms = per_record_ms

    def open(self, runtime_context: Any) -> None:
        self.function.open(runtime_context)

    def close(self) -> None:
        self.function.close()

    def process_element(self, value: Any, ctx: Any) -> Any:
        time.sleep(self.per_record_ms / 1000)
        return self.function.process_element(value, ctx)

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        return self.function.on_timer(timestamp, ctx)


class _NoRuntimeContext:
    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(f"{name} is not available outside Flink")
