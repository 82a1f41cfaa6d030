"""Every public method of PyFlink's keyed-state ABCs exists on our wrappers, implemented
(in the spirit of PyFlink's `PythonAPICompletenessTestCase`)."""

from __future__ import annotations

import inspect

import pytest
from pyflink.datastream import state as pyflink_state

from pyflink_ndb.state import (
    TieredAggregatingState,
    TieredListState,
    TieredMapState,
    TieredReducingState,
    TieredValueState,
)

PAIRS = [
    (pyflink_state.ValueState, TieredValueState),
    (pyflink_state.ListState, TieredListState),
    (pyflink_state.MapState, TieredMapState),
    (pyflink_state.ReducingState, TieredReducingState),
    (pyflink_state.AggregatingState, TieredAggregatingState),
]

#: Dunders of the API (MapState's dict protocol, ListState's iteration).
API_DUNDERS = {"__getitem__", "__setitem__", "__delitem__", "__contains__", "__iter__"}


def api_methods(abc: type) -> set[str]:
    """Public methods and API dunders that `abc` or its PyFlink bases define."""
    names: set[str] = set()
    for klass in abc.__mro__:
        if not klass.__module__.startswith("pyflink."):
            continue
        for name, member in vars(klass).items():
            if not callable(member):
                continue
            if not name.startswith("_") or name in API_DUNDERS:
                names.add(name)
    return names


@pytest.mark.parametrize(("abc", "ours"), PAIRS, ids=[a.__name__ for a, _ in PAIRS])
def test_every_api_method_is_implemented(abc: type, ours: type) -> None:
    assert issubclass(ours, abc)
    assert not inspect.isabstract(ours), ours.__abstractmethods__
    methods = api_methods(abc)
    assert methods, f"found no methods on {abc.__name__}"
    missing = sorted(m for m in methods if not hasattr(ours, m))
    assert missing == []
    still_abstract = sorted(m for m in methods
                            if getattr(getattr(ours, m), "__isabstractmethod__", False))
    assert still_abstract == []


@pytest.mark.parametrize(("abc", "ours"), PAIRS, ids=[a.__name__ for a, _ in PAIRS])
def test_signatures_accept_the_api_arguments(abc: type, ours: type) -> None:
    for name in api_methods(abc):
        theirs = inspect.signature(getattr(abc, name))
        mine = inspect.signature(getattr(ours, name))
        # Same positional parameter count, so calls written against PyFlink's API work.
        want = [p for p in theirs.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        have = [p for p in mine.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert len(have) == len(want), f"{ours.__name__}.{name}{mine} vs {theirs}"
        assert [p.name for p in have] == [p.name for p in want], \
            f"{ours.__name__}.{name}: keyword names differ from PyFlink's {theirs}"


def test_map_state_dunders_are_reachable() -> None:
    for name in API_DUNDERS:
        assert callable(getattr(TieredMapState, name))
    assert callable(TieredListState.__iter__)
