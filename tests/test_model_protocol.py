"""Model-based test of the checkpoint history (docs/protocol.md) without Flink.

Random operations on every state type over a small key space; checkpoints and
savepoints; completions that are lost, late or out of order; aborts; failovers and new
jobs from any snapshot (reusing checkpoint ids); replaced attempts that keep running as
zombies; rescale. After every restore every key's every state must equal the model of
the restored snapshot, and readers always see exactly one completed checkpoint.

The tiers use a cache of one entry, so every access crosses RocksDB and the store.
"""

from __future__ import annotations

import copy
import shutil
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from conftest import drop_namespace, fast_tmpdir, unique_namespace
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pyflink.common.typeinfo import Types
from pyflink.datastream.functions import AggregateFunction
from pyflink.datastream.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)

from pyflink_ndb.checkpoint import key_filter_build
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import CheckpointError, FencedError
from pyflink_ndb.serialization.keys import decode_key, split_key
from pyflink_ndb.serialization.values import decode_value
from pyflink_ndb.stores import StateStore, open_store
from pyflink_ndb.stores.lineage import Token
from pyflink_ndb.testing import LocalSubtask, key_group_ranges
from pyflink_ndb.testing import local_key_group as key_group_of
from pyflink_ndb.tiers import handover

RETAINED = 3
KEYS = [0, 1, "k", (2, "t")]
MAP_KEYS = ["a", "b", 3, None]
STATES = ("value", "list", "map", "reducing", "aggregating")

keys = st.sampled_from(KEYS)
map_keys = st.sampled_from(MAP_KEYS)
small_ints = st.integers(-3, 3)
values = st.one_of(st.none(), small_ints, st.text(max_size=2), st.binary(max_size=2),
                   st.lists(small_ints, max_size=3))
elements = st.one_of(small_ints, st.text(max_size=2))
operations = st.one_of(
    st.tuples(st.just("value_update"), keys, values),
    st.tuples(st.sampled_from([f"{s}_clear" for s in STATES]), keys),
    st.tuples(st.just("list_add"), keys, st.one_of(st.none(), elements)),
    st.tuples(st.sampled_from(["list_add_all", "list_update"]), keys,
              st.lists(elements, max_size=3)),
    st.tuples(st.just("map_put"), keys, map_keys, values),
    st.tuples(st.just("map_put_all"), keys, st.dictionaries(map_keys, values, max_size=3)),
    st.tuples(st.just("map_remove"), keys, map_keys),
    st.tuples(st.sampled_from(["reducing_add", "aggregating_add"]), keys,
              st.one_of(st.none(), small_ints)),
)


class CountSum(AggregateFunction):
    """Accumulator (count, sum); the result is the accumulator itself."""

    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: int, accumulator: tuple[int, int]) -> tuple[int, int]:
        return (accumulator[0] + 1, accumulator[1] + value)

    def get_result(self, accumulator: tuple[int, int]) -> tuple[int, int]:
        return accumulator

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


def declare(t: LocalSubtask) -> dict[str, Any]:
    any_type = Types.PICKLED_BYTE_ARRAY()
    ctx = t.context
    return {
        "value": ctx.get_state(ValueStateDescriptor("value", any_type)),
        "list": ctx.get_list_state(ListStateDescriptor("list", any_type)),
        "map": ctx.get_map_state(MapStateDescriptor("map", any_type, any_type)),
        "reducing": ctx.get_reducing_state(
            ReducingStateDescriptor("reducing", lambda a, b: a + b, Types.LONG())),
        "aggregating": ctx.get_aggregating_state(
            AggregatingStateDescriptor("aggregating", CountSum(), any_type)),
    }


def empty_model() -> dict[str, dict[Any, Any]]:
    return {name: {} for name in STATES}


@dataclass
class Snap:
    """One snapshot as Flink keeps it: the tokens it stored, the state it must restore."""

    number: int
    checkpoint_id: int
    job: int
    tokens: tuple[str, ...]
    model: dict[str, dict[Any, Any]]
    savepoint: bool
    #: The JobManager completed it (whether or not the task was told).
    completed: bool = False
    aborted: bool = False


