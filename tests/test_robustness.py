"""Adversarial robustness tests of the epoch protocol, the tiers and the stores.

Every scenario checks the correctness contract of DESIGN.md: after a crash at any point the
state read after a restore equals the state at the restored checkpoint (nothing lost,
nothing doubled), and bad input fails with a clear pyflink-ndb error instead of silent
corruption. Runs without Flink (:class:`pyflink_ndb.testing.LocalSubtask`).

Tests marked `xfail(strict=True, reason="BUG: ...")` assert the CORRECT behaviour and
demonstrate a bug that is not fixed yet: the fixer removes the mark when the bug is fixed.
"""

from __future__ import annotations

import copy
import enum
import math
import pickle
import socket
import subprocess
import sys
import textwrap
import zlib
from typing import Any

import pytest
from conftest import mysql_connect, unique_namespace
from pyflink.common import Row
from pyflink.common.time import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

from pyflink_ndb.api.context import TieredRuntimeContext
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import (
    CheckpointError,
    NamespaceInUseError,
    SerializationError,
    StoreUnavailableError,
    ValueTooLargeError,
)
from pyflink_ndb.runtime.backend import BindInfo, SubtaskStateBackend
from pyflink_ndb.serialization.keys import MAX_KEY_DEPTH, decode_key, encode_key
from pyflink_ndb.stores import StateStore
from pyflink_ndb.stores.base import CHUNK_BYTES, MAX_UKEY_BYTES
from pyflink_ndb.testing import LocalSubtask, ManualClock

ANY = Types.PICKLED_BYTE_ARRAY()
KEYS = ["a", 1, (2, "x"), b"\x00k", 2.5]


# -- helpers -------------------------------------------------------------------------------
class Job:
    """One attempt of a subtask with a value, a list and a map state."""

    def __init__(self, store: StateStore, options: NdbStateOptions, local_dir: str,
                 restored: int | None = None, offset: int | None = None,
                 **kwargs: Any) -> None:
        self.store = store
        self.t = LocalSubtask(store, options, restored_checkpoint_id=restored,
                              restored_epoch_offset=offset, local_dir=local_dir, **kwargs)
        ctx = self.t.context
        self.value = ctx.get_state(ValueStateDescriptor("value", ANY))
        self.list = ctx.get_list_state(ListStateDescriptor("list", ANY))
        self.map = ctx.get_map_state(MapStateDescriptor("map", ANY, ANY))

    def write(self, key: Any, tag: Any) -> None:
        """A deterministic mix of updates, appends, puts and removes for `key`."""
        self.t.key(key)
        self.value.update((tag, key))
        self.list.add(tag)
        self.map.put(tag, [tag, key])
        self.map.remove(("gone", tag))
        self.map.put(("gone", tag), None)
        self.map.remove(("gone", tag))

    def read(self, key: Any) -> dict[str, Any]:
        self.t.key(key)
        items = list(self.map.items())
        assert len(items) == len({k for k, _ in items}), f"map entry doubled: {items}"
        return {"value": self.value.value(), "list": self.list.get(), "map": dict(items)}

    def read_all(self, keys: list[Any] = KEYS) -> dict[Any, dict[str, Any]]:
        return {k: self.read(k) for k in keys}

    def checkpoint(self, checkpoint_id: int, complete: bool = True) -> None:
        self.t.checkpoint(checkpoint_id, complete=complete)

    def crash(self) -> None:
        self.t.crash()


class Model:
    """Plain-dict model of what :meth:`Job.write` does."""

    def __init__(self) -> None:
        self.state: dict[Any, dict[str, Any]] = {}

    def write(self, key: Any, tag: Any) -> None:
        s = self.state.setdefault(key, {"value": None, "list": [], "map": {}})
        s["value"] = (tag, key)
        s["list"].append(tag)
        s["map"][tag] = [tag, key]

    def view(self, keys: list[Any] = KEYS) -> dict[Any, dict[str, Any]]:
        empty: dict[str, Any] = {"value": None, "list": [], "map": {}}
        return {k: copy.deepcopy(self.state.get(k, empty)) for k in keys}

    def copy(self) -> Model:
        m = Model()
        m.state = copy.deepcopy(self.state)
        return m


def fail_after(store: StateStore, calls: int) -> None:
    """Make the store's state-row writes (`_replace_state_rows`, one statement batch each)
    raise after `calls` successful calls (a crash in the middle of writing an epoch)."""
    original = store._replace_state_rows
    count = {"n": 0}

    def flaky(text: str, rows: Any) -> None:
        if count["n"] >= calls:
            raise OSError("injected: connection reset in the middle of a snapshot")
        count["n"] += 1
        original(text, rows)

    store._replace_state_rows = flaky  # type: ignore[method-assign]


def writes_of(job: Job) -> StateStore:
    """The store the job's checkpoints are written with (the background writer's own
    connection with `write.async`)."""
    backend = job.t.backend
    return backend.write_store or backend.store


def rows_of_epoch(store: StateStore, epoch: int) -> int:
    """Rows whose version carries checkpoint id `epoch` (on any branch)."""
    return int(store._query(f"SELECT COUNT(*) FROM {store.t_state} WHERE "
                            "(version & 4294967295) = ?", (epoch,))[0][0])


def ttl_value(ttl_ms: int, refresh_on_read: bool = False) -> ValueStateDescriptor:
    d = ValueStateDescriptor("ttl", ANY)
    update = (StateTtlConfig.UpdateType.OnReadAndWrite if refresh_on_read
              else StateTtlConfig.UpdateType.OnCreateAndWrite)
    d.enable_time_to_live(StateTtlConfig.new_builder(Time.milliseconds(ttl_ms))
                          .set_update_type(update).build())
    return d


