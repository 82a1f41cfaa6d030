"""The traps of keyed state, on every tier option set and store, both on live state
("live") and after a checkpoint, a crash and a restore ("restored")."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyflink.common.time import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream.functions import AggregateFunction
from pyflink.datastream.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)
from pyflink.datastream.window import CountWindow, GlobalWindow, TimeWindow

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import SerializationError, ValueTooLargeError
from pyflink_ndb.stores import StateStore
from pyflink_ndb.testing import LocalSubtask, ManualClock

ANY = Types.PICKLED_BYTE_ARRAY()
TTL_MS = 1000

#: Byte and text values that trip drivers, collations and encoders.
EDGE_VALUES: list[Any] = [
    b"", "", "\x00abc", b"\xff\xfe", b"\x00", "😀", "e\u0301", "\u00e9", "\U0001d11e",
    "a\U0001f468\u200d\U0001f469\u200d\U0001f467b", "\ufeff", " ", "'\"\\;--",
]


class ListSum(AggregateFunction):
    """Accumulator: [count, total] (a mutable list, to catch aliasing)."""

    def create_accumulator(self) -> list[int]:
        return [0, 0]

    def add(self, value: int, accumulator: list[int]) -> list[int]:
        accumulator[0] += 1
        accumulator[1] += value
        return accumulator

    def get_result(self, accumulator: list[int]) -> list[int]:
        return accumulator

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


def ttl_config(update_type: StateTtlConfig.UpdateType) -> StateTtlConfig:
    return (StateTtlConfig.new_builder(Time.milliseconds(TTL_MS))
            .set_update_type(update_type)
            .set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)
            .build())


class Harness:
    """One subtask over its attempts: states are declared again after every restart."""

    def __init__(self, store: StateStore, options: NdbStateOptions, local_dir: str,
                 phase: str) -> None:
        self.store = store
        self.options = options
        self.local_dir = local_dir
        self.phase = phase
        self.clock = ManualClock()
        self.last_checkpoint = 0
        self.last_completed: int | None = None
        self.sub = LocalSubtask(store, options, local_dir=local_dir, clock=self.clock)

    # -- states ---------------------------------------------------------------------------
    @staticmethod
    def _ttl(descriptor: Any, ttl: StateTtlConfig.UpdateType | None) -> Any:
        if ttl is not None:
            descriptor.enable_time_to_live(ttl_config(ttl))
        return descriptor

    def value(self, name: str = "v", ttl: StateTtlConfig.UpdateType | None = None) -> Any:
        return self.sub.context.get_state(self._ttl(ValueStateDescriptor(name, ANY), ttl))

    def list(self, name: str = "l", ttl: StateTtlConfig.UpdateType | None = None) -> Any:
        return self.sub.context.get_list_state(self._ttl(ListStateDescriptor(name, ANY), ttl))

    def map(self, name: str = "m", ttl: StateTtlConfig.UpdateType | None = None) -> Any:
        return self.sub.context.get_map_state(
            self._ttl(MapStateDescriptor(name, ANY, ANY), ttl))

    def reducing(self, name: str = "r") -> Any:
        return self.sub.context.get_reducing_state(
            ReducingStateDescriptor(name, lambda a, b: a + b, ANY))

    def aggregating(self, name: str = "a") -> Any:
        return self.sub.context.get_aggregating_state(
            AggregatingStateDescriptor(name, ListSum(), ANY))

    def key(self, key: Any) -> Harness:
        self.sub.key(key)
        return self

    # -- life cycle -----------------------------------------------------------------------
    def checkpoint(self, complete: bool = True) -> int:
        self.last_checkpoint += 1
        self.sub.checkpoint(self.last_checkpoint, complete=complete)
        if complete:
            self.last_completed = self.last_checkpoint
        return self.last_checkpoint

    def crash_and_restore(self) -> None:
        """Crash; restore from the latest completed checkpoint (fresh start if none)."""
        self.sub.crash()
        self.sub = LocalSubtask(self.store, self.options,
                                restored_checkpoint_id=self.last_completed,
                                local_dir=self.local_dir, clock=self.clock)

    def restart(self) -> None:
        """A completed checkpoint, a crash and a restore from it."""
        self.checkpoint()
        self.crash_and_restore()

    def maybe_restart(self) -> None:
        if self.phase == "restored":
            self.restart()

    def close(self) -> None:
        self.sub.close()


@pytest.fixture(params=["live", "restored"])
def phase(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_harness(store: StateStore, tiers: NdbStateOptions, local_dir: str, phase: str
                 ) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(**option_changes: Any) -> Harness:
        harness = Harness(store, tiers.replace(**option_changes), local_dir, phase)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


@pytest.fixture
def h(make_harness: Callable[..., Harness]) -> Harness:
    return make_harness()


# -- absent vs None ---------------------------------------------------------------------

def test_absent_map_key_versus_key_with_value_none(h: Harness) -> None:
    m = h.map()
    h.key("k")
    m.put("none", None)
    m.put("zero", 0)
    h.maybe_restart()
    m = h.map()
    h.key("k")
    assert m.get("none") is None
    assert m.get("absent") is None
    assert m["absent"] is None  # PyFlink's MapState.__getitem__ is get(): no KeyError
    assert m.contains("none") and "none" in m
    assert not m.contains("absent") and "absent" not in m
    assert dict(m.items()) == {"none": None, "zero": 0}
    assert sorted(m.keys(), key=str) == ["none", "zero"]
    assert not m.is_empty()
    m.remove("none")
    assert not m.contains("none")
    h.restart()
    m = h.map()
    h.key("k")
    assert dict(m.items()) == {"zero": 0}
    assert not m.contains("none")


# -- TTL --------------------------------------------------------------------------------

@pytest.mark.parametrize("update_type", [StateTtlConfig.UpdateType.OnCreateAndWrite,
                                         StateTtlConfig.UpdateType.OnReadAndWrite],
                         ids=["on-write", "on-read-and-write"])
def test_ttl_value_expires_and_stays_gone(h: Harness,
                                          update_type: StateTtlConfig.UpdateType) -> None:
    v = h.value(ttl=update_type)
    h.key("k")
    v.update("x")
    h.clock.advance(600)
    h.key("k")
    assert v.value() == "x"  # with OnReadAndWrite this read extends the TTL to 1600
    h.maybe_restart()
    v = h.value(ttl=update_type)
    h.key("other")
    assert v.value() is None
    h.key("k")
    h.clock.advance(500)  # 1100 ms after the write
    if update_type == StateTtlConfig.UpdateType.OnReadAndWrite:
        assert v.value() == "x"
        h.clock.advance(TTL_MS + 1)
    assert v.value() is None
    # Expired stays expired: after a restore, and after the store collected it.
    h.restart()
    v = h.value(ttl=update_type)
    h.key("k")
    assert v.value() is None
    h.restart()
    v = h.value(ttl=update_type)
    h.key("k")
    assert v.value() is None
    assert h.store.query_committed("op", "v") == []
    # A new value lives again.
    v.update("y")
    assert v.value() == "y"


def test_ttl_value_update_in_cache_extends_expiry(h: Harness) -> None:
    v = h.value(ttl=StateTtlConfig.UpdateType.OnCreateAndWrite)
    h.key("k")
    v.update(1)
    h.clock.advance(900)
    v.update(2)
    h.maybe_restart()
    v = h.value(ttl=StateTtlConfig.UpdateType.OnCreateAndWrite)
    h.key("k")
    h.clock.advance(900)
    assert v.value() == 2
    h.clock.advance(101)
    assert v.value() is None


def test_ttl_expired_list_elements_leave_no_empty_list(h: Harness) -> None:
    on_write = StateTtlConfig.UpdateType.OnCreateAndWrite
    items = h.list(ttl=on_write)
    h.key("k")
    items.add("a")
    h.clock.advance(600)
    items.add_all(["b", "c"])
    h.maybe_restart()
    items = h.list(ttl=on_write)
    h.key("k")
    h.clock.advance(500)
    assert items.get() == ["b", "c"]
    h.clock.advance(600)
    assert items.get() == []
    assert list(items) == []
    h.restart()
    items = h.list(ttl=on_write)
    h.key("k")
    assert items.get() == []
    assert h.store.query_committed("op", "l") == []
    # No leftover head or segment: a new element starts a fresh list.
    items.add("d")
    assert items.get() == ["d"]
    h.restart()
    items = h.list(ttl=on_write)
    h.key("k")
    assert items.get() == ["d"]


def test_ttl_expired_map_entries_leave_no_empty_map(h: Harness) -> None:
    on_write = StateTtlConfig.UpdateType.OnCreateAndWrite
    m = h.map(ttl=on_write)
    h.key("k")
    m.put("a", 1)
    h.clock.advance(600)
    m.put("b", None)
    h.maybe_restart()
    m = h.map(ttl=on_write)
    h.key("k")
    h.clock.advance(500)
    assert not m.contains("a") and m.get("a") is None
    assert m.contains("b")
    assert list(m.items()) == [("b", None)]
    h.clock.advance(600)
    assert m.is_empty()
    assert list(m) == [] and list(m.values()) == [] and list(m.items()) == []
    assert not m.contains("b")
    h.restart()
    m = h.map(ttl=on_write)
    h.key("k")
    assert m.is_empty()
    assert h.store.query_committed("op", "m") == []


# -- keys do not leak -------------------------------------------------------------------

def fill_all(h: Harness, key: Any, tag: int) -> None:
    h.key(key)
    h.value().update(("v", tag))
    h.list().add_all([tag, tag + 1])
    h.map().put_all({"x": tag, tag: "y"})
    h.reducing().add(tag)
    h.aggregating().add(tag)


def read_all(h: Harness, key: Any) -> tuple[Any, ...]:
    h.key(key)
    m = h.map()
    return (h.value().value(), h.list().get(), dict(m.items()), m.is_empty(),
            h.reducing().get(), h.aggregating().get())


EMPTY = (None, [], {}, True, None, None)


def test_values_of_other_keys_never_leak(h: Harness) -> None:
    # Keys whose encodings share prefixes with each other.
    keys = ["a", "ab", 1, 256, (1,), (1, 2)]
    for tag, key in enumerate(keys):
        fill_all(h, key, tag * 10)
    # Switch through other keys without touching state.
    for key in ("never", 2, "b", (2,)):
        h.key(key)
    assert read_all(h, "never-either") == EMPTY
    h.maybe_restart()
    for key in ("never", 2, "b", (2,)):
        h.key(key)
    assert read_all(h, "never") == EMPTY
    for tag, key in enumerate(keys):
        t = tag * 10
        assert read_all(h, key) == (("v", t), [t, t + 1], {"x": t, t: "y"}, False, t,
                                    [1, t]), key
    assert read_all(h, 2) == EMPTY


# -- add(None) --------------------------------------------------------------------------

def test_add_none_rules(h: Harness) -> None:
    h.key("k")
    items, reducing, aggregating = h.list(), h.reducing(), h.aggregating()
    items.add_all([1, 2])
    reducing.add(5)
    aggregating.add(5)
    h.maybe_restart()
    h.key("k")
    items, reducing, aggregating = h.list(), h.reducing(), h.aggregating()
    with pytest.raises(ValueError):
        items.add(None)
    with pytest.raises(ValueError):
        items.add_all([3, None])
    with pytest.raises(ValueError):
        items.update([None])
    assert items.get() == [1, 2]
    # PyFlink's embedded ReducingState/AggregatingState clear on add(None).
    reducing.add(None)
    aggregating.add(None)
    assert reducing.get() is None
    assert aggregating.get() is None
    h.restart()
    h.key("k")
    assert (h.list().get(), h.reducing().get(), h.aggregating().get()) == ([1, 2], None, None)
    h.aggregating().add(3)
    assert h.aggregating().get() == [1, 3]


def test_value_update_none_clears(h: Harness) -> None:
    h.key("k")
    h.value().update(0)
    h.maybe_restart()
    h.key("k")
    assert h.value().value() == 0
    h.value().update(None)
    assert h.value().value() is None
    h.restart()
    h.key("k")
    assert h.value().value() is None


# -- empty containers -------------------------------------------------------------------

def test_empty_list_and_map(h: Harness) -> None:
    h.key("fresh")
    assert h.list().get() == [] and isinstance(h.list().get(), list)
    h.key("updated-empty")
    h.list().update([])
    h.key("cleared")
    h.list().add_all(["a", "b"])
    h.list().update([])
    h.key("none")
    h.list().add("z")
    h.list().update(None)
    h.key("add-all-empty")
    h.list().add_all([])
    h.key("map-cleared")
    h.map().put("a", 1)
    h.map().clear()
    h.maybe_restart()
    for key in ("fresh", "updated-empty", "cleared", "none", "add-all-empty"):
        h.key(key)
        assert h.list().get() == [], key
        assert list(h.list()) == [], key
    for key in ("fresh", "map-cleared"):
        h.key(key)
        m = h.map()
        assert m.is_empty()
        assert list(m) == [] and list(m.keys()) == []
        assert list(m.values()) == [] and list(m.items()) == []
    h.key("cleared")
    h.list().add("c")
    assert h.list().get() == ["c"]


# -- iteration with removal over more than one page -------------------------------------

def test_remove_while_iterating_a_map_larger_than_a_page(h: Harness) -> None:
    from pyflink_ndb.tiers.table import SCAN_PAGE_ROWS

    n = 2_500
    assert n > 2 * SCAN_PAGE_ROWS
    h.key("big")
    h.map().put_all({i: f"v{i}" for i in range(n)})
    h.checkpoint()  # persisted: the entries now come from the store
    if h.phase == "restored":
        h.crash_and_restore()
    h.key("big")
    m = h.map()
    seen: list[Any] = []
    for k in m.keys():
        seen.append(k)
        if k % 3 == 0:
            m.remove(k)
        elif k % 3 == 1:
            m.put(k, f"w{k}")
    assert sorted(seen) == list(range(n))
    assert Counter(seen).most_common(1)[0][1] == 1
    expected = {i: f"w{i}" for i in range(n) if i % 3 == 1}
    expected.update({i: f"v{i}" for i in range(n) if i % 3 == 2})
    assert dict(m.items()) == expected
    h.restart()
    h.key("big")
    assert dict(h.map().items()) == expected
    assert h.map().contains(1) and not h.map().contains(0)


# -- no aliasing ------------------------------------------------------------------------

def test_mutation_never_changes_stored_state(h: Harness) -> None:
    h.key("k")
    payload = [1, {"a": 2}]
    h.value().update(payload)
    h.map().put("m", payload)
    h.list().add(payload)
    listed = [[7]]
    h.list("l2").update(listed)
    h.reducing().add([1])
    payload.append(3)
    payload[1]["a"] = 99
    listed.append([8])
    listed[0].append(9)
    h.maybe_restart()
    h.key("k")
    for got in (h.value().value(), h.map().get("m"), h.list().get()[0]):
        assert got == [1, {"a": 2}]
        got.append("mutated")
        got[1]["a"] = -1
    h.list().get().append("x")
    h.list("l2").get()[0].append("y")
    h.reducing().get().append(2)
    h.aggregating().add(1)
    h.aggregating().get().append(5)
    for item in h.map().values():
        item.append("z")
    h.key("k")
    assert h.value().value() == [1, {"a": 2}]
    assert h.map().get("m") == [1, {"a": 2}]
    assert h.list().get() == [[1, {"a": 2}]]
    assert h.list("l2").get() == [[7]]
    assert h.reducing().get() == [1]
    assert h.aggregating().get() == [1, 1]


# -- key identity -----------------------------------------------------------------------

def test_key_identity_of_flink_keys(h: Harness) -> None:
    keys = [1, 1.0, True, 0.0, -0.0, "1", b"1", (1, "a"), (1, ("a", 2)), None, False, 0]
    for i, key in enumerate(keys):
        h.key(key)
        h.value().update(i)
    h.key(float("nan"))
    h.value().update("nan")
    h.maybe_restart()
    for i, key in enumerate(keys):
        h.key(key)
        assert h.value().value() == i, key
    h.key(float("nan"))  # another NaN object
    assert h.value().value() == "nan"
    h.key((1, "a"))
    assert h.value().value() == keys.index((1, "a"))


def test_key_identity_of_map_keys(h: Harness) -> None:
    nan = float("nan")
    keys = [1, 1.0, True, 0.0, -0.0, "1", b"1", (1, "a"), frozenset({1, 2}), None, "", b""]
    h.key("k")
    m = h.map()
    for i, key in enumerate(keys):
        m.put(key, i)
    m[nan] = "nan"
    h.maybe_restart()
    h.key("k")
    m = h.map()
    for i, key in enumerate(keys):
        assert m.contains(key), key
        assert m.get(key) == i, key
    assert m.get(float("nan")) == "nan" and float("nan") in m
    items = list(m.items())
    assert len(items) == len(keys) + 1
    typed = {(type(k), repr(k)): v for k, v in items}
    assert typed == {**{(type(k), repr(k)): i for i, k in enumerate(keys)},
                     (float, "nan"): "nan"}
    assert any(isinstance(k, float) and math.isnan(k) for k in m.keys())
    del m[(1, "a")]
    assert not m.contains((1, "a"))
    assert m.contains(frozenset({2, 1}))


@pytest.mark.parametrize("bad_key", [[1], {"a": 1}, {1, 2}],
                         ids=["list", "dict", "set"])
def test_unhashable_map_key_raises_and_changes_nothing(h: Harness, bad_key: Any) -> None:
    h.key("k")
    h.map().put("ok", 1)
    h.maybe_restart()
    h.key("k")
    m = h.map()
    for call in (lambda: m.put(bad_key, 2), lambda: m.get(bad_key),
                 lambda: m.contains(bad_key), lambda: m.remove(bad_key),
                 lambda: m.__setitem__(bad_key, 2), lambda: m.__delitem__(bad_key),
                 lambda: m.__getitem__(bad_key), lambda: bad_key in m,
                 # put_all is all or nothing: "new" must not be written either.
                 lambda: m.put_all(_BadDict([("new", 1), (bad_key, 2)]))):
        with pytest.raises(TypeError):
            call()
    assert dict(m.items()) == {"ok": 1}
    h.restart()
    h.key("k")
    assert dict(h.map().items()) == {"ok": 1}


class _BadDict(dict):  # type: ignore[type-arg]
    """A mapping whose items() yields an unhashable key (a dict cannot hold one)."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        super().__init__()
        self._pairs = pairs

    def items(self) -> Any:
        return iter(self._pairs)


