"""Adversarial tests of the asynchronous flush (docs/protocol.md, "Asynchronous flush").

Every scenario runs through :class:`pyflink_ndb.testing.LocalSubtask` (no Flink) and checks
real outcomes against a plain dict model: overlapping epochs read while in flight and
completed out of order, background write failures with later epochs queued behind them,
crashes while the writer is mid-epoch, back-pressure, savepoints aborted while queued,
`finish()` without checkpointing, zombies, the durability listener, TTL, oversized values,
the ListState rewrite path, and the writer rendering while the task thread writes.

Tests marked `xfail(strict=True, reason="BUG: ...")` assert the correct behaviour and
demonstrate a bug that is not fixed yet.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import TIER_OPTIONS, unique_namespace
from pyflink.common.time import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

from pyflink_ndb.checkpoint import writer as writer_module
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import CheckpointError, FencedError, ValueTooLargeError
from pyflink_ndb.serialization.keys import decode_key, split_key
from pyflink_ndb.stores import StateStore
from pyflink_ndb.testing import CheckpointStorage, LocalSubtask, ManualClock

ANY = Types.PICKLED_BYTE_ARRAY()


STORES = [pytest.param("sqlite", id="sqlite"),
          pytest.param("mysql", id="mysql", marks=pytest.mark.mysql)]


def opts(tier: str = "cache1-local", **kw: Any) -> NdbStateOptions:
    """A tier configuration of conftest, retaining enough checkpoints that every one taken
    in a test stays restorable."""
    kw.setdefault("checkpoints_retained", 64)
    return dataclasses.replace(TIER_OPTIONS[tier], **kw)


class Injected(Exception):
    """A non-transient failure injected into the writer's store."""