def keys_in_range(lo: int, hi: int, count: int, max_parallelism: int = 128) -> list[str]:
    """Keys whose key group (CRC32 as LocalSubtask computes it) lies in lo..hi."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        k = f"key{i}"
        if lo <= zlib.crc32(encode_key(k)) % max_parallelism <= hi:
            out.append(k)
        i += 1
    return out


# -- crash in the middle of a snapshot -----------------------------------------------------
@pytest.mark.parametrize("restore_mode", ["lazy", "eager"])
def test_crash_mid_snapshot_restores_previous_checkpoint_exactly(store_kind, store_factory,
                                                                 local_dir, restore_mode):
    ns = unique_namespace("r")
    options = NdbStateOptions(cache_max_entries=1, write_batch_rows=2,
                              restore_mode=restore_mode)
    store = store_factory(store_kind, namespace=ns)
    store.write_batch_rows = 2
    job, model = Job(store, options, local_dir), Model()
    for i, k in enumerate(KEYS):
        job.write(k, i)
        model.write(k, i)
    job.checkpoint(1)
    at1 = model.copy()
    for i, k in enumerate(KEYS):
        job.write(k, 10 + i)
        model.write(k, 10 + i)
    fail_after(writes_of(job), 3)  # 3 batches of epoch 2 committed, then the connection dies
    with pytest.raises(CheckpointError, match="Checkpoint 2"):
        job.checkpoint(2)
    # MySQL/NDB commit each batch: the crash hits the middle of the epoch. SQLite writes an
    # epoch in one transaction: nothing of it is left.
    assert rows_of_epoch(store, 2) == (6 if store_kind == "mysql" else 0)
    job.crash()
    store.close()

    store = store_factory(store_kind, namespace=ns)
    store.write_batch_rows = 2
    job = Job(store, options, local_dir, restored=1)
    assert job.read_all() == at1.view(), "the half-written epoch is invisible"
    # Continue from checkpoint 1 (Flink's next checkpoint id is 3), crash again.
    model = at1
    for i, k in enumerate(KEYS[:3]):
        job.write(k, 20 + i)
        model.write(k, 20 + i)
    job.checkpoint(3)
    assert rows_of_epoch(store, 2) == 0, "the half-written epoch is cleaned up"
    at3 = model.copy()
    job.write(KEYS[0], 99)
    fail_after(writes_of(job), 1)
    with pytest.raises(CheckpointError):
        job.checkpoint(4)
    job.crash()
    store.close()

    store = store_factory(store_kind, namespace=ns)
    job = Job(store, options, local_dir, restored=3)
    assert job.read_all() == at3.view()


def test_failed_snapshot_then_next_checkpoint_covers_everything(store_kind, store_factory,
                                                                local_dir):
    """A tolerated checkpoint failure (the job keeps running): the next checkpoint must
    still contain every change, including those of the half-written epoch."""
    ns = unique_namespace("r")
    options = NdbStateOptions(cache_max_entries=1, local_enabled=False, write_batch_rows=1)
    store = store_factory(store_kind, namespace=ns)
    store.write_batch_rows = 1
    job, model = Job(store, options, local_dir), Model()
    for i, k in enumerate(KEYS):
        job.write(k, i)
        model.write(k, i)
    job.checkpoint(1)
    for i, k in enumerate(KEYS):
        job.write(k, 10 + i)
        model.write(k, 10 + i)
    real = writes_of(job)._replace_state_rows
    fail_after(writes_of(job), 4)
    with pytest.raises(CheckpointError):
        job.checkpoint(2)
    job.t.abort(2)
    writes_of(job)._replace_state_rows = real  # type: ignore[method-assign]
    assert job.read_all() == model.view(), "the running job still sees its changes"
    job.checkpoint(3)
    job.crash()
    job = Job(store, options, local_dir, restored=3)
    assert job.read_all() == model.view()


# -- lost notifications, retained checkpoints, savepoints ----------------------------------
def test_restore_from_checkpoint_whose_notification_was_lost(store_kind, store_factory,
                                                             local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=2)
    job, model = Job(store, options, local_dir), Model()
    job.write("a", 1)
    model.write("a", 1)
    job.checkpoint(1)
    job.write("a", 2)
    job.write(1, 2)
    model.write("a", 2)
    model.write(1, 2)
    job.checkpoint(2, complete=False)  # Flink completed it; the notification never came
    at2 = model.copy()
    job.write("a", 3)
    job.checkpoint(3, complete=False)  # never completed
    job.crash()
    job = Job(store, options, local_dir, restored=2)
    assert job.read_all() == at2.view()
    assert store.latest_committed_checkpoint("op") == 2
    job.write(1, 4)
    model = at2
    model.write(1, 4)
    job.checkpoint(4)
    job.crash()
    job = Job(store, options, local_dir, restored=4)
    assert job.read_all() == model.view()


def test_restore_older_retained_checkpoint_after_gc_ran_several_times(store_kind,
                                                                      store_factory,
                                                                      local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=3)
    job, model = Job(store, options, local_dir), Model()
    snaps = {}
    for cp in range(1, 8):
        for i, k in enumerate(KEYS):
            if (cp + i) % 3:  # not every key in every epoch
                job.write(k, cp * 10 + i)
                model.write(k, cp * 10 + i)
        job.checkpoint(cp)
        snaps[cp] = model.copy()
    job.crash()
    job = Job(store, options, local_dir, restored=5)  # the oldest retained of 5, 6, 7
    assert job.read_all() == snaps[5].view()
    model = snaps[5]
    for cp in range(8, 11):  # Flink's checkpoint ids go on after a restore
        job.write(KEYS[cp % len(KEYS)], cp)
        model.write(KEYS[cp % len(KEYS)], cp)
        job.checkpoint(cp)
        snaps[cp] = model.copy()
    job.crash()
    job = Job(store, options, local_dir, restored=8)  # again the oldest retained
    assert job.read_all() == snaps[8].view()


def test_restore_older_retained_checkpoint_of_an_earlier_attempt(store_kind, store_factory,
                                                                 local_dir):
    """Retained checkpoints that predate a restore stay restorable: the attempt after the
    restore must not garbage-collect what they need."""
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=3)
    job, model = Job(store, options, local_dir), Model()
    snaps = {}
    for cp in (1, 2, 3):
        job.write("a", cp)
        model.write("a", cp)
        job.checkpoint(cp)
        snaps[cp] = model.copy()
    job.crash()
    job = Job(store, options, local_dir, restored=3)
    model = snaps[3]
    job.write("a", 4)
    model.write("a", 4)
    job.checkpoint(4)  # Flink retains 2, 3, 4
    job.crash()
    job = Job(store, options, local_dir, restored=2)
    assert job.read_all() == snaps[2].view()


def test_gc_keeps_retained_checkpoint_whose_notification_was_skipped(store_kind,
                                                                     store_factory,
                                                                     local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=2)
    job, model = Job(store, options, local_dir), Model()
    job.write("a", 4)
    model.write("a", 4)
    job.checkpoint(4)
    job.write("a", 5)
    model.write("a", 5)
    job.checkpoint(5, complete=False)  # completed in Flink, notification skipped
    at5 = model.copy()
    job.write("a", 6)
    job.checkpoint(6)                  # Flink retains 5 and 6
    job.crash()
    job = Job(store, options, local_dir, restored=5)  # fall back to the older retained one
    assert job.read_all() == at5.view()


def test_restore_savepoint_after_later_checkpoints_and_gc(store_kind, store_factory,
                                                          local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1)  # retained 1: GC is aggressive
    job, model = Job(store, options, local_dir), Model()
    for i, k in enumerate(KEYS):
        job.write(k, i)
        model.write(k, i)
    job.checkpoint(1)
    job.write("a", 2)
    model.write("a", 2)
    job.t.snapshot(2, is_savepoint=True)  # never completed (Flink >= 1.15)
    at_sp = model.copy()
    for cp in range(3, 7):
        for k in KEYS:
            job.write(k, cp)
        job.checkpoint(cp)
    job.crash()
    job = Job(store, options, local_dir, restored=2)
    assert job.read_all() == at_sp.view()


def test_savepoint_survives_failover_to_earlier_checkpoint(store_kind, store_factory,
                                                           local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1)
    job, model = Job(store, options, local_dir), Model()
    job.write("a", 1)
    model.write("a", 1)
    job.checkpoint(1)
    job.write("a", 2)
    model.write("a", 2)
    job.t.snapshot(2, is_savepoint=True)
    at_sp = model.copy()
    job.crash()
    job = Job(store, options, local_dir, restored=1)  # failover: latest checkpoint
    job.write("b", 3)
    job.checkpoint(3)
    job.crash()
    # Later, a new job is started from the savepoint.
    job = Job(store, options, local_dir, restored=2)
    assert job.read_all() == at_sp.view()


def test_fresh_restart_keeps_state_of_a_pinned_savepoint(store_kind, store_factory,
                                                         local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1)
    job, model = Job(store, options, local_dir), Model()
    job.write("a", 1)
    model.write("a", 1)
    job.t.snapshot(1, is_savepoint=True)
    job.crash()
    job = Job(store, options, local_dir)  # attempt 1: no checkpoint to restore
    assert job.read_all() == Model().view()
    job.crash()
    job = Job(store, options, local_dir, restored=1)  # a new job from the savepoint
    assert job.read_all() == model.view()


def test_resume_does_not_destroy_a_later_savepoint(store_kind, store_factory, local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1)
    job, model = Job(store, options, local_dir), Model()
    job.write("a", 1)
    model.write("a", 1)
    job.checkpoint(1)
    job.write("a", 2)
    model.write("a", 2)
    job.t.snapshot(2, is_savepoint=True)  # pinned, never completed
    job.crash()
    resume = NdbStateOptions(cache_max_entries=1, on_fresh_start="resume")
    job = Job(store, resume, local_dir)  # a new job resumes epoch 1
    job.write("a", 30)
    job.checkpoint(1)  # epoch offset 1 + 1 = 2: the savepoint's epoch
    job.crash()
    job = Job(store, options, local_dir, restored=2)  # the job started from the savepoint
    assert job.read_all() == model.view()


# -- fresh-start policies ------------------------------------------------------------------
def test_failure_before_first_checkpoint_does_not_trip_fail_policy(store_kind, store_factory,
                                                                   local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1)  # on-fresh-start: fail
    job = Job(store, options, local_dir, job_id="j" * 32)
    for i, k in enumerate(KEYS):
        job.write(k, i)
    job.checkpoint(1, complete=False)  # written, never completed
    job.crash()
    job = Job(store, options, local_dir, attempt=1, job_id="j" * 32)  # a fresh start again
    assert job.read_all() == Model().view()
    job.checkpoint(2)  # the first completed checkpoint cleans up what attempt 0 left
    assert store.count_rows() == 0


def test_fail_policy_message_names_the_fix(store_kind, store_factory, local_dir):
    store = store_factory(store_kind)
    job = Job(store, NdbStateOptions(), local_dir)
    job.write("a", 1)
    job.checkpoint(1)
    job.crash()
    with pytest.raises(NamespaceInUseError) as err:
        Job(store, NdbStateOptions(), local_dir)
    text = str(err.value)
    for word in ("on-fresh-start", "resume", "truncate", "latest completed checkpoint 1"):
        assert word in text


def test_resume_then_restore_checkpoint_of_resumed_run(store_kind, store_factory, local_dir):
    store = store_factory(store_kind)
    job, model = Job(store, NdbStateOptions(cache_max_entries=1), local_dir), Model()
    for cp in (1, 2, 3):
        job.write(KEYS[cp], cp)
        model.write(KEYS[cp], cp)
        job.checkpoint(cp)
    job.crash()
    resume = NdbStateOptions(cache_max_entries=1, on_fresh_start="resume")
    # A new job (checkpoint ids restart at 1) resumes epoch 3.
    job = Job(store, resume, local_dir)
    assert job.read_all() == model.view()
    job.write("a", 11)
    model.write("a", 11)
    job.checkpoint(1)  # checkpoint 1 again, of the resumed run
    at1 = model.copy()
    job.write("a", 12)
    job.checkpoint(2, complete=False)  # never completed
    job.crash()
    job = Job(store, resume, local_dir, restored=1)
    assert job.read_all() == at1.view()
    job.write(1, 13)
    model = at1
    model.write(1, 13)
    job.checkpoint(2)  # epoch 5 again, now completed
    job.write(1, 14)   # never checkpointed
    job.crash()
    # Failure before the first checkpoint of yet another resumed job.
    job = Job(store, resume, local_dir)
    job.write("a", 15)
    job.checkpoint(1, complete=False)
    job.crash()
    job = Job(store, resume, local_dir)
    assert job.read_all() == model.view()


def test_truncate_then_checkpoint_and_restore(store_kind, store_factory, local_dir):
    store = store_factory(store_kind)
    job = Job(store, NdbStateOptions(), local_dir)
    for i, k in enumerate(KEYS):
        job.write(k, i)
    job.checkpoint(1)
    job.crash()
    truncate = NdbStateOptions(cache_max_entries=1, on_fresh_start="truncate")
    job, model = Job(store, truncate, local_dir), Model()
    assert job.read_all() == Model().view()
    assert store.read_operator("op").committed is None
    job.write("a", 7)
    model.write("a", 7)
    job.checkpoint(1)
    job.crash()
    job = Job(store, truncate, local_dir, restored=1)
    assert job.read_all() == model.view()


# -- two subtasks on one store -------------------------------------------------------------
def test_rollback_of_one_subtask_leaves_the_other_alone(store_kind, store_factory, local_dir):
    store_a = store_factory(store_kind)
    store_b = store_factory(store_kind, namespace=store_a.namespace)
    options = NdbStateOptions(cache_max_entries=1, local_enabled=False)
    keys_a = keys_in_range(0, 63, 4)
    keys_b = keys_in_range(64, 127, 4)
    a = Job(store_a, options, local_dir, subtask_index=0, key_group_start=0, key_group_end=63)
    b = Job(store_b, options, local_dir, subtask_index=1, key_group_start=64,
            key_group_end=127)
    ma, mb = Model(), Model()
    for cp in (1, 2):
        for j, k in enumerate(keys_a):
            a.write(k, cp * 10 + j)
            ma.write(k, cp * 10 + j)
        for j, k in enumerate(keys_b):
            b.write(k, cp * 10 + j)
            mb.write(k, cp * 10 + j)
        a.checkpoint(cp)
        b.checkpoint(cp)
    at2_a = ma.copy()
    for j, k in enumerate(keys_a):
        a.write(k, 30 + j)
    for j, k in enumerate(keys_b):
        b.write(k, 30 + j)
        mb.write(k, 30 + j)
    a.checkpoint(3, complete=False)
    b.checkpoint(3, complete=False)
    # Subtask 0 fails and is restored from 2; subtask 1 keeps running (region failover).
    a.crash()
    a = Job(store_a, options, local_dir, restored=2, subtask_index=0, key_group_start=0,
            key_group_end=63)
    assert a.read_all(keys_a) == at2_a.view(keys_a)
    assert b.read_all(keys_b) == mb.view(keys_b), "subtask 1's rows of epoch 3 were lost"
    b.t.abort(3)
    a.checkpoint(4)
    b.checkpoint(4)
    a.crash()
    b.crash()
    b = Job(store_b, options, local_dir, restored=4, subtask_index=1, key_group_start=64,
            key_group_end=127)
    assert b.read_all(keys_b) == mb.view(keys_b)


# -- the database goes away ----------------------------------------------------------------
def _kill_connection(mysql_url: str, store: StateStore) -> None:
    conn = mysql_connect(mysql_url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"KILL {store._conn.thread_id()}")
    finally:
        conn.close()


def _is_unavailable(err: BaseException) -> bool:
    return isinstance(err, StoreUnavailableError) or isinstance(err.__cause__,
                                                                StoreUnavailableError)


@pytest.mark.mysql
def test_killed_connection_is_retried_and_loses_nothing(mysql_url, store_factory, local_dir):
    """P5: a database restart kills the session mid-job; the checkpoint is retried on a
    fresh connection and nothing is lost or doubled."""
    ns = unique_namespace("r")
    store = store_factory("mysql", namespace=ns)
    options = NdbStateOptions(cache_max_entries=1, local_enabled=False)
    job, model = Job(store, options, local_dir), Model()
    for i, k in enumerate(KEYS):
        job.write(k, i)
        model.write(k, i)
    job.checkpoint(1)
    job.write("a", 5)
    model.write("a", 5)
    _kill_connection(mysql_url, writes_of(job))  # what a database restart does to a session
    job.checkpoint(2)
    assert writes_of(job).retries >= 1
    _kill_connection(mysql_url, store)
    assert job.read_all() == model.view()  # reads that miss every tier are retried too
    job.crash()
    job = Job(store, options, local_dir, restored=2)
    assert job.read_all() == model.view()


@pytest.mark.mysql
def test_database_gone_for_longer_than_the_deadline_fails_the_checkpoint_cleanly(
        mysql_url, store_factory, local_dir):
    """P5: when retries are spent the checkpoint fails with StoreUnavailableError naming
    the server, and the last completed checkpoint stays restorable."""
    from tcp_proxy import TcpProxy, proxied_mysql_url

    from pyflink_ndb.stores.mysql import MysqlStateStore, parse_mysql_url
    from pyflink_ndb.stores.retry import RetryPolicy
    from pyflink_ndb.testing import checkpoint_storage

    server = parse_mysql_url(mysql_url)
    ns = unique_namespace("r")
    options = NdbStateOptions(cache_max_entries=1, local_enabled=False)
    with TcpProxy(server["host"], server["port"]) as proxy:
        # The connect timeout and the deadline leave room for a slow handshake through the
        # proxy before the outage (a clean-clone CI run late in the suite: the writer's
        # connection failed at the set-up after 2 attempts in 5 s); after `proxy.stop()`
        # every try is refused at once, so the attempts, not the deadline, end the retries.
        store = MysqlStateStore(
            proxied_mysql_url(server, proxy), ns,
            password=server["password"], connect_timeout_s=5, read_timeout_s=1,
            write_timeout_s=1, retry=RetryPolicy(max_attempts=4, initial_backoff_ms=10,
                                                 max_backoff_ms=50, deadline_ms=15_000))
        store.open()
        try:
            storage = checkpoint_storage(store)
            job, model = Job(store, options, local_dir, storage=storage), Model()
            job.write("a", 1)
            model.write("a", 1)
            job.checkpoint(1)
            job.write("a", 2)
            proxy.stop()
            with pytest.raises(CheckpointError) as err:
                job.checkpoint(2)
            assert _is_unavailable(err.value), repr(err.value)
            assert f"127.0.0.1:{proxy.port}" in str(err.value)
            job.crash()
        finally:
            store.close()
    again = store_factory("mysql", namespace=ns)
    job = Job(again, options, local_dir, restored=1, storage=storage)
    assert job.read_all() == model.view()


@pytest.mark.mysql
def test_unreachable_database_at_open_is_store_unavailable(local_dir):
    from pyflink_ndb.stores import open_store

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{port}"):
        open_store(NdbStateOptions(url=f"mysql://root@127.0.0.1:{port}/test",
                                   namespace="unreachable"))


# -- odd keys ------------------------------------------------------------------------------
def test_key_too_large_fails_the_update_and_keeps_restorable_state(store_kind,
                                                                   store_factory,
                                                                   local_dir):
    store = store_factory(store_kind)
    job, model = Job(store, NdbStateOptions(), local_dir), Model()
    job.write("a", 1)
    model.write("a", 1)
    job.checkpoint(1)
    job.t.key(b"k" * 5000)
    with pytest.raises(ValueTooLargeError, match=str(MAX_UKEY_BYTES)):
        job.value.update("huge key")
    job.write("b", 2)
    model.write("b", 2)
    job.checkpoint(2)
    job.crash()
    job = Job(store, NdbStateOptions(), local_dir, restored=2)
    assert job.read_all() == model.view()


@pytest.mark.parametrize("length", [MAX_UKEY_BYTES - 3, MAX_UKEY_BYTES - 2])
def test_key_at_the_size_limit(store_kind, store_factory, local_dir, length):
    store = store_factory(store_kind)
    job = Job(store, NdbStateOptions(), local_dir)
    key = b"k" * length  # tag + 2-byte length + payload
    encoded = len(encode_key(key))
    job.t.key(key)
    if encoded <= MAX_UKEY_BYTES:
        job.value.update("v")
        job.checkpoint(1)
        job.crash()
        job = Job(store, NdbStateOptions(), local_dir, restored=1)
        job.t.key(key)
        assert job.value.value() == "v"
    else:
        with pytest.raises(ValueTooLargeError):
            job.value.update("v")
        job.checkpoint(1)
        assert rows_of_epoch(store, 1) == 0


class MyInt(int):
    pass


class MyStr(str):
    pass


class Color(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize("key", [MyInt(1), MyStr("a"), Color.RED], ids=["int", "str", "enum"])
def test_subclass_keys_fail_clearly_and_change_nothing(store_factory, local_dir, key):
    store = store_factory("sqlite")
    job = Job(store, NdbStateOptions(), local_dir)
    with pytest.raises(SerializationError, match=type(key).__name__):
        job.t.key(key)
    job.t.key("a")
    job.map.put("x", 1)
    with pytest.raises(SerializationError, match=type(key).__name__):
        job.map.put(key, 2)
    with pytest.raises(SerializationError):
        job.map.put_all({"y": 3, key: 4})
    assert dict(job.map.items()) == {"x": 1}


def test_row_and_float_keys_round_trip_through_a_restore(store_kind, store_factory,
                                                         local_dir):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1)
    map_keys = [Row(b=1, a="x"), Row(1, "x"), (1, "x"), 1, math.nan, -0.0, 0.0, math.inf,
                True, 1.0]
    job = Job(store, options, local_dir)
    job.t.key(Row(name="k", n=1))
    for i, mk in enumerate(map_keys):
        job.map.put(mk, i)
    job.checkpoint(1)
    job.crash()
    job = Job(store, options, local_dir, restored=1)
    job.t.key(Row(name="k", n=1))
    got = list(job.map.items())
    # 1, True and 1.0 are three keys; 0.0 and -0.0 two; every NaN is the same key.
    assert len(got) == len(map_keys)
    assert job.map.get(float("nan")) == 4
    assert job.map.get(Row(b=1, a="x")) == 0
    assert job.map.get(Row(1, "x")) == 1 and job.map.get((1, "x")) == 2
    assert job.map.get(-0.0) == 5 and job.map.get(0.0) == 6
    assert job.map.get(True) == 8 and job.map.get(1.0) == 9 and job.map.get(1) == 3
    keys_back = [k for k, _ in got]
    assert Row(b=1, a="x") in keys_back


def _nested(kind: str, levels: int) -> Any:
    """A key of `levels` nested containers of one kind around an int."""
    key: Any = 1
    for _ in range(levels):
        key = {"tuple": lambda k: (k,), "list": lambda k: [k],
               "frozenset": lambda k: frozenset([k]), "row": lambda k: Row(k)}[kind](key)
    return key


@pytest.mark.parametrize("kind", ["tuple", "list", "frozenset", "row"])
def test_deeply_nested_key_fails_with_serialization_error(store_factory, local_dir, kind):
    """A key nested up to MAX_KEY_DEPTH containers deep works; one level more is refused
    before the encoder nears Python's recursion limit (CI once saw a finalizer fail with a
    RecursionError while a 5,000-level key recursed to that limit)."""
    store = store_factory("sqlite")
    job = Job(store, NdbStateOptions(), local_dir)
    deepest = _nested(kind, MAX_KEY_DEPTH)
    job.write(deepest, 7)
    for levels in (MAX_KEY_DEPTH + 1, 5000):
        with pytest.raises(SerializationError, match=f"more than {MAX_KEY_DEPTH} levels"):
            job.t.key(_nested(kind, levels))
    job.checkpoint(1)
    job.crash()
    job = Job(store, NdbStateOptions(), local_dir, restored=1)
    assert job.read(deepest) == {"value": (7, deepest), "list": [7], "map": {7: [7, deepest]}}


def test_named_row_key_at_max_depth_is_accepted(store_factory, local_dir):
    """A named Row's field names belong to the Row's own level: MAX_KEY_DEPTH containers
    ending in a named Row are accepted, as they are with a positional Row."""
    key: Any = Row(a=1)
    for _ in range(MAX_KEY_DEPTH - 1):
        key = (key,)  # MAX_KEY_DEPTH containers in all
    assert decode_key(encode_key(key)) == key
    job = Job(store_factory("sqlite"), NdbStateOptions(), local_dir)
    job.write(key, 1)
    assert job.read(key)["value"] == (1, key)
    with pytest.raises(SerializationError, match=f"more than {MAX_KEY_DEPTH} levels"):
        encode_key((key,))


@pytest.mark.parametrize("row", [Row("a", "a")(1, 2), Row(1, 2)(3, 4)],
                         ids=["repeated-names", "non-string-names"])
def test_a_row_key_whose_names_cannot_come_back_is_refused(store_factory, local_dir, row):
    """A Row key comes back as Row(**fields): repeated field names would be dropped
    (Row(a=1, a=2) read back as Row(a=2)) and names that are not strings cannot be
    keywords. Such a key is refused at put, and nothing changes."""
    job = Job(store_factory("sqlite"), NdbStateOptions(), local_dir)
    job.t.key("k")
    job.map.put("x", 1)
    with pytest.raises(SerializationError, match="must be distinct strings"):
        job.map.put(row, "v")
    with pytest.raises(SerializationError, match="must be distinct strings"):
        job.t.key(row)
    job.t.key("k")
    assert dict(job.map.items()) == {"x": 1}


def test_a_map_key_nested_a_million_levels_is_refused_not_a_crash():
    """CPython's tuple hash recurses without a limit: hashing the key before the encoder's
    depth check killed the interpreter (SIGSEGV). The key is refused like any key deeper
    than MAX_KEY_DEPTH; an unhashable map key is still a TypeError, as in a dict."""
    code = textwrap.dedent("""
        from pyflink_ndb.errors import SerializationError
        from pyflink_ndb.serialization.keys import encode_map_key
        key = 1
        for _ in range(1_000_000):
            key = (key,)
        try:
            encode_map_key(key)
        except SerializationError:
            print("refused")
        for bad in ([1], {"a": 1}, (1, [2]), {1}):
            try:
                encode_map_key(bad)
            except TypeError:
                print("unhashable")
        class Opaque:  # hashable, but no key type: never hashed with what follows it
            pass
        try:
            encode_map_key((Opaque(), key))
        except SerializationError:
            print("refused")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.split() == ["refused"] + ["unhashable"] * 4 + ["refused"]


