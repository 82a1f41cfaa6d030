"""Differential test on Flink's MiniCluster: PyFlink's own keyed state versus tiered state.

The same keyed functions run once on PyFlink's own state (`keyed.process(fn, ...)`, the
heap backend) and then on pyflink-ndb (`pyflink_ndb.process(...)` /
`pyflink_ndb.co_process(...)`) in two configurations:

* `cache1-sqlite`: `cache.max-entries` = 1, so every entry crosses RocksDB (tier 2) and
  the store; SQLite store in `tmp_path`;
* `bigcache-mysql`: a cache that holds everything; MariaDB/MySQL store on a unique
  namespace (tables dropped after).

To keep the MiniCluster count low, one Flink job per configuration holds three pipelines
(their outputs unioned into one collect):

* `all`: one `KeyedProcessFunction` using ValueState, ListState, MapState, ReducingState
  and AggregatingState at once (plus an event-time timer that reports the final state);
* `ttl`: the same function with every descriptor TTL-enabled (`NeverReturnExpired`, a TTL
  far longer than the run, both update types), so the outputs must be identical too;
* `co`: a `KeyedCoProcessFunction` on two connected keyed streams.

Every output is `repr((pipeline, key, channel, seq, payload))`. Order across keys is not
deterministic, nor is the interleaving of the two inputs of the co-process function; the
order of one key on one channel is. Outputs are therefore compared as per
(pipeline, key, channel) sequences. The co-process function's per-record outputs depend
only on the state its own input writes; its timer output (after both inputs ended)
combines both.
"""

from __future__ import annotations

import ast
import random
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, unique_namespace
from pyflink.common import Configuration, Time, Types
from pyflink.datastream import (
    AggregateFunction,
    CheckpointingMode,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    ReduceFunction,
    RuntimeContext,
    StreamExecutionEnvironment,
)
from pyflink.datastream.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

import pyflink_ndb
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores.factory import open_store

pytestmark = pytest.mark.flink

# The functions below are shipped to the TaskManager's embedded interpreter by value: the
# test module is not importable there.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"k{i:02d}" for i in range(50)]
MAIN_RECORDS = 4000
SIDE_RECORDS = 1500
PARALLELISM = 2
CHECKPOINT_MS = 500
#: Event-time timer registered by every key; fires when the bounded inputs end.
TIMER_TS = 10_000
#: Far longer than the run: nothing expires, so TTL must not change any output.
TTL_MS = 6 * 3600 * 1000
UIDS = {"all": "diff-all", "ttl": "diff-ttl", "co": "diff-co"}
ROW = Types.TUPLE([Types.STRING(), Types.INT(), Types.INT(), Types.INT()])


# -- input ---------------------------------------------------------------------------------
def main_input() -> list[tuple[str, int, int, int]]:
    """(key, seq, op, x): deterministic, with a skewed key distribution."""
    rnd = random.Random(20240601)
    out = []
    for seq in range(MAIN_RECORDS):
        key = KEYS[min(int(rnd.expovariate(1 / 12)), len(KEYS) - 1)]
        out.append((key, seq, rnd.randrange(12), rnd.randrange(100)))
    return out


def side_input(seed: int) -> list[tuple[str, int, int, int]]:
    rnd = random.Random(seed)
    return [(rnd.choice(KEYS), seq, rnd.randrange(6), rnd.randrange(1, 500))
            for seq in range(SIDE_RECORDS)]


# -- state functions -------------------------------------------------------------------------
class MaxReduce(ReduceFunction):
    def reduce(self, value1: Any, value2: Any) -> Any:
        return max(value1, value2)


class SumReduce(ReduceFunction):
    def reduce(self, value1: Any, value2: Any) -> Any:
        return value1 + value2


class StatsAggregate(AggregateFunction):
    """(count, sum, min, max) of the added numbers; result (count, sum, min, max, parity)."""

    def create_accumulator(self) -> Any:
        return [0, 0, None, None]

    def add(self, value: Any, accumulator: Any) -> Any:
        count, total, low, high = accumulator
        return [count + 1, total + value, value if low is None else min(low, value),
                value if high is None else max(high, value)]

    def get_result(self, accumulator: Any) -> Any:
        count, total, low, high = accumulator
        return (count, total, low, high, total % 2)

    def merge(self, acc_a: Any, acc_b: Any) -> Any:
        raise NotImplementedError


def ttl_config(read_and_write: bool) -> StateTtlConfig:
    """A TTL that cannot expire during the run, never returning expired values."""
    builder = (StateTtlConfig.new_builder(Time.milliseconds(TTL_MS))
               .set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired))
    if read_and_write:
        builder = builder.update_ttl_on_read_and_write()
    else:
        builder = builder.update_ttl_on_create_and_write()
    return builder.build()