class Recorder:
    """A fake DurabilityListener: records every call, in order, with its thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.messages: dict[int, str] = {}
        self.threads: set[str] = set()
        self._lock = threading.Lock()

    def durable(self, checkpoint_id: int) -> None:
        with self._lock:
            self.calls.append(("durable", int(checkpoint_id)))
            self.threads.add(threading.current_thread().name)

    def failed(self, checkpoint_id: int, message: str) -> None:
        with self._lock:
            self.calls.append(("failed", int(checkpoint_id)))
            self.messages[int(checkpoint_id)] = message
            self.threads.add(threading.current_thread().name)


class Gate:
    """Wraps the writer store's state-row writes (`_replace_state_rows`, one statement
    batch each): optionally slow, blockable at will, and able to fail on demand (after
    `ok_calls` more successful calls)."""

    def __init__(self, store: StateStore, delay_s: float = 0.0) -> None:
        self.store = store
        self.original = store._replace_state_rows
        self.delay_s = delay_s
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()
        self.calls = 0
        self.fail_after: int | None = None
        self.lock = threading.Lock()
        store._replace_state_rows = self  # type: ignore[method-assign]

    def __call__(self, text: str, rows: Any) -> None:
        self.entered.set()
        self.open.wait(30)
        if self.delay_s:
            time.sleep(self.delay_s)
        with self.lock:
            if self.fail_after is not None:
                if self.fail_after <= 0:
                    raise Injected("injected: the background write failed")
                self.fail_after -= 1
            self.calls += 1
        self.original(text, rows)

    def block(self) -> None:
        self.entered.clear()
        self.open.clear()

    def release(self) -> None:
        self.open.set()

    def heal(self) -> None:
        with self.lock:
            self.fail_after = None
        self.open.set()


class Hold:
    """Wraps a method of the writer's store so that its calls wait until released (before
    any transaction begins, unlike :class:`Gate`, which holds inside one)."""

    def __init__(self, store: StateStore, method: str) -> None:
        self.original = getattr(store, method)
        self.open = threading.Event()
        self.entered = threading.Event()
        setattr(store, method, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        assert self.open.wait(30), "never released"
        return self.original(*args, **kwargs)

    def release(self) -> None:
        self.open.set()


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"not true within {timeout_s} s"
        time.sleep(0.005)


# -- the subtask and its model -------------------------------------------------------------
class Job:
    """One attempt of a subtask with a value, a list and a map state."""

    def __init__(self, store: StateStore, options: NdbStateOptions, local_dir: str,
                 restored: int | None = None, **kwargs: Any) -> None:
        self.store = store
        self.t = LocalSubtask(store, options, restored_checkpoint_id=restored,
                              local_dir=local_dir, **kwargs)
        ctx = self.t.context
        self.value = ctx.get_state(ValueStateDescriptor("value", ANY))
        self.list = ctx.get_list_state(ListStateDescriptor("list", ANY))
        self.map = ctx.get_map_state(MapStateDescriptor("map", ANY, ANY))

    @property
    def protocol(self) -> Any:
        return self.t.backend.protocol

    @property
    def writer(self) -> Any:
        return self.t.backend.protocol.writer

    def gate(self, delay_s: float = 0.0) -> Gate:
        ws = self.t.backend.write_store
        assert ws is not None, "write.async is on: the writer has its own store"
        return Gate(ws, delay_s)

    def apply(self, op: tuple[Any, ...]) -> None:
        kind, key, *args = op
        self.t.key(key)
        if kind == "set":
            self.value.update(args[0])
        elif kind == "clear":
            self.value.clear()
        elif kind == "add":
            self.list.add(args[0])
        elif kind == "lupdate":
            self.list.update(list(args[0]))
        elif kind == "put":
            self.map.put(args[0], args[1])
        elif kind == "remove":
            self.map.remove(args[0])
        else:
            raise AssertionError(kind)

    def read(self, key: Any) -> dict[str, Any]:
        self.t.key(key)
        items = list(self.map.items())
        assert len(items) == len({k for k, _ in items}), f"map entry doubled: {items}"
        keys = list(self.map.keys())
        assert sorted(map(repr, keys)) == sorted(repr(k) for k, _ in items)
        return {"value": self.value.value(), "list": list(self.list.get()),
                "map": dict(items)}

    def read_all(self, keys: list[Any]) -> dict[Any, dict[str, Any]]:
        return {k: self.read(k) for k in keys}

    def close(self) -> None:
        self.t.close()


EMPTY: dict[str, Any] = {"value": None, "list": [], "map": {}}


class Model:
    def __init__(self) -> None:
        self.state: dict[Any, dict[str, Any]] = {}

    def apply(self, op: tuple[Any, ...]) -> None:
        kind, key, *args = op
        s = self.state.setdefault(key, copy.deepcopy(EMPTY))
        if kind == "set":
            s["value"] = args[0]
        elif kind == "clear":
            s["value"] = None
        elif kind == "add":
            s["list"].append(args[0])
        elif kind == "lupdate":
            s["list"] = list(args[0])
        elif kind == "put":
            s["map"][args[0]] = args[1]
        elif kind == "remove":
            s["map"].pop(args[0], None)

    def view(self, keys: list[Any]) -> dict[Any, dict[str, Any]]:
        return {k: copy.deepcopy(self.state.get(k, EMPTY)) for k in keys}

    def snapshot(self) -> dict[Any, dict[str, Any]]:
        return copy.deepcopy(self.state)


def random_op(rng: random.Random, keys: list[Any], round_: int) -> tuple[Any, ...]:
    key = rng.choice(keys)
    kind = rng.choice(["set", "set", "clear", "add", "add", "lupdate", "put", "put",
                       "remove"])
    if kind == "set":
        return ("set", key, (round_, rng.randrange(1000)))
    if kind == "clear":
        return ("clear", key)
    if kind == "add":
        return ("add", key, (round_, rng.randrange(1000)))
    if kind == "lupdate":
        return ("lupdate", key, [round_] * rng.randrange(3))
    if kind == "put":
        return ("put", key, rng.randrange(6), (round_, rng.randrange(1000)))
    return ("remove", key, rng.randrange(6))


def both(job: Job, model: Model, op: tuple[Any, ...]) -> None:
    job.apply(op)
    model.apply(op)


def restore_equals(store: StateStore, options: NdbStateOptions, local_dir: str,
                   checkpoint_id: int, wanted: dict[Any, dict[str, Any]],
                   keys: list[Any], **kwargs: Any) -> None:
    job = Job(store, options, local_dir, restored=checkpoint_id, **kwargs)
    try:
        got = job.read_all(keys)
        want = {k: copy.deepcopy(wanted.get(k, EMPTY)) for k in keys}
        assert got == want, f"restore of checkpoint {checkpoint_id} differs from the model"
    finally:
        job.close()


def committed_values(store: StateStore, operator: str = "op") -> dict[Any, Any]:
    """What a reader sees of the value state: key -> value."""
    out = {}
    for rec in store.iter_committed(operator, "value"):
        prefix, _ = split_key(rec["ukey"])
        out[decode_key(prefix)] = pickle.loads(rec["vbytes"])
    return out


def model_values(state: dict[Any, dict[str, Any]]) -> dict[Any, Any]:
    return {k: s["value"] for k, s in state.items() if s["value"] is not None}


def my_snapshots(job: Job) -> set[int]:
    branch = job.protocol.branch
    return {r.epoch for r in job.store.list_snapshots("op") if r.branch == branch}


KEYS = [f"k{i}" for i in range(12)] + [7, (1, "t")]


# -- 1. overlapping epochs, reads while in flight, completion out of order -------------------
@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("tier", list(TIER_OPTIONS))
def test_overlapping_epochs_read_in_flight_complete_out_of_order_restore_each(
        store_factory, local_dir, kind, tier):
    store = store_factory(kind)
    options = opts(tier)
    rng = random.Random(f"overlap-{tier}")
    job = Job(store, options, local_dir)
    gate = job.gate(delay_s=0.01)
    model = Model()
    at: dict[int, dict[Any, dict[str, Any]]] = {}
    ids = list(range(1, 9))
    gate.block()  # epochs 1.. queue behind a write that waits
    for c in ids:
        for _ in range(25):
            both(job, model, random_op(rng, KEYS, c))
        # reads while every earlier epoch is frozen and not written
        assert job.read_all(KEYS) == model.view(KEYS)
        job.t.snapshot(c, durable=False)
        at[c] = model.snapshot()
        assert job.read_all(KEYS) == model.view(KEYS)
        if c == 4:
            gate.release()  # let some go while more are frozen
    for c in ids:
        job.t.wait_durable(c)
    assert job.read_all(KEYS) == model.view(KEYS)
    for c in [3, 1, 2, 6, 5, 8, 7, 4]:
        job.t.complete(c)
    assert job.read_all(KEYS) == model.view(KEYS)
    assert committed_values(store) == model_values(at[8])
    job.t.crash()
    for c in ids:
        restore_equals(store, options, local_dir, c, at[c], KEYS)


# -- 2. a background write fails with later epochs queued behind it --------------------------
@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("tier", list(TIER_OPTIONS))
def test_failed_write_poisons_the_queue_entries_go_back_next_checkpoint_has_all(
        store_factory, local_dir, kind, tier):
    store = store_factory(kind)
    options = opts(tier)
    rng = random.Random(f"fail-{tier}")
    listener = Recorder()
    job = Job(store, options, local_dir, listener=listener)
    job.t.backend.write_store.write_batch_rows = 4  # several statements per epoch
    model = Model()
    for _ in range(30):
        both(job, model, random_op(rng, KEYS, 0))
    job.t.snapshot(1)
    job.t.complete(1)
    at1 = model.snapshot()
    gate = job.gate()
    gate.block()
    gate.fail_after = 2  # epoch 2 commits two statements, then fails
    for c in (2, 3, 4):
        for _ in range(20):
            both(job, model, random_op(rng, KEYS, c))
        job.t.snapshot(c, durable=False)
        assert job.read_all(KEYS) == model.view(KEYS)
    assert job.writer.queued == 3
    gate.release()
    job.writer.wait_idle(10)
    # nothing settled yet: the frozen epochs still answer reads
    assert job.read_all(KEYS) == model.view(KEYS)
    assert listener.calls == [("durable", 1), ("failed", 2), ("failed", 3), ("failed", 4)]
    assert "injected" in listener.messages[2]
    with pytest.raises((CheckpointError, Injected)):
        job.t.wait_durable(2)
    assert job.protocol.table.frozen_count == 0
    assert job.protocol.table.dirty_count > 0
    assert job.read_all(KEYS) == model.view(KEYS)
    assert my_snapshots(job) == {1}
    # still failing: the next checkpoint fails too and keeps everything
    for _ in range(10):
        both(job, model, random_op(rng, KEYS, 5))
    gate.fail_after = 0
    with pytest.raises((CheckpointError, Injected)):
        job.t.snapshot(5)
    assert job.read_all(KEYS) == model.view(KEYS)
    gate.heal()
    for _ in range(10):
        both(job, model, random_op(rng, KEYS, 6))
    job.t.snapshot(6)
    job.t.complete(6)
    at6 = model.snapshot()
    assert listener.calls[-2:] == [("failed", 5), ("durable", 6)]
    assert my_snapshots(job) == {1, 6}
    assert committed_values(store) == model_values(at6)
    job.t.crash()
    restore_equals(store, options, local_dir, 6, at6, KEYS)
    restore_equals(store, options, local_dir, 1, at1, KEYS)
    for failed in (2, 3, 4, 5):
        with pytest.raises(CheckpointError):
            LocalSubtask(store, options, restored_checkpoint_id=failed, local_dir=local_dir)


# -- 3. crash while the writer is mid-epoch ---------------------------------------------------
@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("tier", ["cache1-local", "cache1-nolocal"])
def test_crash_while_the_writer_is_mid_epoch_restores_the_last_completed_exactly(
        store_factory, local_dir, kind, tier):
    store = store_factory(kind)
    options = opts(tier)
    rng = random.Random(f"crash-{tier}")
    job = Job(store, options, local_dir)
    job.t.backend.write_store.write_batch_rows = 3
    model = Model()
    for _ in range(40):
        both(job, model, random_op(rng, KEYS, 0))
    job.t.snapshot(1)
    job.t.complete(1)
    at1 = model.snapshot()
    gate = job.gate(delay_s=0.05)
    # every key gets a new value: a half-written epoch 2 would show
    for i, key in enumerate(KEYS):
        both(job, model, ("set", key, ("two", i)))
        both(job, model, ("put", key, 99, i))
    job.t.snapshot(2, durable=False)
    wait_until(lambda: job.writer.writing() == 2 and gate.calls >= 2)
    started = time.monotonic()
    job.t.crash()
    assert time.monotonic() - started < 5, "the writer stops at its next statement"
    assert job.writer.writing() is None
    calls = gate.calls
    time.sleep(0.2)
    assert gate.calls == calls, "a crashed writer writes nothing more"
    assert my_snapshots(job) == {1}
    assert committed_values(store) == model_values(at1)
    assert all(rec["checkpoint"] == 1 for rec in store.query_committed("op"))
    with pytest.raises(CheckpointError):
        LocalSubtask(store, options, restored_checkpoint_id=2, local_dir=local_dir)
    restore_equals(store, options, local_dir, 1, at1, KEYS)


@pytest.mark.mysql
def test_crash_while_the_database_is_a_black_hole_mid_epoch(mysql_url, local_dir):
    from conftest import drop_namespace
    from tcp_proxy import TcpProxy, proxied_mysql_url

    from pyflink_ndb.stores import open_store
    from pyflink_ndb.stores.mysql import parse_mysql_url

    server = parse_mysql_url(mysql_url)
    ns = unique_namespace("af")
    storage = CheckpointStorage()
    with TcpProxy(server["host"], server["port"]) as proxy:
        url = proxied_mysql_url(server, proxy)
        options = opts("cache1-local", url=url, namespace=ns, db_socket_timeout_ms=1500,
                       db_retry_deadline_ms=2000, db_retry_max_attempts=2)
        store = open_store(options)
        try:
            rng = random.Random("blackhole")
            job = Job(store, options, local_dir, storage=storage)
            model = Model()
            for _ in range(40):
                both(job, model, random_op(rng, KEYS, 0))
            job.t.snapshot(1)
            job.t.complete(1)
            at1 = model.snapshot()
            for i, key in enumerate(KEYS):
                both(job, model, ("set", key, ("two", i)))
            gate = job.gate()
            gate.block()
            job.t.snapshot(2, durable=False)
            wait_until(gate.entered.is_set)
            proxy.set_black_hole(True)
            proxy.cut_connections()
            gate.release()  # the statement now hangs in the black hole
            time.sleep(0.1)
            job.t.crash()
            proxy.set_black_hole(False)
        finally:
            store.close()
    direct = open_store(NdbStateOptions(url=mysql_url, namespace=ns))
    try:
        assert committed_values(direct) == model_values(at1)
        assert {r.epoch for r in direct.list_snapshots("op")} == {1}
        restore_equals(direct, opts("cache1-local"), local_dir, 1, at1, KEYS,
                       storage=storage)
    finally:
        direct.close()
        drop_namespace(mysql_url, ns)


# -- 4. back-pressure ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", STORES)
def test_back_pressure_blocks_the_snapshot_and_loses_nothing(store_factory, local_dir, kind):
    store = store_factory(kind)
    options = opts("cache1-nolocal", write_max_pending_bytes=3000)
    rng = random.Random("bp")
    job = Job(store, options, local_dir)
    gate = job.gate(delay_s=0.03)
    job.t.backend.write_store.write_batch_rows = 10
    model = Model()
    at = {}
    peak = 0
    for c in range(1, 9):
        for _ in range(30):
            both(job, model, random_op(rng, KEYS, c))
        job.t.snapshot(c, durable=False)
        at[c] = model.snapshot()
        frozen = job.protocol._in_flight
        # the bound holds, except for a single epoch larger than it
        pending = job.writer.pending_bytes
        peak = max(peak, pending)
        assert pending <= 3000 or job.writer.queued <= 1
        assert job.read_all(KEYS) == model.view(KEYS)
        assert len(frozen) >= 1
    assert job.writer.waited_s > 0.02, "the snapshots waited for the writer"
    job.t.backend.drain()
    for c in range(1, 9):
        job.t.complete(c)
    assert gate.calls > 0
    job.t.crash()
    for c in (1, 5, 8):
        restore_equals(store, options, local_dir, c, at[c], KEYS)


# -- 5. a savepoint aborted while its write is still queued -----------------------------------
@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("running", [False, True], ids=["queued", "running"])
def test_savepoint_aborted_while_its_write_is_queued_is_not_listed(
        store_factory, local_dir, kind, running):
    store = store_factory(kind)
    options = opts("cache1-local")
    listener = Recorder()
    job = Job(store, options, local_dir, listener=listener)
    model = Model()
    for i, key in enumerate(KEYS):
        both(job, model, ("set", key, i))
    gate = job.gate()
    gate.block()
    if not running:
        job.t.snapshot(1, durable=False)  # the savepoint queues behind it
        both(job, model, ("set", "k0", "after 1"))
    job.t.snapshot(2, is_savepoint=True, durable=False)
    at2 = model.snapshot()
    both(job, model, ("set", "k1", "after 2"))
    wait_until(gate.entered.is_set)
    job.t.abort(2, wait=False)
    gate.release()
    job.t.backend.drain()
    assert ("durable", 2) in listener.calls  # the write itself succeeded...
    assert 2 not in my_snapshots(job)  # ...and the abort removed it afterwards
    with pytest.raises(CheckpointError):
        LocalSubtask(store, options, restored_checkpoint_id=2, local_dir=local_dir)
    assert job.read_all(KEYS) == model.view(KEYS)
    job.t.snapshot(3)
    job.t.complete(3)
    at3 = model.snapshot()
    assert 2 not in my_snapshots(job)
    job.t.crash()
    restore_equals(store, options, local_dir, 3, at3, KEYS)
    del at2


# -- 6. finish() without checkpointing --------------------------------------------------------
@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("tier", list(TIER_OPTIONS))
def test_finish_without_checkpointing_commits_everything_then_close(
        store_factory, local_dir, kind, tier):
    store = store_factory(kind)
    options = opts(tier)
    rng = random.Random(f"finish-{tier}")
    listener = Recorder()
    job = Job(store, options, local_dir, checkpointing_enabled=False, listener=listener)
    gate = job.gate(delay_s=0.01)
    job.t.backend.write_store.write_batch_rows = 5
    model = Model()
    for _ in range(150):
        both(job, model, random_op(rng, KEYS, 0))
    job.t.backend.finish()
    job.t.close()  # at once after finish (the store stays open for the checks)
    assert gate.calls > 1
    assert listener.calls == [("durable", 1)]
    assert committed_values(store) == model_values(model.state)
    assert {(r.epoch, r.kind) for r in store.list_snapshots("op")} == {(1, "final")}
    assert all(rec["checkpoint"] == 1 for rec in store.query_committed("op"))


@pytest.mark.parametrize("kind", STORES)
def test_finish_without_checkpointing_whose_write_fails_raises(store_factory, local_dir, kind):
    store = store_factory(kind)
    job = Job(store, opts("cache10k"), local_dir, checkpointing_enabled=False)
    for key in KEYS:
        job.t.key(key)
        job.value.update(1)
    gate = job.gate()
    gate.fail_after = 0
    with pytest.raises((CheckpointError, Injected)):
        job.t.backend.finish()
    job.t.close()
    assert committed_values(store) == {}
    assert store.list_snapshots("op") == []


# -- 7. a zombie ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("hook", ["snapshot", "complete"])
def test_zombie_background_write_is_fenced_surfaces_and_stays_invisible(
        store_factory, local_dir, kind, hook):
    store = store_factory(kind)
    options = opts("cache1-local")
    listener = Recorder()
    job_id = "zombie-job"
    zombie = Job(store, options, local_dir, listener=listener, job_id=job_id)
    model = Model()
    for i, key in enumerate(KEYS):
        both(zombie, model, ("set", key, i))
        both(zombie, model, ("put", key, 1, i))
    zombie.t.snapshot(1)
    zombie.t.complete(1)
    at1 = model.snapshot()
    hold = Hold(zombie.t.backend.write_store, "write_versions")
    for key in KEYS:
        zombie.apply(("set", key, "zombie"))
        zombie.apply(("add", key, "zombie"))
    zombie.t.snapshot(2, durable=False)  # held until the replacement claimed
    wait_until(hold.entered.is_set)
    heir = Job(store, options, local_dir, restored=1, attempt=1, job_id=job_id)
    hold.release()
    zombie.writer.wait_idle(10)
    assert listener.calls[-1] == ("failed", 2)
    assert listener.messages[2].startswith("fenced")
    for key in KEYS:
        zombie.apply(("set", key, "zombie again"))
    with pytest.raises(FencedError):
        if hook == "snapshot":
            zombie.t.snapshot(3, durable=False)
        else:
            zombie.t.complete(2)
    assert 2 not in my_snapshots(zombie) and 3 not in my_snapshots(zombie)
    assert heir.read_all(KEYS) == {k: copy.deepcopy(at1.get(k, EMPTY)) for k in KEYS}
    assert committed_values(store) == model_values(at1)
    zombie.t.crash()
    heir.t.snapshot(4)
    heir.t.complete(4)
    assert committed_values(store) == model_values(at1)
    heir.close()
    restore_equals(store, options, local_dir, 4, at1, KEYS)


# -- 8. the durability listener ----------------------------------------------------------------
@pytest.mark.parametrize("kind", STORES)
def test_listener_hears_every_snapshot_once_in_order(store_factory, local_dir, kind):
    store = store_factory(kind)
    options = opts("cache1-local")
    listener = Recorder()
    job = Job(store, options, local_dir, listener=listener)
    gate = job.gate(delay_s=0.005)
    for c in range(1, 4):
        job.apply(("set", "k0", c))
        job.t.snapshot(c, durable=False)
    job.writer.wait_idle(10)
    gate.fail_after = 0
    for c in range(4, 7):
        job.apply(("set", "k0", c))
        job.t.snapshot(c, durable=False)
    job.writer.wait_idle(10)
    gate.heal()
    job.apply(("set", "k0", 7))
    job.t.snapshot(7)  # settles 4-6 (taken back into 7)
    assert listener.calls == [("durable", 1), ("durable", 2), ("durable", 3),
                              ("failed", 4), ("failed", 5), ("failed", 6), ("durable", 7)]
    assert listener.threads and threading.main_thread().name not in listener.threads
    # a normal close drains the queue: every queued epoch becomes durable
    gate.block()
    for c in (8, 9):
        job.apply(("set", "k0", c))
        job.t.snapshot(c, durable=False)
    threading.Timer(0.2, gate.release).start()
    job.t.close()
    assert listener.calls[7:] == [("durable", 8), ("durable", 9)]
    assert {8, 9} <= my_snapshots(job)


@pytest.mark.parametrize("kind", STORES)
def test_listener_cancel_reports_the_running_and_the_queued_epochs_failed_in_order(
        store_factory, local_dir, kind):
    """A cancel (crash) stops the writer at once: the epoch it is writing and the queued
    ones are each reported once, as failed, in checkpoint order (the Java listener would
    fail the rest at close anyway, but no report may come twice or out of order)."""
    store = store_factory(kind)
    listener = Recorder()
    job = Job(store, opts("cache1-local"), local_dir, listener=listener)
    job.apply(("set", "k0", 0))
    job.t.snapshot(1)
    gate = job.gate()
    gate.block()
    for c in (2, 3, 4):
        job.apply(("set", "k0", c))
        job.t.snapshot(c, durable=False)
    wait_until(gate.entered.is_set)
    threading.Timer(0.3, gate.release).start()
    job.t.crash()
    time.sleep(0.3)
    assert listener.calls == [("durable", 1), ("failed", 2), ("failed", 3), ("failed", 4)]
    assert my_snapshots(job) == {1}


@pytest.mark.parametrize("kind", STORES)
def test_wait_durable_of_a_durable_checkpoint_ignores_a_later_failure(
        store_factory, local_dir, kind):
    """LocalSubtask.wait_durable(c) must not raise when c was durable and only a later,
    still unsettled checkpoint failed."""
    store = store_factory(kind)
    job = Job(store, opts("cache10k"), local_dir)
    gate = job.gate()
    gate.block()
    gate.fail_after = 1  # epoch 1 (one statement) is written, epoch 2 fails
    job.apply(("set", "k0", 1))
    job.t.snapshot(1, durable=False)
    job.apply(("set", "k0", 2))
    job.t.snapshot(2, durable=False)
    gate.release()
    job.writer.wait_idle(10)
    job.t.wait_durable(1)  # durable: no error
    assert my_snapshots(job) == {1}
    with pytest.raises((CheckpointError, Injected)):
        job.t.wait_durable(2)  # failed, even though wait_durable(1) settled it
    gate.heal()
    job.apply(("set", "k1", 3))
    job.t.snapshot(3)
    job.t.complete(3)
    assert committed_values(store) == {"k0": 2, "k1": 3}


# -- 9. TTL, oversized values, the ListState rewrite path --------------------------------------
def ttl_descriptors(ttl_ms: int) -> tuple[Any, Any]:
    cfg = StateTtlConfig.new_builder(Time.milliseconds(ttl_ms)).build()
    v = ValueStateDescriptor("tv", ANY)
    v.enable_time_to_live(cfg)
    lst = ListStateDescriptor("tl", ANY)
    lst.enable_time_to_live(cfg)
    return v, lst


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("tier", ["cache1-local", "cache1-nolocal"])
def test_ttl_states_expire_while_epochs_are_in_flight_and_after_restore(
        store_factory, local_dir, kind, tier):
    store = store_factory(kind)
    options = opts(tier)
    clock = ManualClock()
    t = LocalSubtask(store, options, clock=clock, local_dir=local_dir)
    vd, ld = ttl_descriptors(1000)
    v = t.context.get_state(vd)
    lst = t.context.get_list_state(ld)
    gate = Gate(t.backend.write_store, delay_s=0.01)
    gate.block()
    keys = [f"t{i}" for i in range(8)]
    for i, k in enumerate(keys):  # written at 0 ms
        t.key(k)
        v.update(i)
        lst.add(i)
    t.snapshot(1, durable=False)
    clock.advance(600)
    for i, k in enumerate(keys[:4]):  # rewritten at 600 ms
        t.key(k)
        v.update(i + 100)
        lst.add(i + 100)
    t.snapshot(2, durable=False)
    clock.advance(600)  # 1200 ms: the first writes expired, the second ones not
    for i, k in enumerate(keys):
        t.key(k)
        assert v.value() == (i + 100 if i < 4 else None)
        assert lst.get() == ([i + 100] if i < 4 else [])
    gate.release()
    t.wait_durable(1)
    t.wait_durable(2)
    t.complete(1)
    t.complete(2)
    t.crash()
    for restored in (1, 2):
        r = LocalSubtask(store, options, clock=clock, local_dir=local_dir,
                         restored_checkpoint_id=restored)
        rv = r.context.get_state(vd)
        rl = r.context.get_list_state(ld)
        for i, k in enumerate(keys):
            r.key(k)
            live = restored == 2 and i < 4
            assert rv.value() == (i + 100 if live else None), (restored, k)
            assert rl.get() == ([i + 100] if live else []), (restored, k)
        r.close()


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("tier", ["cache1-local", "cache1-nolocal"])
def test_value_too_large_is_raised_at_update_and_the_async_checkpoint_is_unharmed(
        store_factory, local_dir, kind, tier):
    store = store_factory(kind)
    options = opts(tier, value_max_bytes=200)
    job = Job(store, options, local_dir)
    model = Model()
    for i, k in enumerate(KEYS):
        both(job, model, ("set", k, i))
        both(job, model, ("add", k, i))
        both(job, model, ("put", k, 1, i))
    job.t.snapshot(1, durable=False)
    big = "x" * 500
    for k in KEYS[:3]:
        job.t.key(k)
        with pytest.raises(ValueTooLargeError):
            job.value.update(big)
        with pytest.raises(ValueTooLargeError):
            job.map.put(2, big)
        with pytest.raises(ValueTooLargeError):
            job.list.add(big)
        with pytest.raises(ValueTooLargeError):
            job.list.update([1, big])
        for _ in range(10):  # the list grows past the limit: the add that would fail
            try:
                job.list.add("y" * 30)
            except ValueTooLargeError:
                break
            model.apply(("add", k, "y" * 30))
    assert job.read_all(KEYS) == model.view(KEYS)
    job.t.snapshot(2, durable=False)
    job.t.wait_durable(1)
    job.t.wait_durable(2)
    job.t.complete(2)
    at2 = model.snapshot()
    job.t.crash()
    restore_equals(store, options, local_dir, 2, at2, KEYS)


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("tier", list(TIER_OPTIONS))
def test_list_state_segments_and_rewrites_across_in_flight_epochs(
        store_factory, local_dir, kind, tier, monkeypatch):
    """Appends across many epochs make one segment each (no segment counts as small here)
    until the list is rewritten into one (MAX_SEGMENTS); update() rewrites too; all with
    earlier epochs still in flight and one failing in the background."""
    from pyflink_ndb.state import list as list_state
    from pyflink_ndb.state.list import MAX_SEGMENTS

    monkeypatch.setattr(list_state, "SMALL_SEGMENT_BYTES", 0)

    store = store_factory(kind)
    options = opts(tier)
    listener = Recorder()
    job = Job(store, options, local_dir, listener=listener)
    gate = job.gate()
    model = Model()
    at: dict[int, Any] = {}
    keys = ["L0", "L1", "L2"]
    c = 0
    for round_ in range(MAX_SEGMENTS + 8):
        c += 1
        for k in keys:
            both(job, model, ("add", k, (round_, k)))
        if round_ % 11 == 5:
            both(job, model, ("lupdate", "L1", [round_] * 3))
        if round_ % 4 == 0:
            gate.block()
        if round_ == 20:
            gate.release()
            job.t.backend.drain()
            gate.fail_after = 0  # this epoch fails in the background
        job.t.snapshot(c, durable=False)
        assert job.read_all(keys) == model.view(keys), round_
        if round_ == 20:
            gate.release()
            with pytest.raises((CheckpointError, Injected)):
                job.t.wait_durable(c)
            gate.heal()
        else:
            at[c] = model.snapshot()
        if round_ % 4 == 2:
            gate.release()
    gate.release()
    job.t.backend.drain()
    job.t.complete(c)
    assert job.read_all(keys) == model.view(keys)
    assert [cid for what, cid in listener.calls if what == "failed"] == [21]
    job.t.crash()
    for restored in (3, MAX_SEGMENTS, MAX_SEGMENTS + 2, c):
        restore_equals(store, options, local_dir, restored, at[restored], keys)


# -- 10. the writer renders while the task thread keeps writing the same keys ------------------
@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("tier", list(TIER_OPTIONS))
def test_hammer_render_while_the_task_thread_writes_the_same_keys(
        store_factory, local_dir, kind, tier):
    store = store_factory(kind)
    options = opts(tier, checkpoints_retained=2)
    rng = random.Random(f"hammer-{tier}-{kind}")
    job = Job(store, options, local_dir)
    job.t.backend.write_store.write_batch_rows = 7
    model = Model()
    keys = [f"h{i}" for i in range(20)]
    completed: dict[int, Any] = {}
    durable_ids: list[int] = []
    rounds = 120
    for c in range(1, rounds + 1):
        for _ in range(15):
            both(job, model, random_op(rng, keys, c))
        job.t.snapshot(c, durable=False)
        at = model.snapshot()
        for k in rng.sample(keys, 3):  # the writer renders c meanwhile
            assert job.read(k) == model.view([k])[k], (c, k)
        for _ in range(15):  # the same keys again, while c is rendered
            both(job, model, random_op(rng, keys, c))
        if c % 10 == 0:
            job.t.wait_durable(c)
            durable_ids.append(c)
            job.t.complete(c, wait=c % 20 == 0)
            completed[c] = at
        if c % 25 == 0:
            assert job.read_all(keys) == model.view(keys), c
    job.t.backend.drain()
    assert job.protocol.epochs_failed == 0
    assert job.read_all(keys) == model.view(keys)
    last = durable_ids[-1]
    assert committed_values(store) == model_values(completed[last])
    job.t.crash()
    restore_equals(store, options, local_dir, last, completed[last], keys)
    restore_equals(store, options, local_dir, durable_ids[-2], completed[durable_ids[-2]],
                   keys)


def test_a_refused_restore_releases_the_writer_connection_and_tier_2(store_factory, local_dir):
    """A restore that fails at open (snapshot no longer restorable) leaves no second
    connection and no RocksDB folder behind."""
    import os

    from pyflink_ndb.errors import CheckpointError as Refused
    from pyflink_ndb.testing import LocalSubtask as Sub

    store = store_factory("sqlite")
    first = Sub(store, NdbStateOptions(), local_dir=local_dir)
    first.checkpoint(1)
    first.close()
    store.drop_tables()
    store.open()
    before = set(os.listdir(local_dir)) if os.path.exists(local_dir) else set()
    with pytest.raises(Refused):
        Sub(store, NdbStateOptions(), restored_checkpoint_id=1, local_dir=local_dir)
    leftovers = []
    for root, dirs, _ in os.walk(local_dir):
        leftovers += [os.path.join(root, d) for d in dirs if d.startswith("op-")]
    assert not [d for d in leftovers if os.path.basename(d) not in before], leftovers


def test_the_writer_sleeps_as_long_as_the_cpu_time_it_used_since_its_last_yield(monkeypatch):
    from pyflink_ndb.checkpoint import writer as writer_module
    from pyflink_ndb.checkpoint.writer import BackgroundWriter

    cpu = iter([10.0, 10.0, 10.004, 10.004, 10.5, 10.5, 10.5, 10.5])
    slept: list[float] = []
    monkeypatch.setattr(writer_module.time, "thread_time", lambda: next(cpu))
    monkeypatch.setattr(writer_module.time, "sleep", slept.append)
    writer = BackgroundWriter("pace", 1 << 20)
    # The pause waits on the close event (a close ends it); no time.sleep, not even 0.
    monkeypatch.setattr(writer._closing, "wait", lambda s: slept.append(s) or False)
    writer._cpu_mark = 9.99
    writer.check_cancelled()  # 10 ms of CPU since the mark
    writer.check_cancelled()  # 4 ms
    writer.check_cancelled()  # 496 ms: capped
    writer.check_cancelled()  # nothing used: no pause
    assert slept == pytest.approx([0.01 * writer_module.WRITER_PACE,
                                   0.004 * writer_module.WRITER_PACE,
                                   writer_module.MAX_PACE_SLEEP_S])
    writer.pace = lambda: writer_module.WRITER_PACE_WITH_PROCESS  # the write process's
    slept.clear()
    cpu = iter([20.0, 20.0, 20.3, 20.3])
    writer._cpu_mark = 19.99
    writer.check_cancelled()  # 10 ms of CPU since the mark
    writer.check_cancelled()  # 300 ms
    # No pause and no yield: under the task threads' load, taking the GIL back after a
    # yield waited up to a switch interval (5 ms), every 256 rows the writer read.
    assert slept == []


def test_a_close_ends_the_writers_pacing_pause_at_once(monkeypatch):
    """A cancelled task's close waits for the writer (Flink deploys the next attempt
    after it): a pause of the writer's pacing ends when the close comes, and the job stops
    there, instead of sleeping its pause out first."""
    from pyflink_ndb.checkpoint import writer as writer_module
    from pyflink_ndb.checkpoint.writer import BackgroundWriter, WriteCancelled

    writer = BackgroundWriter("pace-close", 1 << 20)
    writer._cpu_mark = -1.0  # a second of CPU on the new thread's clock: the longest pause
    outcome: list[object] = []

    def pace() -> None:
        started = time.perf_counter()
        try:
            writer.check_cancelled()
            outcome.append("no cancel")
        except WriteCancelled:
            outcome.append(time.perf_counter() - started)
    monkeypatch.setattr(writer_module, "MAX_PACE_SLEEP_S", 5.0)
    thread = threading.Thread(target=pace)
    thread.start()
    time.sleep(0.1)
    writer.close()
    thread.join(2)
    assert not thread.is_alive() and len(outcome) == 1
    assert isinstance(outcome[0], float) and outcome[0] < 1.0, outcome


# -- 11. closing a subtask does not wait for background work (found by bench part 8) ------------
def test_a_drained_close_waits_for_writes_but_not_for_background_jobs():
    """Stop-with-savepoint drains the writer: its checkpoint writes finish, but the pages
    of a background prefetch (each queues the next) are dropped instead of holding the
    task's end back."""
    from pyflink_ndb.checkpoint.writer import BackgroundWriter, Job

    writer = BackgroundWriter("drain", 1 << 20)
    pages: list[int] = []

    def page() -> None:  # 100 pages of 0.1 s, each queueing the next, as a prefetch does
        writer.check_cancelled()
        time.sleep(0.1)
        pages.append(len(pages))
        if len(pages) < 100:
            writer.submit(Job(page, name="prefetch page", background=True,
                              skip_at_drain=True))

    written: list[str] = []
    writer.submit(Job(page, name="prefetch page", background=True, skip_at_drain=True))
    while not pages:
        time.sleep(0.01)
    writer.submit(Job(lambda: written.append("epoch"), checkpoint_id=7, name="write"))
    started = time.monotonic()
    assert writer.wait_idle(30, foreground_only=True)
    writer.close()
    assert time.monotonic() - started < 2
    assert written == ["epoch"], "the checkpoint write ran before the close"
    assert len(pages) < 20, "the rest of the prefetch was dropped"


