"""Model-based test of the checkpoint protocol (DESIGN.md, decision 4) without Flink.

Random operations on every state type over a small key space, snapshots, completions,
aborts, lost completion notifications, crashes and restores (from the latest completed
checkpoint or an older retained one), checked against a plain-dict model. After every
restore, every key's every state must equal the model as of the restored checkpoint.

The tiers use a cache of one entry, so every access crosses RocksDB and the store.
"""

from __future__ import annotations

import copy
import shutil
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

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores import StateStore, open_store
from pyflink_ndb.testing import LocalSubtask

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


class ProtocolMachine(RuleBasedStateMachine):
    """One subtask over its attempts; the class attributes choose the store."""

    STORE_KIND: ClassVar[str] = "sqlite"
    MYSQL_URL: ClassVar[str] = ""
    OPTIONS: ClassVar[NdbStateOptions] = NdbStateOptions(cache_max_entries=1,
                                                         checkpoints_retained=RETAINED)

    def __init__(self) -> None:
        super().__init__()
        self.tmp = fast_tmpdir("pyflink-ndb-model-")
        self.namespace = unique_namespace("m")
        url = (f"sqlite:///{self.tmp}/state.sqlite" if self.STORE_KIND == "sqlite"
               else self.MYSQL_URL)
        self.store: StateStore = open_store(NdbStateOptions(url=url, namespace=self.namespace))
        self.options = self.OPTIONS
        self.model = empty_model()
        self.snapshots: dict[int, dict[str, dict[Any, Any]]] = {}
        #: Completed checkpoints Flink still retains (newest last); a checkpoint that
        #: dropped out never comes back, even after a restore from an older one.
        self.retained: list[int] = []
        self.pending: set[int] = set()
        self.next_checkpoint = 1
        self.restores = 0
        self._start(None)

    def _start(self, restored: int | None) -> None:
        self.subtask = LocalSubtask(self.store, self.options, restored_checkpoint_id=restored,
                                    local_dir=self.tmp)
        self.states = declare(self.subtask)

    def teardown(self) -> None:
        try:
            self.subtask.close()
            self.store.close()
            if self.STORE_KIND == "mysql":
                drop_namespace(self.MYSQL_URL, self.namespace)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- reading --------------------------------------------------------------------------
    def actual(self, key: Any) -> dict[str, Any]:
        self.subtask.key(key)
        s = self.states
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
            self.apply(*op)

    def apply(self, name: str, key: Any, *args: Any) -> None:
        self.subtask.key(key)
        state = self.states[name.split("_")[0]]
        model = self.model
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

    @rule(key=keys)
    def read_one_key(self, key: Any) -> None:
        assert self.actual(key) == self.expected(key)

    # -- checkpoints ----------------------------------------------------------------------
    @rule(complete=st.booleans())
    def checkpoint(self, complete: bool) -> None:
        checkpoint_id = self.next_checkpoint
        self.next_checkpoint += 1
        self.subtask.checkpoint(checkpoint_id, complete=False)
        self.snapshots[checkpoint_id] = copy.deepcopy(self.model)
        self.pending.add(checkpoint_id)
        if complete:
            self._complete(checkpoint_id)

    @rule(rounds=st.lists(st.lists(operations, min_size=1, max_size=3), min_size=2, max_size=4))
    def completed_rounds(self, rounds: list[list[tuple[Any, ...]]]) -> None:
        """Several rounds of operations, each ended by a completed checkpoint: long
        attempts whose older versions garbage collection must handle."""
        for ops in rounds:
            self.operate(ops)
            self.checkpoint(True)

    def _complete(self, checkpoint_id: int) -> None:
        self.subtask.backend.notify_checkpoint_complete(checkpoint_id)
        self.retained = (self.retained + [checkpoint_id])[-RETAINED:]
        # Completion subsumes every older pending checkpoint (Flink never completes them).
        self.pending = {p for p in self.pending if p > checkpoint_id}

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def complete_late(self, data: st.DataObject) -> None:
        """A completion notification that arrives after later snapshots were taken."""
        self._complete(data.draw(st.sampled_from(sorted(self.pending))))

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        checkpoint_id = data.draw(st.sampled_from(sorted(self.pending)))
        self.subtask.backend.notify_checkpoint_aborted(checkpoint_id)
        self.pending.discard(checkpoint_id)

    @precondition(lambda self: self.snapshots)
    @rule(data=st.data())
    def crash_and_restore(self, data: st.DataObject) -> None:
        candidates: list[int | None] = list(self.retained)
        if self.pending:
            # Completed globally, but the notification was lost in the crash.
            candidates.append(max(self.pending))
        if not candidates:
            candidates = [None]
        # Mostly the newest one, as Flink does; sometimes an older retained one.
        restored = data.draw(st.one_of(st.just(candidates[-1]), st.sampled_from(candidates)),
                             label="restore from")
        if restored is None:
            event("fresh start")
        elif restored not in self.retained:
            event("restore from a checkpoint whose notification was lost")
        elif restored != self.retained[-1]:
            event("restore from an older retained checkpoint")
        else:
            event("restore from the latest completed checkpoint")
        self.subtask.crash()
        self.restores += 1
        if restored is None:
            self.model = empty_model()
            self.retained = []
        else:
            self.model = copy.deepcopy(self.snapshots[restored])
            self.retained = [c for c in self.retained if c < restored] + [restored]
        self.pending = set()
        self._start(restored)
        self.check_all(f"after restore from {restored}")

    @invariant()
    def retained_checkpoints_are_committed(self) -> None:
        markers = [e for e, savepoint in self.store.committed_epochs("op") if not savepoint]
        assert set(self.retained) <= set(markers)
        assert max(markers, default=None) == (self.retained[-1] if self.retained else None)


def run(kind: str, mysql_url: str, max_examples: int, steps: int) -> None:
    machine = type(f"ProtocolMachine_{kind}", (ProtocolMachine,),
                   {"STORE_KIND": kind, "MYSQL_URL": mysql_url})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=max_examples, stateful_step_count=steps, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow]))


def test_protocol_model_sqlite() -> None:
    run("sqlite", "", max_examples=100, steps=50)


@pytest.mark.mysql
def test_protocol_model_mysql(mysql_url: str) -> None:
    run("mysql", mysql_url, max_examples=15, steps=50)


# -- rescaling and eager restore ---------------------------------------------------------

def key_group_ranges(parallelism: int, max_parallelism: int = 128) -> list[tuple[int, int]]:
    """Flink's KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex."""
    return [((i * max_parallelism + parallelism - 1) // parallelism,
             ((i + 1) * max_parallelism - 1) // parallelism) for i in range(parallelism)]


def key_group_of(key: Any, max_parallelism: int = 128) -> int:
    import zlib

    from pyflink_ndb.serialization import encode_key

    return zlib.crc32(encode_key(key)) % max_parallelism  # as LocalSubtask computes it


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
            t.backend.snapshot(checkpoint_id)
        if complete:
            for t in self.subtasks:
                t.backend.notify_checkpoint_complete(checkpoint_id)

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