# -- a failed write's rows that are committed anyway -------------------------------------
def _remove_a_then_check_it_stays_removed(job: Job, store: StateStore,
                                          options: NdbStateOptions, local_dir: str) -> None:
    """After a failed checkpoint 2 wrote "a": remove "a" in checkpoint 3, let checkpoints 1
    and 3 fall out of retention (garbage collection runs), then "a" must read as removed in
    the running job and after a restore of checkpoint 6."""
    job.t.key("a")
    job.value.clear()
    job.checkpoint(3)
    for cid in (4, 5, 6):
        job.t.key("c")
        job.value.update(cid)
        job.checkpoint(cid)
    job.t.key("a")
    assert job.value.value() is None, "the running job sees a removed value again"
    job.crash()
    job = Job(store, options, local_dir, restored=6)
    job.t.key("a")
    assert job.value.value() is None, "checkpoint 6 restores a removed value"


def test_a_removed_value_stays_removed_after_a_partly_committed_failed_write(store_factory,
                                                                           local_dir):
    """MySQL commits an epoch batch by batch: a write that fails after its first batch
    leaves rows of its version behind. The ledger knew the entry completely before; it
    must read the entry's versions from the store again (VersionLedger.doubt), or the
    collection of a later tombstone and of the older versions leaves the failed epoch's
    row as the entry's value (found by a breaker: the running job and a restore of
    checkpoint 6 read 'X' again)."""
    options = NdbStateOptions(cache_max_entries=1, local_enabled=False, write_batch_rows=1,
                              checkpoints_retained=1)
    store = store_factory("mysql")
    store.write_batch_rows = 1
    job = Job(store, options, local_dir)
    job.t.key("a")
    job.value.update("A")
    job.t.key("b")
    job.value.update("B0")
    job.checkpoint(1)
    job.t.key("a")
    job.value.update("X")  # committed at checkpoint 2's version, then the write fails
    job.t.key("b")
    job.value.update("B1")
    real = writes_of(job)._replace_state_rows
    fail_after(writes_of(job), 1)
    with pytest.raises(CheckpointError):
        job.checkpoint(2)
    job.t.abort(2)
    writes_of(job)._replace_state_rows = real  # type: ignore[method-assign]
    _remove_a_then_check_it_stays_removed(job, store, options, local_dir)