def start_slow_collection(t: LocalSubtask, v: Any) -> Callable[[Any], Any]:
    """Write 20,000 entries into `t`'s ValueState `v` twice (checkpoints 1, not completed,
    and 2), with a ledger that knows no entry complete and a store whose version reads
    cost 30 ms per 100 entries (a slow database): completing checkpoint 2 starts a
    garbage-collection run of about 6 s. Returns once it reads; returns the store's real
    `read_versions` (to put back)."""
    protocol = t.backend.protocol
    protocol.ledger.forgot = True  # no entry is known complete: GC reads versions
    for i in range(20_000):
        t.key(i)
        v.update(i)
    t.snapshot(1)  # not completed: no collection yet
    reading = threading.Event()
    real = protocol.wstore.read_versions

    def slow_read(refs):
        reading.set()
        time.sleep(0.03 * len(refs) / 100)
        return real(refs)

    protocol.wstore.read_versions = slow_read
    for i in range(20_000):
        t.key(i)
        v.update(-i)
    t.snapshot(2)
    t.complete(2, wait=False)  # garbage collection starts
    assert reading.wait(30), "garbage collection started"
    return real


def check_restored_after_slow_collection(store: StateStore, local_dir: str) -> None:
    """A subtask restored from checkpoint 2 of :func:`start_slow_collection` reads the
    values that checkpoint wrote."""
    r = LocalSubtask(store, opts("cache10k"), local_dir=local_dir, restored_checkpoint_id=2)
    v = r.context.get_state(ValueStateDescriptor("v", ANY))
    for i in (0, 1, 19_999):
        r.key(i)
        assert v.value() == -i
    r.close()


