"""Task-local recovery (`local.recovery`) against the same run without it (a breaker, 12-07).

A random sequence of state operations (ValueState and ListState with TTL, MapState with
TTL refreshed on read, ReducingState), clock advances, checkpoints (completed and heard,
completed but the notification lost, never completed, aborted, failed in the background
write), savepoints, and crashes followed by a restore (Flink's failover to the latest
completed checkpoint, or a new job from any completed snapshot) runs twice on fresh
namespaces: with `local.recovery` (the default) and with `local_recovery=False`. Every
read (every key after each restore, and random reads in between) must give the same
answer in both runs. Tiny tier-1 caches keep entries moving between tier 1 and tier 2.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import uuid
from collections import Counter
from typing import Any

from conftest import drop_namespace, fast_tmpdir, unique_namespace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyflink.common import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import CheckpointError
from pyflink_ndb.stores import open_store
from pyflink_ndb.testing import LocalSubtask, ManualClock, crash_open_subtasks
from pyflink_ndb.tiers import handover

ANY = Types.PICKLED_BYTE_ARRAY()
TTL_MS = 100
KEYS = ["a", "b", "c", 4, 5]
MAP_KEYS = [0, 1, 2, 3]
STATS: Counter[str] = Counter()
#: Wait for each restore's key filter build (restore.key-filter) before its first read.
AWAIT_KEY_FILTER = False


def ttl(update: Any) -> StateTtlConfig:
    return (StateTtlConfig.new_builder(Time.milliseconds(TTL_MS)).set_update_type(update)
            .set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired).build())


def declare(t: LocalSubtask) -> dict[str, Any]:
    ctx = t.context
    v = ValueStateDescriptor("v", ANY)
    v.enable_time_to_live(ttl(StateTtlConfig.UpdateType.OnCreateAndWrite))
    m = MapStateDescriptor("m", ANY, ANY)
    m.enable_time_to_live(ttl(StateTtlConfig.UpdateType.OnReadAndWrite))
    lt = ListStateDescriptor("lt", ANY)
    lt.enable_time_to_live(ttl(StateTtlConfig.UpdateType.OnCreateAndWrite))
    return {
        "v": ctx.get_state(v),
        "v2": ctx.get_state(ValueStateDescriptor("v2", ANY)),
        "m": ctx.get_map_state(m),
        "m2": ctx.get_map_state(MapStateDescriptor("m2", ANY, ANY)),
        "l": ctx.get_list_state(ListStateDescriptor("l", ANY)),
        "lt": ctx.get_list_state(lt),
        "r": ctx.get_reducing_state(ReducingStateDescriptor("r", lambda a, b: a + b,
                                                            Types.LONG())),
    }


keys = st.sampled_from(KEYS)
map_keys = st.sampled_from(MAP_KEYS)
vals = st.integers(0, 50)
state_op = st.one_of(
    st.tuples(st.sampled_from(["v", "v2"]), keys, vals),
    st.tuples(st.sampled_from(["v_clear", "v2_clear", "m_clear", "m2_clear", "l_clear",
                               "lt_clear", "r_clear", "read", "m_iter_put"]), keys),
    st.tuples(st.sampled_from(["m_put", "m2_put"]), keys, map_keys, vals),
    st.tuples(st.sampled_from(["m_rm", "m2_rm", "m_get"]), keys, map_keys),
    st.tuples(st.sampled_from(["l_add", "lt_add", "r_add"]), keys, vals),
    st.tuples(st.sampled_from(["l_update", "lt_update"]), keys, st.lists(vals, max_size=3)),
    st.tuples(st.just("adv"), st.sampled_from([10, 40, 90, 150])),
)
control_op = st.one_of(
    st.tuples(st.just("ckpt"), st.sampled_from(["heard", "heard", "lost", "pending",
                                                "abort", "fail", "late", "inflight"])),
    st.tuples(st.just("sp"), st.booleans()),
    st.tuples(st.just("crash"), st.integers(0, 6)),
)
program = st.lists(st.one_of(state_op, state_op, state_op, control_op), min_size=5,
                   max_size=60)


class Run:
    """One run of the program on its own namespace."""

    def __init__(self, url: str, tmp: str, opts: NdbStateOptions) -> None:
        self.url = url
        self.store = open_store(NdbStateOptions(url=url, namespace=unique_namespace("lr")))
        self.tmp = tmp
        self.opts = opts
        self.clock = ManualClock()
        self.job = uuid.uuid4().hex
        self.attempt = 0
        self.next_id = 1
        #: Completed snapshots (checkpoint id, kind), oldest first.
        self.completed: list[tuple[int, str]] = []
        self.latest_checkpoint = 0
        self.late: list[int] = []
        self.obs: list[Any] = []
        self.takeovers = 0
        self.t = LocalSubtask(self.store, opts, local_dir=tmp, job_id=self.job,
                              clock=self.clock)
        self.s = declare(self.t)
        # A first completed checkpoint: a failover always has something to restore.
        self.checkpoint("heard")

    # -- operations -----------------------------------------------------------------
    def read(self, key: Any) -> Any:
        self.t.key(key)
        s = self.s
        return (key, s["v"].value(), s["v2"].value(), sorted(s["m"].items()),
                sorted(s["m2"].items()), list(s["l"].get() or []),
                list(s["lt"].get() or []), s["r"].get())

    def op(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "adv":
            self.clock.advance(op[1])
            return
        if kind == "ckpt":
            self.checkpoint(op[1])
            return
        if kind == "sp":
            self.savepoint(op[1])
            return
        if kind == "crash":
            self.crash(op[1])
            return
        key = op[1]
        self.t.key(key)
        s = self.s
        if kind in ("v", "v2"):
            s[kind].update(op[2])
        elif kind.endswith("_clear"):
            s[kind[:-6]].clear()
        elif kind == "read":
            self.obs.append(("read", self.read(key)))
        elif kind == "m_iter_put":  # iterate and change entries while iterating
            for mk, v in list(s["m"].items()):
                s["m"].put(mk, v + 1)
            self.obs.append(("iter", key, sorted(s["m2"].keys())))
        elif kind in ("m_put", "m2_put"):
            s[kind[:-4]].put(op[2], op[3])
        elif kind in ("m_rm", "m2_rm"):
            s[kind[:-3]].remove(op[2])
        elif kind == "m_get":
            self.obs.append(("get", key, s["m"].get(op[2]), s["m"].contains(op[2])))
        elif kind in ("l_add", "lt_add", "r_add"):
            s[kind[:-4]].add(op[2])
        elif kind in ("l_update", "lt_update"):
            s[kind[:-7]].update(op[2])
        else:
            raise AssertionError(kind)

    def checkpoint(self, mode: str) -> None:
        cid = self.next_id
        self.next_id += 1
        if mode == "fail":
            store = self.t.backend.write_store or self.t.backend.store
            self.t.backend.protocol.writer.wait_idle(60)
            real = store._replace_state_rows

            def flaky(text: str, rows: Any) -> None:
                raise OSError("injected: the background write dies")

            store._replace_state_rows = flaky  # type: ignore[method-assign]
            try:
                try:  # inline writer (write.async false): the snapshot itself fails
                    self.t.snapshot(cid, durable=False)
                    self.t.wait_durable(cid)
                    failed = False
                except CheckpointError:
                    failed = True
            finally:
                store._replace_state_rows = real  # type: ignore[method-assign]
            if failed:
                self.t.abort(cid)
                return
            mode = "heard"
        elif mode == "inflight":  # the write goes on while the task does (then a crash)
            self.t.snapshot(cid, durable=False)
            return
        else:
            self.t.snapshot(cid)
        if mode == "abort":
            self.t.abort(cid)
            return
        if mode == "pending":
            return
        self.completed.append((cid, "checkpoint"))
        self.latest_checkpoint = cid
        if mode == "heard":
            for late in self.late:
                self.t.complete(late)
            self.late = []
            self.t.complete(cid)
        elif mode == "late":
            self.late.append(cid)  # heard with the next heard checkpoint
        # "lost": Flink completed it, the subtask never hears of it

    def savepoint(self, heard: bool) -> None:
        cid = self.next_id
        self.next_id += 1
        self.t.snapshot(cid, is_savepoint=True)
        self.completed.append((cid, "savepoint"))
        if heard:
            self.t.complete(cid)

    def crash(self, choice: int) -> None:
        self.t.crash()
        self.late = []
        if choice <= 2:  # failover: the job's latest completed checkpoint
            target, new_job = self.latest_checkpoint, False
        else:  # a new job from some completed snapshot (the newest ones mostly)
            target = self.completed[-1 - (choice - 3) % len(self.completed)][0]
            new_job = True
        try:
            self.restore(target, new_job)
        except CheckpointError as err:  # not restorable (retention): fail over instead
            self.obs.append(("unrestorable", target, type(err).__name__))
            self.restore(self.latest_checkpoint, False)

    def restore(self, target: int, new_job: bool) -> None:
        if new_job:
            job, attempt = uuid.uuid4().hex, 0
        else:
            job, attempt = self.job, self.attempt + 1
        t = LocalSubtask(self.store, self.opts, local_dir=self.tmp, job_id=job,
                         attempt=attempt, restored_checkpoint_id=target, clock=self.clock)
        self.t, self.job, self.attempt = t, job, attempt
        self.s = declare(t)
        if AWAIT_KEY_FILTER and t.backend.key_filter_build is not None:
            assert t.backend.protocol.writer.wait_idle(60)
        if t.backend.protocol.taken_over is not None:
            self.takeovers += 1
        if new_job:
            # Flink continues the checkpoint ids of a job started from a snapshot at its
            # id + 1; its failovers restore its own completed checkpoints (or the start).
            self.next_id = target + 1
            self.completed = [c for c in self.completed if c[0] <= target]
            self.latest_checkpoint = target
            self.checkpoint("heard")
        self.obs.append(("restored", target, [self.read(k) for k in KEYS]))

    def close(self) -> None:
        self.t.crash()
        handover.discard_all(under=self.tmp)
        ns = self.store.namespace
        if self.url.startswith("sqlite"):
            self.store.drop_tables()
            self.store.close()
        else:
            self.store.close()
            drop_namespace(self.url, ns)


def run_program(url: str, ops: list[tuple[Any, ...]], opts: NdbStateOptions
                ) -> tuple[list[Any], int]:
    tmp = fast_tmpdir("pyflink-ndb-breaker-lr-")
    run = None
    try:
        run = Run(url, tmp, opts)
        for op in ops:
            run.op(op)
        # Always end with a crash and a failover (the interesting moment).
        run.op(("crash", 0))
        return run.obs, run.takeovers
    finally:
        if run is not None:
            run.close()
        crash_open_subtasks(under=tmp)
        handover.discard_all(under=tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def differential(url: str, ops: list[tuple[Any, ...]], opts: NdbStateOptions) -> None:
    want, none = run_program(url, ops, dataclasses.replace(opts, local_recovery=False))
    assert none == 0
    got, takeovers = run_program(url, ops, opts)
    STATS["take-overs"] += takeovers
    STATS["programs"] += 1
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, (f"observation {i} differs with local.recovery:\n  got  {g}\n  "
                        f"want {w}\nprogram: {ops}")


options = st.builds(
    lambda cache, mode, wasync: NdbStateOptions(
        cache_max_entries=cache, checkpoints_retained=3, restore_mode=mode,
        write_async=wasync),
    st.integers(1, 4), st.sampled_from(["lazy", "lazy", "eager", "background"]),
    st.booleans())


@settings(max_examples=int(os.environ.get("BREAKER_LR_EXAMPLES", "60")), deadline=None,
          database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=program, opts=options)
def test_local_recovery_equals_a_restore_from_the_store_sqlite(tmp_path_factory: Any,
                                                               ops: Any, opts: Any) -> None:
    url = f"sqlite:///{tmp_path_factory.getbasetemp()}/breaker-lr.sqlite"
    differential(url, ops, opts)


@settings(max_examples=15, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=program, opts=options)
def test_local_recovery_equals_a_restore_from_the_store_mysql(mysql_url: str, ops: Any,
                                                              opts: Any) -> None:
    differential(mysql_url, ops, opts)


@settings(max_examples=int(os.environ.get("BREAKER_LR_EXAMPLES", "60")), deadline=None,
          database=None, suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])
@given(ops=program, cache=st.integers(1, 4))
def test_local_recovery_with_a_built_key_filter_sqlite(tmp_path_factory: Any, monkeypatch: Any,
                                                       ops: Any, cache: int) -> None:
    """Lazy restores whose key filter is built before the first read: a miss it rules out
    reads "no value" without the store, also for entries deleted from a taken-over tier."""
    from pyflink_ndb.checkpoint import key_filter_build

    monkeypatch.setattr(key_filter_build, "START_AFTER_ABSENT_READS", 0)
    monkeypatch.setattr(sys.modules[__name__], "AWAIT_KEY_FILTER", True)
    url = f"sqlite:///{tmp_path_factory.getbasetemp()}/breaker-lr-kf.sqlite"
    differential(url, ops, NdbStateOptions(cache_max_entries=cache, checkpoints_retained=3))


def test_coverage_of_take_overs(tmp_path: Any) -> None:
    """The programs above do take tiers over (else they test nothing)."""
    url = f"sqlite:///{tmp_path}/cov.sqlite"
    ops = [("v", "a", 1), ("m_put", "b", 1, 2), ("l_add", "c", 3), ("ckpt", "heard"),
           ("v", "a", 2), ("ckpt", "lost"), ("v", "a", 3), ("crash", 0)]
    got, takeovers = run_program(url, ops, NdbStateOptions(cache_max_entries=1))
    assert takeovers >= 1
    want, _ = run_program(url, ops, NdbStateOptions(cache_max_entries=1,
                                                    local_recovery=False))
    assert got == want