# -- bytes and text ---------------------------------------------------------------------

def test_bytes_and_text_round_trip_identically(h: Harness) -> None:
    for edge in EDGE_VALUES:
        h.key(edge)
        h.value().update(edge)
        h.list().add_all(EDGE_VALUES)
        h.map().put_all({e: e for e in EDGE_VALUES})
    h.key("none")
    h.map().put(None, None)
    h.maybe_restart()
    for edge in EDGE_VALUES:
        h.key(edge)
        got = h.value().value()
        assert got is not None and type(got) is type(edge) and got == edge
        assert [(type(e), e) for e in h.list().get()] == [(type(e), e) for e in EDGE_VALUES]
        items = list(h.map().items())
        assert sorted((repr(k), repr(v)) for k, v in items) == \
            sorted((repr(e), repr(e)) for e in EDGE_VALUES)
        for e in EDGE_VALUES:
            assert h.map().contains(e)
            value = h.map().get(e)
            assert type(value) is type(e) and value == e
    h.key("none")
    m = h.map()
    assert m.contains(None) and not m.contains("") and not m.contains(b"")
    h.key(b"")
    assert h.value().value() == b""
    h.key("")
    assert h.value().value() == ""


# -- oversized values -------------------------------------------------------------------

def test_value_over_the_limit_fails_the_update_and_stores_nothing(
        make_harness: Callable[..., Harness]) -> None:
    h = make_harness(value_max_bytes=1000)
    h.key("a")
    h.value().update("small")
    h.map().put("m", "small")
    h.maybe_restart()
    h.key("a")
    h.value().update("changed")
    h.key("big")
    h.value().update("kept")
    # Refused at the update, where the state and the key are known.
    with pytest.raises(ValueTooLargeError, match=r"State 'v'.*\"big\".*value.max-bytes"):
        h.value().update(b"x" * 2000)
    with pytest.raises(ValueTooLargeError, match="value.max-bytes"):
        h.map().put("m", b"y" * 2000)
    assert h.value().value() == "kept", "the refused update changed nothing"
    assert h.map().get("m") is None
    h.checkpoint()
    h.crash_and_restore()
    h.key("a")
    assert h.value().value() == "changed"
    h.key("big")
    assert h.value().value() == "kept"
    # Small enough again: the next checkpoint works.
    h.value().update(b"x" * 100)
    h.restart()
    h.key("big")
    assert h.value().value() == b"x" * 100