@pytest.mark.parametrize("kind", STORES)
def test_a_crash_during_garbage_collection_stops_it_at_its_next_yield(
        store_factory, local_dir, kind):
    """A cancelled subtask's close waits for a garbage-collection run only up to its next
    yield: here the run must read the stored versions of 20,000 entries (the ledger forgot
    some) at 30 ms per 100 (a slow database), 6 s in all."""
    store = store_factory(kind)
    t = LocalSubtask(store, opts("cache10k"), local_dir=local_dir)
    v = t.context.get_state(ValueStateDescriptor("v", ANY))
    start_slow_collection(t, v)
    started = time.monotonic()
    t.crash()
    assert time.monotonic() - started < 1.5
    check_restored_after_slow_collection(store, local_dir)


def _slow_in_server(wstore: Any, name: str, outcome: list[BaseException]) -> threading.Event:
    """Make `wstore.<name>` first wait 5 s in the server (`SELECT SLEEP(5)` on the writer's
    own connection, as a cold read, a lock wait or a large batch would); returns the event
    set once the statement was sent. The error that ends it goes into `outcome`."""
    real = getattr(wstore, name)
    in_server = threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Any:
        in_server.set()
        try:
            wstore._read("slow statement", "SELECT SLEEP(5)")
        except BaseException as err:
            outcome.append(err)
            raise
        return real(*args, **kwargs)

    setattr(wstore, name, slow)
    return in_server