class AllStates(KeyedProcessFunction):
    """Uses the five keyed state kinds on every record; reports what each one returns."""

    def __init__(self, tag: str, ttl: bool = False) -> None:
        self.tag = tag
        self.ttl = ttl

    def _d(self, descriptor: Any, read_and_write: bool) -> Any:
        if self.ttl:
            descriptor.enable_time_to_live(ttl_config(read_and_write))
        return descriptor

    def open(self, runtime_context: RuntimeContext) -> None:
        ctx = runtime_context
        self.value = ctx.get_state(self._d(
            ValueStateDescriptor("value", Types.PICKLED_BYTE_ARRAY()), True))
        self.count = ctx.get_state(self._d(ValueStateDescriptor("count", Types.LONG()), False))
        self.items = ctx.get_list_state(self._d(
            ListStateDescriptor("items", Types.LONG()), True))
        self.map = ctx.get_map_state(self._d(
            MapStateDescriptor("map", Types.STRING(), Types.LONG()), False))
        self.max = ctx.get_reducing_state(self._d(
            ReducingStateDescriptor("max", MaxReduce(), Types.LONG()), True))
        self.stats = ctx.get_aggregating_state(self._d(
            AggregatingStateDescriptor("stats", StatsAggregate(), Types.PICKLED_BYTE_ARRAY()),
            False))

    def _apply(self, seq: int, op: int, x: int) -> Any:
        """One operation chosen by `op`; returns what it observed."""
        seen: Any = None
        if op == 0:
            # falsy values are values, not "unset"
            self.value.update((seq, x, [x, x * 2]) if x % 10 else (0 if x % 20 else ""))
        elif op == 1:
            current = self.value.value()
            if isinstance(current, tuple):
                current[2].append(-1)  # mutating a read copy changes nothing stored
            seen = current
            if x % 3 == 0:
                self.value.clear()
        elif op == 2:
            self.items.add(x)
        elif op == 3:
            self.items.add_all([x, x + 1, x + 2])
            self.items.add_all([])
        elif op == 4:
            self.items.update([] if x % 5 == 0 else [x, -x])
        elif op == 5:
            seen = list(self.items.get())
            if x % 4 == 0:
                self.items.clear()
        elif op == 6:
            self.map.put(f"m{x % 7}", x)
            self.map[f"d{x % 3}"] = seq
            if x % 10 == 0:
                self.map[""] = 0
        elif op == 7:
            seen = (self.map.get(f"m{x % 7}"), self.map.contains(f"m{x % 7}"),
                    f"d{x % 3}" in self.map, self.map[f"d{x % 3}"])
            self.map.remove(f"m{x % 7}")
            del self.map[f"d{x % 3}"]
        elif op == 8:
            self.map.put_all({f"p{x % 5}": x, f"m{x % 7}": -x})
            if x % 11 == 0:
                self.map.clear()
        elif op == 9:
            self.max.add(None if x % 13 == 0 else x)  # add(None) clears
        elif op == 10:
            self.stats.add(None if x % 17 == 0 else x)  # add(None) clears
        elif op == 11 and x % 3 == 0:
            self.map.clear()
            self.max.clear()
            self.stats.clear()
            self.value.update(None)
        return seen

    def _observe(self) -> Any:
        return (
            self.value.value(),
            self.count.value(),
            list(self.items.get()),
            sorted(self.map.items()),
            sorted(self.map.keys()),
            sorted(self.map.values()),
            sorted(iter(self.map)),
            self.map.is_empty(),
            self.map.get("m3"),
            "p1" in self.map,
            self.max.get(),
            self.stats.get(),
        )

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Iterator[str]:
        key, seq, op, x = value
        count = self.count.value()
        if count is None:
            ctx.timer_service().register_event_time_timer(TIMER_TS)
        self.count.update((count or 0) + 1)
        seen = self._apply(seq, op, x)
        yield repr((self.tag, key, "r", seq, (op, x, seen, self._observe())))

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext
                 ) -> Iterator[str]:
        yield repr((self.tag, ctx.get_current_key(), "timer", timestamp, self._observe()))