def test_a_removed_value_stays_removed_after_the_snapshot_row_failed(store_factory, local_dir):
    """The same on SQLite: every row of epoch 2 is committed, then the snapshot row's
    insert fails; the removed value must not come back once checkpoints 1 and 3 leave
    retention and garbage collection runs."""
    options = NdbStateOptions(cache_max_entries=1, local_enabled=False,
                              checkpoints_retained=1)
    store = store_factory("sqlite")
    job = Job(store, options, local_dir)
    job.t.key("a")
    job.value.update("A")
    job.checkpoint(1)
    job.t.key("a")
    job.value.update("X")
    wstore = writes_of(job)
    real = wstore.insert_snapshot

    def fail(*args, **kwargs):
        raise OSError("injected: connection reset before the snapshot row")

    wstore.insert_snapshot = fail  # type: ignore[method-assign]
    with pytest.raises(CheckpointError):
        job.checkpoint(2)
    job.t.abort(2)
    wstore.insert_snapshot = real  # type: ignore[method-assign]
    _remove_a_then_check_it_stays_removed(job, store, options, local_dir)


# -- odd values ----------------------------------------------------------------------------
@pytest.mark.parametrize("value", [lambda x: x, "socket"], ids=["lambda", "socket"])
def test_unpicklable_values_fail_at_update_and_change_nothing(store_factory, local_dir,
                                                              value):
    store = store_factory("sqlite")
    job = Job(store, NdbStateOptions(cache_max_entries=1), local_dir)
    sock = socket.socket() if value == "socket" else None
    bad = sock if sock is not None else value
    try:
        job.write("a", 1)
        job.checkpoint(1)
        job.t.key("a")
        before = job.read("a")
        with pytest.raises(SerializationError):
            job.value.update(bad)
        with pytest.raises(SerializationError):
            job.map.put("x", bad)
        with pytest.raises(SerializationError):
            job.map.put_all({"y": 1, "z": bad})
        with pytest.raises(SerializationError):
            job.list.add(bad)
        with pytest.raises(SerializationError):
            job.list.add_all([2, bad])
        reducing = job.t.context.get_reducing_state(
            ReducingStateDescriptor("r", lambda a, b: bad, ANY))
        reducing.add(1)
        with pytest.raises(SerializationError):
            reducing.add(2)
        assert reducing.get() == 1
        assert job.read("a") == before
        job.checkpoint(2)
        job.crash()
        job = Job(store, NdbStateOptions(cache_max_entries=1), local_dir, restored=2)
        assert job.read("a") == before
    finally:
        if sock is not None:
            sock.close()