class Operator:
    """One run of the operator at some parallelism: records go to the subtask that owns
    their key's key group, as Flink routes them."""

    def __init__(self, store: StateStore, options: NdbStateOptions, parallelism: int,
                 local_dir: str, snap: Snap | None, job: int, attempt: int,
                 await_key_filter: bool = False) -> None:
        self.ranges = key_group_ranges(parallelism)
        self.subtasks = [
            LocalSubtask(store, options, subtask_index=i, key_group_start=start,
                         key_group_end=end, restored_checkpoint_id=None if snap is None
                         else snap.checkpoint_id, restored_tokens=None if snap is None
                         else snap.tokens, local_dir=local_dir, job_id=f"job-{job}",
                         attempt=attempt)
            for i, (start, end) in enumerate(self.ranges)]
        self.states = [declare(t) for t in self.subtasks]
        if await_key_filter:  # every read after the restore meets a built key filter
            for t in self.subtasks:
                build = t.backend.key_filter_build
                if build is not None:
                    assert t.backend.protocol.writer.wait_idle(60)
                    assert build.finished

    def route(self, key: Any) -> tuple[LocalSubtask, dict[str, Any]]:
        kg = key_group_of(key)
        i = next(i for i, (start, end) in enumerate(self.ranges) if start <= kg <= end)
        return self.subtasks[i], self.states[i]

    def close(self) -> None:
        for t in self.subtasks:
            t.close()

    def crash(self) -> None:
        for t in self.subtasks:
            t.crash()