def test_key_over_the_limit_fails_the_update_and_stores_nothing(h: Harness) -> None:
    from pyflink_ndb.stores.base import MAX_UKEY_BYTES

    h.key("a")
    h.value().update("kept")
    h.maybe_restart()
    h.key("many")
    h.map().put_all({i: i for i in range(1_200)})
    with pytest.raises(ValueTooLargeError, match=f"State 'm'.*{MAX_UKEY_BYTES} bytes"):
        h.map().put("z" * (MAX_UKEY_BYTES + 1), 1)
    h.checkpoint()
    h.crash_and_restore()
    h.key("many")
    assert dict(h.map().items()) == {i: i for i in range(1_200)}
    h.key("a")
    assert h.value().value() == "kept"


# -- long lists -------------------------------------------------------------------------

def test_list_appended_over_many_checkpoints(h: Harness, monkeypatch) -> None:
    """One segment per checkpoint (none counts as small here), compacted after
    MAX_SEGMENTS (32) segments."""
    from pyflink_ndb.state import list as list_state
    from pyflink_ndb.state.list import MAX_SEGMENTS

    monkeypatch.setattr(list_state, "SMALL_SEGMENT_BYTES", 0)

    expected: list[int] = []
    for cp in range(MAX_SEGMENTS + 5):
        h.key("k")
        h.list().add(cp)
        h.list().add_all([cp, -cp])
        expected += [cp, cp, -cp]
        h.checkpoint(complete=cp % 4 != 3)
        if cp == MAX_SEGMENTS // 2:
            h.maybe_restart()
    h.key("k")
    assert h.list().get() == expected
    h.restart()
    h.key("k")
    assert h.list().get() == expected
    h.list().update([1])
    h.restart()
    h.key("k")
    assert h.list().get() == [1]