@pytest.mark.parametrize("call", ["update", "add_all-compaction"])
def test_failed_list_write_changes_nothing(store_factory, local_dir, call, monkeypatch):
    from pyflink_ndb.state import list as list_state
    from pyflink_ndb.state.list import MAX_SEGMENTS

    monkeypatch.setattr(list_state, "SMALL_SEGMENT_BYTES", 0)  # a segment per checkpoint

    store = store_factory("sqlite")
    job = Job(store, NdbStateOptions(), local_dir)
    job.t.key("a")
    segments = 2 if call == "update" else MAX_SEGMENTS
    for i in range(segments):  # one segment per checkpoint
        job.list.add(i)
        job.checkpoint(i + 1)
    with pytest.raises(SerializationError):
        if call == "update":
            job.list.update(["z", lambda q: q])
        else:
            job.list.add_all(["z", lambda q: q])
    assert job.list.get() == list(range(segments))


@pytest.mark.parametrize("size", [CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1,
                                  2 * CHUNK_BYTES, 2 * CHUNK_BYTES + 1],
                         ids=["c-1", "c", "c+1", "2c", "2c+1"])
def test_values_at_chunk_boundaries(store_kind, store_factory, local_dir, size):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1, local_enabled=False)
    job = Job(store, options, local_dir)
    big = bytes(range(256)) * (size // 256) + b"\x07" * (size % 256)
    job.t.key("a")
    job.value.update(big)
    job.map.put("m", big)
    job.checkpoint(1)
    job.t.key("a")
    job.value.update(big[: size // 3])  # fewer chunks in the next epoch
    job.checkpoint(2, complete=False)
    job.crash()
    job = Job(store, options, local_dir, restored=1)
    job.t.key("a")
    assert job.value.value() == big
    assert job.map.get("m") == big
    job.t.key("b")  # evicts "a" (cache of one, no RocksDB): read again from the store
    job.t.key("a")
    assert job.value.value() == big


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.0, 10 ** 400,
                                   "a\x00b", {"x": math.nan}, ((((1,),),),)],
                         ids=["nan", "inf", "-inf", "-0", "bigint", "nul", "dict-nan",
                              "nested"])
def test_odd_values_round_trip_through_a_restore(store_kind, store_factory, local_dir,
                                                 value):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1)
    job = Job(store, options, local_dir)
    job.t.key("a")
    job.value.update(value)
    job.list.add(value)
    job.checkpoint(1)
    job.crash()
    job = Job(store, options, local_dir, restored=1)
    job.t.key("a")
    got = job.value.value()
    assert repr(got) == repr(value)
    assert repr(job.list.get()) == repr([value])