class ProtocolMachine(RuleBasedStateMachine):
    """One operator across attempts, jobs and parallelisms, with zombies; the class
    attributes choose the store.

    Flink's side is modelled: checkpoint ids count per job (a job started from a snapshot
    continues at its id + 1, so two jobs reuse ids); the JobManager may complete a
    checkpoint without some subtasks hearing of it (lost notifications) and notifications
    may arrive late; a failover restores the job's latest completed checkpoint at the same
    parallelism (never a savepoint; before the job's first checkpoint, the snapshot the
    job started from); a new job may start from any completed snapshot ever taken, at any
    parallelism (rescale). A replaced run keeps running as zombies: they write, snapshot
    and receive late notifications, which must all fail with FencedError and change
    nothing anybody else sees.
    """

    STORE_KIND: ClassVar[str] = "sqlite"
    MYSQL_URL: ClassVar[str] = ""
    OPTIONS: ClassVar[NdbStateOptions] = NdbStateOptions(cache_max_entries=1,
                                                         checkpoints_retained=RETAINED)
    #: Wait after each restore until the key filter is built (else reads race the build).
    AWAIT_KEY_FILTER: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self.tmp = fast_tmpdir("pyflink-ndb-model-")
        self.namespace = unique_namespace("m")
        url = (f"sqlite:///{self.tmp}/state.sqlite" if self.STORE_KIND == "sqlite"
               else self.MYSQL_URL)
        self.store: StateStore = open_store(NdbStateOptions(url=url, namespace=self.namespace))
        self.options = self.OPTIONS
        self.model = empty_model()
        self.snaps: list[Snap] = []
        self.job = 0
        self.attempt = 0
        self.job_start: Snap | None = None
        self.next_checkpoint = 1
        self.zombies: list[Operator] = []
        self.op = Operator(self.store, self.options, 1, self.tmp, None, 0, 0)

    def teardown(self) -> None:
        try:
            try:
                self.op.close()
            finally:
                for z in self.zombies:
                    z.crash()
            self.store.close()
            if self.STORE_KIND == "mysql":
                drop_namespace(self.MYSQL_URL, self.namespace)
        finally:
            handover.discard_all(under=self.tmp)  # tiers crashed attempts parked
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- reading --------------------------------------------------------------------------
    def actual(self, key: Any) -> dict[str, Any]:
        t, s = self.op.route(key)
        t.key(key)
        items = list(s["map"].items())
        listed_keys = list(s["map"].keys())
        assert len(listed_keys) == len(set(listed_keys)) == len(items), items
        assert list(s["map"].values()) == [v for _, v in items]
        assert s["map"].is_empty() == (not items)
        for mk in MAP_KEYS:
            assert s["map"].contains(mk) == (mk in dict(items))
        return {"value": s["value"].value(), "list": s["list"].get(), "map": dict(items),
                "reducing": s["reducing"].get(), "aggregating": s["aggregating"].get()}

    def expected(self, key: Any) -> dict[str, Any]:
        m = self.model
        return {"value": m["value"].get(key), "list": m["list"].get(key, []),
                "map": m["map"].get(key, {}), "reducing": m["reducing"].get(key),
                "aggregating": m["aggregating"].get(key)}

    def check_all(self, when: str) -> None:
        for key in KEYS:
            assert self.actual(key) == self.expected(key), (when, key)

    # -- operations -----------------------------------------------------------------------
    @rule(ops=st.lists(operations, min_size=1, max_size=4))
    def operate(self, ops: list[tuple[Any, ...]]) -> None:
        for op in ops:
            t, states = self.op.route(op[1])
            apply(t, states, self.model, *op)

    @rule(key=keys)
    def read_one_key(self, key: Any) -> None:
        assert self.actual(key) == self.expected(key)

    # -- checkpoints ----------------------------------------------------------------------
    def _own(self) -> list[Snap]:
        return [s for s in self.snaps if s.job == self.job]

    def _notify(self, checkpoint_id: int, mask: int) -> None:
        """Deliver the completion to the subtasks whose bit is set in `mask`."""
        for i, t in enumerate(self.op.subtasks):
            if mask >> i & 1:
                t.complete(checkpoint_id)

    @rule(savepoint=st.booleans(), completed=st.booleans(), mask=st.integers(0, 7),
          wait=st.booleans())
    def snapshot(self, savepoint: bool, completed: bool, mask: int, wait: bool = True) -> None:
        """A snapshot's synchronous phase on every subtask; its background write may still
        run when the next rule starts (overlapping epochs) unless it completes: Flink
        completes a checkpoint only after every subtask's asynchronous phase."""
        checkpoint_id = self.next_checkpoint
        self.next_checkpoint += 1
        tokens = tuple(t.snapshot(checkpoint_id, savepoint, durable=False)
                       for t in self.op.subtasks)
        snap = Snap(len(self.snaps), checkpoint_id, self.job, tokens,
                    copy.deepcopy(self.model), savepoint)
        self.snaps.append(snap)
        if completed or wait:
            for t in self.op.subtasks:
                t.wait_durable(checkpoint_id)
        if completed:
            snap.completed = True
            self._notify(checkpoint_id, mask)

    @rule(index=st.integers(0, 2), batches=st.integers(0, 2))
    def snapshot_fails_in_the_background(self, index: int, batches: int) -> None:
        """One subtask's background write fails after `batches` statements: Flink declines
        the checkpoint and aborts it everywhere; the job goes on, and the next checkpoint
        must hold everything (the failed epoch's entries went back)."""
        victim = self.op.subtasks[index % len(self.op.subtasks)]
        # The victim gets something to write (else its checkpoint simply succeeds): the
        # coverage of this rule must not depend on which examples Hypothesis draws.
        own = [k for k in KEYS if self.op.route(k)[0] is victim]
        if own:
            self.operate([("value_update", own[0], index)])
        # A garbage-collection pass still running would hit the injected failure instead
        # of this checkpoint's write (and make the coverage depend on timing).
        victim.backend.protocol.writer.wait_idle(60)
        store = victim.backend.write_store or victim.backend.store
        real = store._replace_state_rows
        calls = {"n": 0}

        def flaky(text: str, rows: Any) -> None:
            if calls["n"] >= batches:
                raise OSError("injected: the background write dies")
            calls["n"] += 1
            real(text, rows)

        store._replace_state_rows = flaky  # type: ignore[method-assign]
        checkpoint_id = self.next_checkpoint
        self.next_checkpoint += 1
        try:
            tokens = tuple(t.snapshot(checkpoint_id, durable=False) for t in self.op.subtasks)
            failed = False
            for t in self.op.subtasks:
                try:
                    t.wait_durable(checkpoint_id)
                except CheckpointError:
                    failed = True
        finally:
            store._replace_state_rows = real  # type: ignore[method-assign]
        snap = Snap(len(self.snaps), checkpoint_id, self.job, tokens,
                    copy.deepcopy(self.model), False)
        self.snaps.append(snap)
        if failed:
            self._count("background write failed")
            for t in self.op.subtasks:
                t.abort(checkpoint_id)
            snap.aborted = True
        else:  # nothing to write in the victim's key groups: it simply succeeded
            for t in self.op.subtasks:
                t.wait_durable(checkpoint_id)

    @rule(rounds=st.lists(st.lists(operations, min_size=1, max_size=3), min_size=2, max_size=4))
    def completed_rounds(self, rounds: list[list[tuple[Any, ...]]]) -> None:
        """Several rounds of operations, each ended by a completed checkpoint: long
        attempts whose older versions garbage collection must handle."""
        for ops in rounds:
            self.operate(ops)
            self.snapshot(False, True, 7)

    @precondition(lambda self: any(s.completed for s in self._own()))
    @rule(data=st.data(), mask=st.integers(1, 7))
    def notify_late(self, data: st.DataObject, mask: int) -> None:
        """Completion notifications that arrive after later snapshots were taken."""
        snap = data.draw(st.sampled_from([s for s in self._own() if s.completed]))
        self._notify(snap.checkpoint_id, mask)

    @precondition(lambda self: any(not s.completed for s in self._own()))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        snap = data.draw(st.sampled_from([s for s in self._own() if not s.completed]))
        for t in self.op.subtasks:
            t.abort(snap.checkpoint_id)
        snap.aborted = True

    # -- failures -------------------------------------------------------------------------
    def _count(self, what: str) -> None:
        STATS[what] += 1

    def _replace(self, snap: Snap | None, zombie: bool, parallelism: int) -> None:
        if zombie:
            self.zombies.append(self.op)
            # A zombie that falls off is crashed (tiers dropped, writer stopped): left
            # open, its RocksDB outlived the test's folder, and dropping it later (a
            # garbage collection in another test) hung in RocksDB's flush at close.
            while len(self.zombies) > 2:
                self.zombies.pop(0).crash()
        else:
            self.op.crash()
        self.model = empty_model() if snap is None else copy.deepcopy(snap.model)
        self.op = Operator(self.store, self.options, parallelism, self.tmp, snap, self.job,
                           self.attempt, self.AWAIT_KEY_FILTER)
        self.check_all(f"after restoring {snap} at parallelism {parallelism}")
        STATS["key filter ruled out"] += sum(
            t.backend.table.key_filter.ruled_out for t in self.op.subtasks
            if t.backend.table.key_filter is not None)

    @rule(zombie=st.booleans())
    def failover(self, zombie: bool) -> None:
        """Flink restores the job's latest completed checkpoint (a savepoint never), at the
        same parallelism, as the next attempt of every subtask."""
        done = [s for s in self._own() if s.completed and not s.savepoint]
        snap = max(done, key=lambda s: s.checkpoint_id) if done else self.job_start
        event("failover to " + ("the job's start" if not done else "its latest checkpoint"))
        self._count("failover")
        self.attempt += 1
        self._replace(snap, zombie, len(self.op.subtasks))

    @precondition(lambda self: any(s.completed for s in self.snaps))
    @rule(data=st.data(), zombie=st.booleans(), parallelism=st.integers(1, 3))
    def new_job_from(self, data: st.DataObject, zombie: bool, parallelism: int) -> None:
        """A new job (same job id or not) from any completed snapshot ever taken (Flink
        writes no metadata for others), at any parallelism. The promised ones must
        restore exactly; any other must restore exactly or fail with CheckpointError,
        never return other values."""
        snap = data.draw(st.sampled_from([s for s in self.snaps if s.completed]),
                         label="restore")
        own_done = sorted((s for s in self._own() if s.completed and not s.savepoint),
                          key=lambda s: s.checkpoint_id)
        promised = ((snap.savepoint and not snap.aborted)
                    or snap in own_done[-RETAINED:]
                    or (snap is self.job_start and not own_done))
        try:
            probe = LocalSubtask(self.store, self.options, restored_checkpoint_id=
                                 snap.checkpoint_id, restored_tokens=snap.tokens,
                                 local_dir=self.tmp, job_id=f"job-{self.job + 1}")
        except CheckpointError:
            assert not promised, f"{snap} must be restorable"
            event("restore refused (documented)")
            self._count("refused")
            return
        event("new job from " + ("a savepoint" if snap.savepoint else "a checkpoint"))
        self._count("new job from a savepoint" if snap.savepoint else "new job from a checkpoint")
        if parallelism != len(self.op.subtasks):
            self._count("rescale")
        probe.close()
        self.job += 1
        self.attempt = 0
        self.job_start = snap
        self.next_checkpoint = snap.checkpoint_id + 1
        self._replace(snap, zombie, parallelism)

    @precondition(lambda self: self.zombies)
    @rule(ops=st.lists(operations, min_size=1, max_size=3), data=st.data())
    def zombie_acts(self, ops: list[tuple[Any, ...]], data: st.DataObject) -> None:
        """A replaced run keeps working: its writes stay in its own tiers, its snapshots
        and late notifications are fenced."""
        zombie = data.draw(st.sampled_from(self.zombies))
        scratch = empty_model()
        for op in ops:
            t, states = zombie.route(op[1])
            apply(t, states, scratch, *op)
        for t in zombie.subtasks:
            with pytest.raises(FencedError):  # at the snapshot or in its background write
                t.snapshot(10_000 + len(self.snaps))
            with pytest.raises(FencedError):
                t.complete(self.next_checkpoint - 1)
        self._count("zombie fenced")

    @invariant()
    def readers_see_one_completed_checkpoint(self) -> None:
        """What `query` reads is exactly one completed checkpoint's state (P4)."""
        row = self.store.read_operator("op")
        if row is None or row.committed is None:
            return
        parts = tuple(sorted(row.committed.parts, key=lambda t: t.kg_start))
        # A completed checkpoint, or the savepoint the running job started from.
        matching = [s for s in self.snaps if s.completed
                    and (not s.savepoint or s is self.job_start)
                    and tuple(sorted((Token.from_json(t) for t in s.tokens),
                                     key=lambda t: t.kg_start)) == parts]
        assert matching, row.committed
        seen = {}
        for rec in self.store.iter_committed("op", "value"):
            prefix, _ = split_key(rec["ukey"])
            seen[decode_key(prefix)] = decode_value(rec["vbytes"])
        assert seen == matching[-1].model["value"]