def _segments(h: Harness) -> int:
    state = h.list()
    return state._head(*state._key())[0]


def test_a_short_list_stays_one_segment_across_checkpoints(h: Harness) -> None:
    """Issue 9: appends go to the newest segment while it is under SMALL_SEGMENT_BYTES,
    whichever epoch wrote it; a head whose segment count stays is not written again (its
    epoch token goes stale, which only steers the layout)."""
    expected: list[str] = []
    for cp in range(40):
        h.key("short")
        h.list().add(f"e{cp}")
        expected.append(f"e{cp}")
        dirty = h.sub.backend.table.dirty_count
        h.list().add(f"f{cp}")
        expected.append(f"f{cp}")
        assert h.sub.backend.table.dirty_count == dirty == (2 if cp == 0 else 1), \
            "the segment alone per epoch (the head only when the list is created)"
        h.checkpoint(complete=cp % 4 != 3)
        if cp == 20:
            h.maybe_restart()
        h.key("short")
        assert _segments(h) == 1, cp
    h.key("short")
    assert h.list().get() == expected
    h.restart()
    h.key("short")
    assert h.list().get() == expected and _segments(h) == 1


def test_list_heads_read_through_a_small_memo(h: Harness, monkeypatch) -> None:
    """The decoded heads are remembered by their bytes (a memo of 2 here, emptied when
    full): lists of several keys whose heads change every checkpoint read back exactly."""
    from pyflink_ndb.state import list as list_state

    monkeypatch.setattr(list_state, "SMALL_SEGMENT_BYTES", 0)
    monkeypatch.setattr(list_state, "HEAD_MEMO_ENTRIES", 2)
    monkeypatch.setattr(list_state, "_HEADS", {})
    expected: dict[str, list[int]] = {f"k{i}": [] for i in range(5)}
    for cp in range(6):
        for n, key in enumerate(expected):
            if n > cp:
                continue  # keys start at different checkpoints: heads differ
            h.key(key)
            h.list().add(cp)
            expected[key].append(cp)
            assert _segments(h) == cp - n + 1, (key, cp)
        h.checkpoint()
        assert len(list_state._HEADS) <= 2
    h.maybe_restart()
    for key, values in expected.items():
        h.key(key)
        assert h.list().get() == values, key