@pytest.mark.parametrize("where", ["value", "key"])
def test_lone_surrogate_string_checkpoints(store_kind, store_factory, local_dir, where):
    store = store_factory(store_kind)
    text = "x\ud800y"
    key, value = (text, "v") if where == "key" else ("a", text)
    job = Job(store, NdbStateOptions(), local_dir)
    job.t.key(key)
    job.value.update(value)
    job.checkpoint(1)
    job.crash()
    job = Job(store, NdbStateOptions(), local_dir, restored=1)
    job.t.key(key)
    assert job.value.value() == value


@pytest.mark.mysql
@pytest.mark.parametrize("where", ["value", "key"])
def test_deeply_nested_json_checkpoints_on_mysql(store_factory, local_dir, where):
    store = store_factory("mysql")
    nested: Any = 1
    for _ in range(40):
        nested = (nested,)
    key, value = (nested, "v") if where == "key" else ("a", nested)
    job = Job(store, NdbStateOptions(), local_dir)
    job.t.key(key)
    job.value.update(value)
    job.checkpoint(1)
    job.crash()
    job = Job(store, NdbStateOptions(), local_dir, restored=1)
    job.t.key(key)
    assert job.value.value() == value


# -- the same map key put / removed / put --------------------------------------------------
@pytest.mark.parametrize("local", [False, True], ids=["nolocal", "local"])
def test_map_key_put_remove_put_within_and_across_epochs(store_kind, store_factory,
                                                         local_dir, local):
    store = store_factory(store_kind)
    options = NdbStateOptions(cache_max_entries=1, local_enabled=local)
    job = Job(store, options, local_dir)
    m = job.map
    job.t.key("k")
    m.put("a", 1)
    m.remove("a")
    m.put("a", 2)
    m.put("b", None)
    job.t.key("other")  # evict everything of "k"
    job.t.key("k")
    m.remove("b")
    m.put("c", 3)
    m.remove("c")
    assert dict(m.items()) == {"a": 2}
    job.checkpoint(1)
    job.t.key("k")
    m.remove("a")
    m.put("a", 4)
    m.remove("a")
    m.put("b", 5)
    assert dict(m.items()) == {"b": 5} and not m.contains("a")
    job.checkpoint(2, complete=False)
    job.crash()
    job = Job(store, options, local_dir, restored=1)
    m = job.map
    job.t.key("k")
    assert dict(m.items()) == {"a": 2} and not m.contains("b") and not m.contains("c")
    m.remove("a")
    job.checkpoint(3)
    m.put("a", 6)
    job.checkpoint(4)
    m.remove("a")
    m.put("a", 7)
    job.checkpoint(5)
    job.crash()
    job = Job(store, options, local_dir, restored=5)
    job.t.key("k")
    assert dict(job.map.items()) == {"a": 7}
    assert list(job.map.keys()) == ["a"]