def apply(subtask: LocalSubtask, states: dict[str, Any], model: dict[str, dict[Any, Any]],
          name: str, key: Any, *args: Any) -> None:
    """Apply one operation to the tiered states and to the dict model."""
    subtask.key(key)
    state = states[name.split("_")[0]]
    if name == "value_update":
        (value,) = args
        state.update(value)
        if value is None:
            model["value"].pop(key, None)
        else:
            model["value"][key] = value
    elif name == "list_add":
        (element,) = args
        if element is None:
            # Flink rejects null elements: nothing changes.
            with pytest.raises(ValueError):
                state.add(None)
        else:
            state.add(element)
            model["list"].setdefault(key, []).append(element)
    elif name == "list_add_all":
        (items,) = args
        state.add_all(items)
        if items:
            model["list"].setdefault(key, []).extend(items)
    elif name == "list_update":
        (items,) = args
        state.update(items)
        if items:
            model["list"][key] = list(items)
        else:
            model["list"].pop(key, None)
    elif name == "map_put":
        map_key, value = args
        state.put(map_key, value)
        model["map"].setdefault(key, {})[map_key] = value
    elif name == "map_put_all":
        (entries,) = args
        state.put_all(entries)
        if entries:
            model["map"].setdefault(key, {}).update(entries)
    elif name == "map_remove":
        (map_key,) = args
        del state[map_key]
        current = model["map"].get(key, {})
        current.pop(map_key, None)
        if not current:
            model["map"].pop(key, None)
    elif name in ("reducing_add", "aggregating_add"):
        (value,) = args
        state.add(value)
        kind = name.split("_")[0]
        if value is None:  # clears, as PyFlink's own state does
            model[kind].pop(key, None)
        elif kind == "reducing":
            current = model["reducing"].get(key)
            model["reducing"][key] = value if current is None else current + value
        else:
            count, total = model["aggregating"].get(key, (0, 0))
            model["aggregating"][key] = (count + 1, total + value)
    elif name.endswith("_clear"):
        state.clear()
        model[name.split("_")[0]].pop(key, None)
    else:
        raise AssertionError(name)