def test_a_long_list_opens_a_new_segment_once_the_newest_is_large(h: Harness) -> None:
    from pyflink_ndb.state.list import SMALL_SEGMENT_BYTES

    element = "x" * (SMALL_SEGMENT_BYTES // 3)
    for cp in range(9):
        h.key("long")
        h.list().add(element + str(cp))
        h.checkpoint()
        h.key("long")
        # three elements fill a segment past the threshold; the fourth opens the next one
        assert _segments(h) == 1 + cp // 3, cp
    h.maybe_restart()
    h.key("long")
    assert h.list().get() == [element + str(cp) for cp in range(9)]


# -- namespaces (window state, issue 11) ------------------------------------------------
W1, W2, W3 = TimeWindow(0, 10), TimeWindow(10, 20), TimeWindow(20, 30)


def test_namespaces_keep_separate_values(h):
    v = h.key("k").value()
    v.update("global")
    for window, value in ((W1, "one"), (W2, "two"), (CountWindow(7), "count"),
                          (GlobalWindow(), "all")):
        v.set_current_namespace(window)
        v.update(value)
    h.maybe_restart()
    v = h.key("k").value()          # asking for a state resets it to no namespace (Flink)
    assert v.value() == "global"
    for window, value in ((W1, "one"), (W2, "two"), (CountWindow(7), "count"),
                          (GlobalWindow(), "all")):
        v.set_current_namespace(window)
        assert v.value() == value
    v.set_current_namespace(W3)
    assert v.value() is None
    v.set_current_namespace(TimeWindow(0, 10))      # equal windows are the same namespace
    assert v.value() == "one"


def test_a_map_without_namespace_does_not_see_the_windows_entries(h):
    m = h.key("k").map()
    m.put("a", 1)
    m.set_current_namespace(W1)
    m.put("b", 2)
    m.put(W2, "window as map key")          # the merging window set maps windows
    h.maybe_restart()
    m = h.key("k").map()
    assert dict(m.items()) == {"a": 1}
    m.set_current_namespace(W1)
    assert dict(m.items()) == {"b": 2, W2: "window as map key"}
    m.set_current_namespace(None)
    m.clear()
    assert m.is_empty()
    m.set_current_namespace(W1)
    assert m.get("b") == 2


def test_list_merge_namespaces_appends_the_sources_to_the_target(h):
    lst = h.key("k").list()
    for window, items in ((W1, [1, 2]), (W2, [3]), (W3, [4, 5])):
        lst.set_current_namespace(window)
        lst.add_all(items)
    h.maybe_restart()
    lst = h.key("k").list()
    lst.merge_namespaces(W1, [W2, W3])
    assert lst.get() == [1, 2, 3, 4, 5]       # the target is current afterwards
    for window in (W2, W3):
        lst.set_current_namespace(window)
        assert lst.get() == []


def test_reducing_merge_namespaces_reduces_into_the_target(h):
    r = h.key("k").reducing()
    for window, value in ((W1, 5), (W2, 2), (W3, 3)):
        r.set_current_namespace(window)
        r.add(value)
    h.maybe_restart()
    r = h.key("k").reducing()
    r.merge_namespaces(W1, [W2, W3])
    assert r.get() == 10        # Flink keeps the target's value; PyFlink 1.20 would give 5
    r.set_current_namespace(W2)
    assert r.get() is None


def test_aggregating_merge_namespaces_merges_accumulators(h):
    a = h.key("k").aggregating()
    for window, values in ((W1, [1]), (W2, [2, 3]), (W3, [])):
        a.set_current_namespace(window)
        for value in values:
            a.add(value)
    h.maybe_restart()
    a = h.key("k").aggregating()
    a.merge_namespaces(W1, [W2, W3])
    assert a.get() == [3, 6]
    a.set_current_namespace(W2)
    assert a.get() is None
    a.merge_namespaces(TimeWindow(40, 50), [W1])
    assert a.get() == [3, 6]


def test_a_custom_window_type_is_refused_with_the_fix(h):
    class MyWindow:
        pass

    v = h.key("k").value()
    with pytest.raises(SerializationError, match="TimeWindow, CountWindow and GlobalWindow"):
        v.set_current_namespace(MyWindow())