@pytest.mark.mysql
def test_a_crash_interrupts_a_statement_the_database_is_slow_to_answer(
        store_factory, local_dir):
    """A cancelled subtask's close does not wait for the database to answer the
    statement in flight (Flink deploys the next attempt only once it is closed): here
    garbage collection's read of versions waits 5 s in the server (`SLEEP(5)` on the
    writer's own connection, as a read of cold pages or a lock wait would). The close
    interrupts it, the interrupted read is not retried, the server ends the statement
    too, and the restored attempt reads the committed values."""
    store = store_factory("mysql")
    t = LocalSubtask(store, opts("cache10k"), local_dir=local_dir)
    v = t.context.get_state(ValueStateDescriptor("v", ANY))
    protocol = t.backend.protocol
    wstore = protocol.wstore
    start_slow_collection(t, v)
    outcome: list[BaseException] = []
    in_server = _slow_in_server(wstore, "read_versions", outcome)
    assert in_server.wait(30), "the collection run read again"
    time.sleep(0.2)  # in the server now
    started = time.monotonic()
    t.crash()
    took = time.monotonic() - started
    assert took < 1.0, f"the close waited {took:.2f} s for the statement"
    assert not protocol.writer.alive
    assert outcome and "error 2013" in str(outcome[0]), outcome
    assert wstore.retries == 0, "an interrupted statement is not retried"
    # The server ends the statement too (KILL CONNECTION): it would otherwise run its 5 s
    # and keep its locks.
    deadline = time.monotonic() + 3
    while store._query("SELECT COUNT(*) FROM information_schema.processlist WHERE "
                       "info = 'SELECT SLEEP(5)'")[0][0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert time.monotonic() < deadline, "the interrupted statement ran on in the server"
    check_restored_after_slow_collection(store, local_dir)


@pytest.mark.mysql
def test_a_crash_interrupts_a_checkpoint_write_at_once(store_factory, local_dir,
                                                      monkeypatch):
    """A cancelled or failed subtask's close interrupts its writer's statement at once,
    a checkpoint write's too (its checkpoint fails anyway; Flink deploys the next attempt
    only after the close): with the grace of a drained close raised to 5 s, the crash
    still returns within a second, and the checkpoint is reported cancelled (not a lost
    database). The next attempt restores the last completed checkpoint."""
    monkeypatch.setattr(writer_module, "INTERRUPT_AFTER_SECONDS", 5.0)
    store = store_factory("mysql")
    listener = Recorder()
    t = LocalSubtask(store, opts("cache10k", write_process="false"), local_dir=local_dir,
                     listener=listener)
    v = t.context.get_state(ValueStateDescriptor("v", ANY))
    for i in range(100):
        t.key(i)
        v.update(i)
    t.snapshot(1)
    t.complete(1)
    outcome: list[BaseException] = []
    in_server = _slow_in_server(t.backend.protocol.wstore, "insert_snapshot", outcome)
    for i in range(100):
        t.key(i)
        v.update(-i)
    t.snapshot(2, durable=False)  # its write waits in the server before its snapshot row
    assert in_server.wait(30), "checkpoint 2's write reached its snapshot row"
    time.sleep(0.2)  # in the server now
    started = time.monotonic()
    t.crash()
    took = time.monotonic() - started
    assert took < 1.0, f"the close waited {took:.2f} s for the checkpoint's statement"
    assert outcome and "error 2013" in str(outcome[0]), outcome
    # Flink is told the checkpoint was cancelled, not that the database was lost.
    assert ("failed", 2) in listener.calls, listener.calls
    assert "closed before it was written" in listener.messages[2], listener.messages
    r = LocalSubtask(store, opts("cache10k"), local_dir=local_dir, restored_checkpoint_id=1)
    rv = r.context.get_state(ValueStateDescriptor("v", ANY))
    for i in (0, 1, 99):
        r.key(i)
        assert rv.value() == i
    r.close()


@pytest.mark.mysql
def test_a_drained_close_interrupts_garbage_collection_at_once(store_factory, local_dir,
                                                              monkeypatch):
    """A drained close (bounded input, stop-with-savepoint) lets checkpoint work end but
    interrupts a background statement at once: garbage collection's read of versions
    waits 5 s in the server, the grace of checkpoint work is raised to 5 s, and the close
    returns within a second and a half. Whoever restores adopts the entries."""
    monkeypatch.setattr(writer_module, "INTERRUPT_AFTER_SECONDS", 5.0)
    store = store_factory("mysql")
    t = LocalSubtask(store, opts("cache10k"), local_dir=local_dir)
    v = t.context.get_state(ValueStateDescriptor("v", ANY))
    start_slow_collection(t, v)
    outcome: list[BaseException] = []
    in_server = _slow_in_server(t.backend.protocol.wstore, "read_versions", outcome)
    assert in_server.wait(30), "the collection run read again"
    time.sleep(0.2)  # in the server now
    started = time.monotonic()
    t.close()
    took = time.monotonic() - started
    assert took < 1.5, f"the drained close waited {took:.2f} s for garbage collection"
    assert outcome and "error 2013" in str(outcome[0]), outcome
    check_restored_after_slow_collection(store, local_dir)


def test_a_checkpoint_job_preempts_a_preemptible_background_job_at_its_next_yield():
    """A preemptible background job (garbage collection) gives way at its next yield when
    a checkpoint's write or completion is queued; a background job that is not
    preemptible (a prefetch page) runs to its end first."""
    from pyflink_ndb.checkpoint.writer import BackgroundWriter, Job, Preempted

    writer = BackgroundWriter("preempt", 1 << 20)
    events: list[str] = []
    started = threading.Event()

    def long_run(name: str) -> None:  # 5 s of work in steps of 10 ms, yielding between
        started.set()
        try:
            for _ in range(500):
                writer.check_cancelled()
                time.sleep(0.01)
        except Preempted:
            events.append(f"{name} preempted")
            raise
        events.append(f"{name} done")

    writer.submit(Job(lambda: long_run("gc"), name="gc", background=True, preemptible=True))
    assert started.wait(5)
    t0 = time.monotonic()
    writer.submit(Job(lambda: events.append("write"), checkpoint_id=3, name="write"))
    assert writer.wait_for(lambda: "write" in events, 10)
    assert time.monotonic() - t0 < 1, "the write waited for the whole run"
    assert events == ["gc preempted", "write"]
    assert writer.wait_idle(10)
    assert not [o for o in writer.take_outcomes() if o.error is not None]

    events.clear()
    started.clear()
    writer.submit(Job(lambda: long_run("page"), name="page", background=True))
    assert started.wait(5)
    writer.submit(Job(lambda: events.append("write"), checkpoint_id=4, name="write"))
    assert writer.wait_idle(20)
    assert events == ["page done", "write"]
    writer.close()


@pytest.mark.parametrize("kind", STORES)
def test_a_checkpoint_write_does_not_wait_for_a_garbage_collection_run(
        store_factory, local_dir, kind):
    """A garbage-collection run that must read the versions of 20,000 entries (30 ms per
    100: a slow database, 6 s in all) gives way to the next checkpoint's write, then goes
    on: the write is durable within a few reads, and the collection still ends with one
    version per entry once retention allows."""
    store = store_factory(kind)
    t = LocalSubtask(store, NdbStateOptions(cache_max_entries=10_000, checkpoints_retained=1),
                     local_dir=local_dir)
    v = t.context.get_state(ValueStateDescriptor("v", ANY))
    real = start_slow_collection(t, v)
    t.key(0)
    v.update(7)
    started = time.monotonic()
    t.snapshot(3)  # waits until durable
    assert time.monotonic() - started < 2, "the write waited for the collection run"
    t.backend.protocol.wstore.read_versions = real
    t.complete(3)  # waits for the writer, the collection included
    for cid in (4, 5):
        t.key(1)
        v.update(cid)
        t.checkpoint(cid)
    # Retained: checkpoints 4 and 5 (+1 for readers: 3). Keys 2..19,999 have one version.
    rows = store.count_rows()
    assert rows <= 20_000 + 6, rows
    r_values = {}
    for i in (0, 1, 2, 19_999):
        t.key(i)
        r_values[i] = v.value()
    assert r_values == {0: 7, 1: 5, 2: -2, 19_999: -19_999}
    t.close()