#: How often each kind of event happened in the last run (the test checks its coverage).
STATS: Counter[str] = Counter()


def run(kind: str, mysql_url: str, max_examples: int, steps: int, coverage: int = 3,
        derandomize: bool = False) -> None:
    STATS.clear()
    machine = type(f"ProtocolMachine_{kind}", (ProtocolMachine,),
                   {"STORE_KIND": kind, "MYSQL_URL": mysql_url})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=max_examples, stateful_step_count=steps, deadline=None, database=None,
        derandomize=derandomize,
        suppress_health_check=[HealthCheck.too_slow]))
    for what in ("failover", "new job from a checkpoint", "new job from a savepoint",
                 "zombie fenced", "rescale", "background write failed"):
        assert STATS[what] >= coverage, (what, dict(STATS))


def test_protocol_model_sqlite() -> None:
    run("sqlite", "", max_examples=100, steps=50, derandomize=True)


@pytest.mark.mysql
def test_protocol_model_mysql(mysql_url: str) -> None:
    # Fewer examples on MariaDB (slower), a fixed sequence of them so that each kind
    # happens (at least once); SQLite runs 100 (also a fixed sequence) and asserts 3 each.
    run("mysql", mysql_url, max_examples=20, steps=50, coverage=1, derandomize=True)