class Orders(KeyedCoProcessFunction):
    """Input 1 (orders) and input 2 (payments) of one key; each input writes only its own
    states, the timer reads all of them."""

    def open(self, runtime_context: RuntimeContext) -> None:
        ctx = runtime_context
        self.orders = ctx.get_state(ValueStateDescriptor("orders", Types.LONG()))
        self.amounts = ctx.get_list_state(ListStateDescriptor("amounts", Types.LONG()))
        self.by_item = ctx.get_map_state(
            MapStateDescriptor("by_item", Types.STRING(), Types.LONG()))
        self.paid = ctx.get_reducing_state(
            ReducingStateDescriptor("paid", SumReduce(), Types.LONG()))
        self.pay_stats = ctx.get_aggregating_state(AggregatingStateDescriptor(
            "pay_stats", StatsAggregate(), Types.PICKLED_BYTE_ARRAY()))
        self.methods = ctx.get_map_state(
            MapStateDescriptor("methods", Types.STRING(), Types.PICKLED_BYTE_ARRAY()))

    def process_element1(self, value: Any, ctx: KeyedCoProcessFunction.Context
                         ) -> Iterator[str]:
        key, seq, op, amount = value
        ctx.timer_service().register_event_time_timer(TIMER_TS)
        self.orders.update((self.orders.value() or 0) + 1)
        item = f"item{op}"
        if op == 5 and self.by_item.contains("item0"):
            self.by_item.remove("item0")
            self.amounts.update(list(self.amounts.get())[-3:])
        else:
            self.by_item[item] = (self.by_item.get(item) or 0) + amount
            self.amounts.add(amount)
        yield repr(("co", key, "in1", seq, (self.orders.value(), list(self.amounts.get()),
                                           sorted(self.by_item.items()))))

    def process_element2(self, value: Any, ctx: KeyedCoProcessFunction.Context
                         ) -> Iterator[str]:
        key, seq, op, amount = value
        ctx.timer_service().register_event_time_timer(TIMER_TS)
        method = ("card", "cash", "wire")[op % 3]
        if op == 4:
            self.methods.remove(method)
            self.paid.add(None)
        elif op == 5 and amount % 2:
            self.methods.put("void", None)  # a None value: present, yet get() is None
            self.pay_stats.add(amount)
        else:
            previous = self.methods.get(method) or (0, [])
            self.methods.put(method, (previous[0] + 1, previous[1][-2:] + [amount]))
            self.paid.add(amount)
            self.pay_stats.add(amount)
        yield repr(("co", key, "in2", seq, (self.paid.get(), self.pay_stats.get(),
                                           sorted(self.methods.items()),
                                           self.methods.is_empty(),
                                           self.methods.contains("void"),
                                           self.methods.get("void"))))

    def on_timer(self, timestamp: int, ctx: KeyedCoProcessFunction.OnTimerContext
                 ) -> Iterator[str]:
        yield repr(("co", ctx.get_current_key(), "timer", timestamp, (
            self.orders.value(), list(self.amounts.get()), sorted(self.by_item.items()),
            self.paid.get(), self.pay_stats.get(), sorted(self.methods.items()))))


# -- jobs --------------------------------------------------------------------------------------
def make_env() -> StreamExecutionEnvironment:
    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(PARALLELISM)
    env.enable_checkpointing(CHECKPOINT_MS, CheckpointingMode.EXACTLY_ONCE)
    return env


def run_job(tiered: dict[str, Any] | None) -> dict[tuple[str, str, str], list[Any]]:
    """Run the three pipelines; `tiered` None uses PyFlink's own state, else the options.

    :returns: per (pipeline, key, channel) the outputs (seq, payload) in arrival order.
    """
    env = make_env()
    main = env.from_collection(main_input(), type_info=ROW)
    side1 = env.from_collection(side_input(7), type_info=ROW)
    side2 = env.from_collection(side_input(8), type_info=ROW)

    def keyed(stream: Any) -> Any:
        return stream.key_by(lambda r: r[0], key_type=Types.STRING())

    out = Types.STRING()
    if tiered is None:
        outputs = [keyed(main).process(AllStates("all"), out),
                   keyed(main).process(AllStates("ttl", ttl=True), out),
                   keyed(side1).connect(keyed(side2)).process(Orders(), out)]
    else:
        outputs = [
            pyflink_ndb.process(keyed(main), AllStates("all"), output_type=out,
                                uid=UIDS["all"], options=tiered),
            pyflink_ndb.process(keyed(main), AllStates("ttl", ttl=True), output_type=out,
                                uid=UIDS["ttl"], options=tiered),
            pyflink_ndb.co_process(keyed(side1).connect(keyed(side2)), Orders(),
                                   output_type=out, uid=UIDS["co"], options=tiered),
        ]
    grouped: dict[tuple[str, str, str], list[Any]] = defaultdict(list)
    with outputs[0].union(*outputs[1:]).execute_and_collect() as results:
        for line in results:
            tag, key, channel, seq, payload = ast.literal_eval(line)
            grouped[(tag, key, channel)].append((seq, payload))
    return dict(grouped)