# -- TTL -----------------------------------------------------------------------------------
def test_ttl_value_expires_exactly_at_its_expiry(store_kind, store_factory, local_dir):
    store = store_factory(store_kind)
    clock = ManualClock()
    t = LocalSubtask(store, NdbStateOptions(cache_max_entries=1), clock=clock,
                     local_dir=local_dir)
    v = t.context.get_state(ttl_value(1000))
    t.key("a")
    v.update("x")
    t.checkpoint(1)
    clock.advance(999)
    assert v.value() == "x"
    t.crash()
    t = LocalSubtask(store, NdbStateOptions(cache_max_entries=1), clock=clock,
                     local_dir=local_dir, restored_checkpoint_id=1)
    v = t.context.get_state(ttl_value(1000))
    t.key("a")
    assert v.value() == "x"
    clock.advance(1)  # now == expiry: expired (Flink: expiry <= now)
    assert v.value() is None
    t.checkpoint(2)  # GC runs with now == expiry
    t.crash()
    t = LocalSubtask(store, NdbStateOptions(cache_max_entries=1), clock=clock,
                     local_dir=local_dir, restored_checkpoint_id=2)
    v = t.context.get_state(ttl_value(1000))
    t.key("a")
    assert v.value() is None


def test_ttl_refresh_on_read_survives_restore(store_kind, store_factory, local_dir):
    store = store_factory(store_kind)
    clock = ManualClock()

    def start(restored: int | None) -> tuple[LocalSubtask, Any]:
        t = LocalSubtask(store, NdbStateOptions(cache_max_entries=1), clock=clock,
                         local_dir=local_dir, restored_checkpoint_id=restored)
        return t, t.context.get_state(ttl_value(1000, refresh_on_read=True))

    t, v = start(None)
    t.key("a")
    v.update("x")
    t.checkpoint(1)
    clock.advance(900)
    assert v.value() == "x"  # prolongs to now + 1000
    t.checkpoint(2)
    t.crash()
    clock.advance(500)  # past the first expiry, before the prolonged one
    t, v = start(2)
    t.key("a")
    assert v.value() == "x"
    t.crash()
    t, v = start(1)  # checkpoint 1 did not see the read: expired by now
    t.key("a")
    assert v.value() is None