# -- rescaling and eager restore ---------------------------------------------------------

class Job:
    """One operator at some parallelism: records go to the subtask owning their key."""

    def __init__(self, store: StateStore, parallelism: int, local_dir: str,
                 restored: int | None, options: NdbStateOptions) -> None:
        self.subtasks = [
            LocalSubtask(store, options, subtask_index=i, key_group_start=start,
                         key_group_end=end, restored_checkpoint_id=restored,
                         local_dir=local_dir)
            for i, (start, end) in enumerate(key_group_ranges(parallelism))]
        self.ranges = key_group_ranges(parallelism)
        self.states = [declare(t) for t in self.subtasks]

    def route(self, key: Any) -> dict[str, Any]:
        kg = key_group_of(key)
        index = next(i for i, (s, e) in enumerate(self.ranges) if s <= kg <= e)
        self.subtasks[index].key(key)
        return self.states[index]

    def checkpoint(self, checkpoint_id: int, complete: bool = True) -> None:
        for t in self.subtasks:
            t.snapshot(checkpoint_id)
        if complete:
            for t in self.subtasks:
                t.complete(checkpoint_id)

    def crash(self) -> None:
        for t in self.subtasks:
            t.crash()


@pytest.mark.parametrize("restore_mode", ["lazy", "eager"])
def test_rescale_2_to_3_to_1(store: StateStore, local_dir: str, restore_mode: str) -> None:
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=2,
                              restore_mode=restore_mode)
    keys = [f"k{i}" for i in range(60)]
    assert len({key_group_of(k) for k in keys}) > 20
    job = Job(store, 2, local_dir, None, options)
    for i, key in enumerate(keys):
        s = job.route(key)
        s["value"].update(i)
        s["map"].put("i", i)
        s["list"].add(i)
    job.checkpoint(1)
    for i, key in enumerate(keys[::2]):
        s = job.route(key)
        s["value"].update(-i)
        s["map"].clear()
    job.checkpoint(2, complete=False)  # never completes: rolled back on restore
    job.crash()

    job = Job(store, 3, local_dir, 1, options)
    for i, key in enumerate(keys):
        s = job.route(key)
        assert (s["value"].value(), dict(s["map"].items()), s["list"].get()) == \
            (i, {"i": i}, [i]), key
        s["reducing"].add(i)
    job.checkpoint(3)
    job.crash()

    job = Job(store, 1, local_dir, 3, options)
    for i, key in enumerate(keys):
        s = job.route(key)
        assert (s["value"].value(), s["reducing"].get(), s["list"].get()) == (i, i, [i])
    for t in job.subtasks:
        t.close()


def test_protocol_model_sqlite_eager_restore() -> None:
    machine = type("ProtocolMachine_eager", (ProtocolMachine,), {
        "STORE_KIND": "sqlite",
        "OPTIONS": NdbStateOptions(cache_max_entries=1, checkpoints_retained=RETAINED,
                                   restore_mode="eager")})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=25, stateful_step_count=40, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow]))


def test_protocol_model_sqlite_key_filter_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model with each restore's key filter built before the first read: misses the
    filter rules out read as "no value" without the store (restore.key-filter)."""
    monkeypatch.setattr(key_filter_build, "START_AFTER_ABSENT_READS", 0)
    STATS.clear()
    machine = type("ProtocolMachine_key_filter", (ProtocolMachine,), {
        "STORE_KIND": "sqlite", "AWAIT_KEY_FILTER": True})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=25, stateful_step_count=40, deadline=None, database=None,
        derandomize=True, suppress_health_check=[HealthCheck.too_slow]))
    assert STATS["key filter ruled out"] > 0, dict(STATS)