# -- fixtures ----------------------------------------------------------------------------------
TIERED_CONFIGS = ["cache1-sqlite", "bigcache-mysql"]


@pytest.fixture(scope="module")
def native() -> dict[tuple[str, str, str], list[Any]]:
    return run_job(None)


@pytest.fixture(scope="module", params=TIERED_CONFIGS)
def tiered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[dict[tuple[str, str, str], list[Any]], dict[str, str], str]]:
    """(outputs, options, per pipeline: (commit markers, committed rows, catalog))."""
    if request.param == "cache1-sqlite":
        path: Path = tmp_path_factory.mktemp("diff") / "state.sqlite"
        options = {"state.backend.ndb.url": f"sqlite:///{path}",
                   "state.backend.ndb.namespace": "diff",
                   "state.backend.ndb.cache.max-entries": "1"}
    else:
        url = request.getfixturevalue("mysql_url")
        options = {"state.backend.ndb.url": url,
                   "state.backend.ndb.namespace": unique_namespace("diff"),
                   "state.backend.ndb.cache.max-entries": "1000000"}
    options["state.backend.ndb.on-fresh-start"] = "truncate"
    try:
        outputs = run_job(options)
        store = open_store(NdbStateOptions(url=options["state.backend.ndb.url"],
                                           namespace=options["state.backend.ndb.namespace"]))
        try:
            committed = {name: (store.latest_committed_checkpoint(uid) is not None,
                                len(store.query_committed(uid)),
                                {(row["state_name"], row["state_kind"], row["ttl_ms"])
                                 for row in store.catalog(uid)})
                         for name, uid in UIDS.items()}
        finally:
            store.close()
        yield outputs, options, committed
    finally:
        if request.param == "bigcache-mysql":
            drop_namespace(options["state.backend.ndb.url"],
                           options["state.backend.ndb.namespace"])


_ALL_KINDS = [("value", "value"), ("count", "value"), ("items", "list"), ("map", "map"),
              ("max", "reducing"), ("stats", "aggregating")]
EXPECTED_CATALOG = {
    "all": {(name, kind, None) for name, kind in _ALL_KINDS},
    "ttl": {(name, kind, TTL_MS) for name, kind in _ALL_KINDS},
    "co": {("orders", "value", None), ("amounts", "list", None), ("by_item", "map", None),
           ("paid", "reducing", None), ("pay_stats", "aggregating", None),
           ("methods", "map", None)},
}


# -- tests --------------------------------------------------------------------------------------
def _compare(native: dict[tuple[str, str, str], list[Any]],
             tiered: dict[tuple[str, str, str], list[Any]], tag: str) -> None:
    expected = {k: v for k, v in native.items() if k[0] == tag}
    actual = {k: v for k, v in tiered.items() if k[0] == tag}
    assert expected, f"the native run produced no output for {tag!r}"
    assert sorted(actual) == sorted(expected), "different (key, channel) groups"
    for group, sequence in sorted(expected.items()):
        got = actual[group]
        assert len(got) == len(sequence), f"{group}: {len(got)} outputs, not {len(sequence)}"
        for want, have in zip(sequence, got, strict=True):
            assert have == want, f"{group} first differs at seq {want[0]}"


def _records(outputs: dict[tuple[str, str, str], list[Any]], tag: str) -> int:
    return sum(len(v) for k, v in outputs.items() if k[0] == tag and k[2] != "timer")


def test_native_run_covers_every_key_and_timer(native: dict[tuple[str, str, str], list[Any]]
                                               ) -> None:
    assert _records(native, "all") == MAIN_RECORDS
    assert _records(native, "ttl") == MAIN_RECORDS
    assert _records(native, "co") == 2 * SIDE_RECORDS
    for tag in ("all", "ttl", "co"):
        timers = [k for k in native if k[0] == tag and k[2] == "timer"]
        assert len(timers) == len({k[1] for k in native if k[0] == tag})


@pytest.mark.parametrize("tag", ["all", "ttl", "co"])
def test_tiered_equals_native(native: dict[tuple[str, str, str], list[Any]],
                              tiered: tuple[dict[tuple[str, str, str], list[Any]],
                                            dict[str, str], dict[str, Any]],
                              tag: str) -> None:
    outputs, _, committed = tiered
    _compare(native, outputs, tag)
    epochs, rows, catalog = committed[tag]
    assert epochs >= 1, f"{tag}: no checkpoint was committed to the store"
    assert rows > 0, f"{tag}: the store holds no committed state"
    assert catalog == EXPECTED_CATALOG[tag], "the store's catalog differs from the declarations"