def test_shortened_ttl_never_resurrects_an_overwritten_value(store_kind, store_factory,
                                                             local_dir):
    store = store_factory(store_kind)
    clock = ManualClock()
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=3)

    def start(restored: int | None, ttl_ms: int) -> tuple[LocalSubtask, Any]:
        t = LocalSubtask(store, options, clock=clock, local_dir=local_dir,
                         restored_checkpoint_id=restored)
        return t, t.context.get_state(ttl_value(ttl_ms))

    t, v = start(None, 3_600_000)
    t.key("k")
    v.update("old")
    t.checkpoint(1)
    t.crash()
    t, v = start(1, 60_000)  # the new release of the job shortens the TTL
    t.key("k")
    v.update("new")
    t.checkpoint(2)
    clock.advance(120_000)
    assert v.value() is None  # "new" expired; "old" was overwritten
    t.checkpoint(3)
    t.crash()
    t, v = start(3, 60_000)
    t.key("k")
    assert v.value() is None


def test_ttl_list_and_map_entries_expire_one_by_one_across_restores(store_kind,
                                                                    store_factory,
                                                                    local_dir):
    store = store_factory(store_kind)
    clock = ManualClock()
    options = NdbStateOptions(cache_max_entries=1)
    ttl = StateTtlConfig.new_builder(Time.milliseconds(1000)).build()

    def start(restored: int | None) -> tuple[LocalSubtask, Any, Any]:
        t = LocalSubtask(store, options, clock=clock, local_dir=local_dir,
                         restored_checkpoint_id=restored)
        ld = ListStateDescriptor("tl", ANY)
        ld.enable_time_to_live(ttl)
        md = MapStateDescriptor("tm", ANY, ANY)
        md.enable_time_to_live(ttl)
        return t, t.context.get_list_state(ld), t.context.get_map_state(md)

    t, lst, mp = start(None)
    t.key("k")
    lst.add("a")
    mp.put("a", 1)
    t.checkpoint(1)
    clock.advance(600)
    t.key("k")
    lst.add("b")
    mp.put("b", 2)
    t.checkpoint(2)
    clock.advance(600)  # "a" expired, "b" alive
    t.checkpoint(3)     # GC deletes expired rows
    t.crash()
    t, lst, mp = start(2)
    t.key("k")
    assert lst.get() == ["b"]
    assert dict(mp.items()) == {"b": 2}
    clock.advance(600)
    assert lst.get() == [] and mp.is_empty()
    t.checkpoint(4)
    t.crash()
    t, lst, mp = start(4)
    t.key("k")
    assert lst.get() == [] and mp.is_empty()


# -- bounded input without checkpointing ---------------------------------------------------
class _Oracle:
    """Key groups as LocalSubtask computes them (CRC32 of the encoded key)."""

    backend: Any = None

    def currentKeyGroup(self) -> int:  # noqa: N802 (the Java method name)
        return zlib.crc32(self.backend.current_key_bytes) % 128


def _bounded_subtask(store: StateStore, index: int, attempt: int, local_dir: str) -> Any:
    lo, hi = (0, 63) if index == 0 else (64, 127)
    oracle = _Oracle()
    backend = SubtaskStateBackend(
        NdbStateOptions(), BindInfo(operator="op", subtask_index=index, parallelism=2,
                                    attempt=attempt, key_group_start=lo, key_group_end=hi,
                                    checkpointing_enabled=False, local_dir=local_dir,
                                    job_id="job-1"),
        oracle, store=store)
    oracle.backend = backend
    ctx = TieredRuntimeContext(None, backend)  # type: ignore[arg-type]
    return backend, ctx.get_state(ValueStateDescriptor("count", ANY))


def test_key_groups_are_asked_of_java_once_per_key_until_the_memo_fills(
        store_factory, local_dir, monkeypatch):
    from pyflink_ndb.runtime import backend as backend_module

    monkeypatch.setattr(backend_module, "KEY_GROUP_MEMO_ENTRIES", 4)
    backend, count = _bounded_subtask(store_factory("sqlite"), 0, 0, local_dir)
    assert backend._kg_memo_max == max(NdbStateOptions().cache_max_entries * 2, 4)
    backend._kg_memo_max = 4  # a small memo, to see it fill
    calls = []
    oracle = backend._key_groups
    original = type(oracle).currentKeyGroup

    def counted(self: Any) -> int:
        calls.append(self.backend.current_key)
        return original(self)

    monkeypatch.setattr(type(oracle), "currentKeyGroup", counted)
    for key in ["a", "b", "a", "b", "a"]:
        backend.set_current_key(key)
        count.update((count.value() or 0) + 1)
    assert calls == ["a", "b"]
    for key in ["c", "d", "e", "a"]:  # the fifth key empties the memo
        backend.set_current_key(key)
    assert calls == ["a", "b", "c", "d", "e", "a"]
    backend.set_current_key("b")
    backend.set_current_key("a")
    assert calls[-1] == "b" and len(calls) == 7
    assert backend.current_key_group == zlib.crc32(backend.current_key_bytes) % 128
    backend.table.close()


def test_bounded_job_without_checkpointing_survives_a_restart(store_factory, local_dir):
    store_a = store_factory("sqlite")
    store_b = store_factory("sqlite", namespace=store_a.namespace)
    keys = {0: keys_in_range(0, 63, 3), 1: keys_in_range(64, 127, 3)}

    def run(attempt: int, fail_subtask_1: bool) -> None:
        a, count_a = _bounded_subtask(store_a, 0, attempt, local_dir)
        b, count_b = _bounded_subtask(store_b, 1, attempt, local_dir)
        for backend, count, ks in ((a, count_a, keys[0]), (b, count_b, keys[1])):
            for k in ks * 2:  # every key twice
                backend.set_current_key(k)
                count.update((count.value() or 0) + 1)
        a.finish()
        a.table.close()  # close() would also close the store the test reuses
        if fail_subtask_1:
            b.table.close()  # crash: no finish
            return
        b.finish()
        b.table.close()

    run(0, fail_subtask_1=True)
    run(1, fail_subtask_1=False)  # Flink's restart of the whole job
    rows = store_a.query_committed("op", "count")
    counts = sorted(pickle.loads(r["vbytes"]) for r in rows)
    assert counts == [2] * 6

