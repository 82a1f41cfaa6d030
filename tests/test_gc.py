"""Garbage collection: the version ledger alone, and what the store keeps after many
checkpoints (DESIGN.md, decision 4: keep, per entry, the newest version at or below each
retained checkpoint, and every version newer than the latest completed one)."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.checkpoint.gc import Deletion, VersionLedger
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores import StateStore
from pyflink_ndb.testing import LocalSubtask

REF = (5, 9, b"key")
OTHER = (5, 9, b"other")


def deletions_of(deletions: list[Deletion], ref: tuple[int, int, bytes] = REF
                 ) -> list[tuple[str, int]]:
    return [(d.op, d.epoch) for d in deletions if (d.key_group, d.state_id, d.ukey) == ref]


# -- VersionLedger, by example ------------------------------------------------------------

def test_retained_one_keeps_only_the_newest_committed_version() -> None:
    ledger = VersionLedger()
    for epoch in (1, 2, 3):
        ledger.record(REF, epoch, tombstone=False)
    out = ledger.collect(protected=[3], latest_committed=3)
    assert sorted(deletions_of(out)) == [("<", 3), ("=", 1), ("=", 2)]
    # Nothing left to decide for this entry: the ledger forgets it.
    assert len(ledger) == 0
    assert ledger.collect(protected=[3], latest_committed=3) == []


def test_versions_newer_than_the_latest_commit_are_kept() -> None:
    ledger = VersionLedger()
    for epoch in (1, 2, 3):
        ledger.record(REF, epoch, tombstone=False)
    out = ledger.collect(protected=[1], latest_committed=1)
    # 2 and 3 may still be committed; 1 is the committed state; older unknown ones go.
    assert deletions_of(out) == [("<", 1)]
    assert len(ledger) == 1
    out = ledger.collect(protected=[3], latest_committed=3)
    assert sorted(deletions_of(out)) == [("=", 1), ("=", 2)]


def test_each_retained_checkpoint_keeps_its_version() -> None:
    ledger = VersionLedger()
    for epoch in (1, 2, 4, 6):
        ledger.record(REF, epoch, tombstone=False)
    # Retained 3, 5, 6: visible versions are 2 (for 3), 4 (for 5) and 6.
    out = ledger.collect(protected=[3, 5, 6], latest_committed=6)
    assert sorted(deletions_of(out)) == [("<", 2), ("=", 1)]
    out = ledger.collect(protected=[6, 7, 8], latest_committed=8)
    assert sorted(deletions_of(out)) == [("=", 2), ("=", 4)]


def test_protected_epoch_below_first_known_version_keeps_older_unknown_ones() -> None:
    ledger = VersionLedger()
    ledger.record(REF, 5, tombstone=False)
    # Checkpoint 3 still needs whatever version (from an earlier attempt) is below 5.
    assert deletions_of(ledger.collect(protected=[3, 5], latest_committed=5)) == []
    assert len(ledger) == 1
    assert deletions_of(ledger.collect(protected=[5, 6], latest_committed=6)) == [("<", 5)]
    assert len(ledger) == 0


def test_tombstone_with_nothing_older_is_dropped() -> None:
    ledger = VersionLedger()
    ledger.record(REF, 1, tombstone=False)
    ledger.record(REF, 2, tombstone=True)
    out = ledger.collect(protected=[2], latest_committed=2)
    assert sorted(deletions_of(out)) == [("<", 2), ("=", 1), ("=", 2)]
    assert len(ledger) == 0


def test_tombstone_is_kept_while_an_older_checkpoint_needs_the_value() -> None:
    ledger = VersionLedger()
    ledger.record(REF, 1, tombstone=False)
    ledger.record(REF, 2, tombstone=True)
    out = ledger.collect(protected=[1, 2], latest_committed=2)
    assert deletions_of(out) == [("<", 1)]
    out = ledger.collect(protected=[2, 3], latest_committed=3)
    assert sorted(deletions_of(out)) == [("=", 1), ("=", 2)]
    assert len(ledger) == 0


def test_rewrite_in_the_same_epoch_replaces_the_tombstone_flag() -> None:
    ledger = VersionLedger()
    ledger.record(REF, 1, tombstone=False)
    ledger.record(REF, 2, tombstone=True)
    ledger.record(REF, 2, tombstone=False)
    out = ledger.collect(protected=[2], latest_committed=2)
    # Epoch 2 is a value now: it stays.
    assert sorted(deletions_of(out)) == [("<", 2), ("=", 1)]


def test_entries_are_independent() -> None:
    ledger = VersionLedger()
    ledger.record(REF, 1, tombstone=False)
    ledger.record(OTHER, 1, tombstone=False)
    ledger.record(REF, 2, tombstone=False)
    out = ledger.collect(protected=[2], latest_committed=2)
    assert sorted(deletions_of(out, REF)) == [("<", 2), ("=", 1)]
    assert deletions_of(out, OTHER) == [("<", 1)]


def test_savepoint_pins_are_protected_epochs() -> None:
    ledger = VersionLedger()
    for epoch in (1, 2, 3, 4):
        ledger.record(REF, epoch, tombstone=False)
    # Savepoint at 2, retained checkpoint 4.
    out = ledger.collect(protected=[2, 4], latest_committed=4)
    assert sorted(deletions_of(out)) == [("<", 2), ("=", 1), ("=", 3)]


# -- VersionLedger against a reference ---------------------------------------------------

Write = tuple[bool | None, bool]  # (None: no write / tombstone flag, complete afterwards)


@settings(max_examples=300, deadline=None)
@given(
    old=st.dictionaries(st.integers(1, 3), st.booleans(), max_size=3),
    steps=st.lists(st.tuples(st.one_of(st.none(), st.booleans()), st.booleans()),
                   min_size=1, max_size=25),
    retained=st.integers(1, 4),
    savepoints=st.sets(st.integers(4, 30), max_size=2),
)
def test_ledger_never_changes_what_a_retained_checkpoint_sees(
        old: dict[int, bool], steps: list[Write], retained: int, savepoints: set[int]) -> None:
    """One entry: versions from an earlier attempt (epochs 1-3, unknown to the ledger),
    then epochs 4.. with writes and completions. After every collection the version
    visible at each protected epoch is unchanged and nothing above the latest commit
    is gone; the known committed versions never outnumber the protected epochs."""
    store: dict[int, bool] = dict(old)        # epoch -> tombstone, as the database has it
    history: dict[int, bool] = dict(old)      # without garbage collection
    known: set[int] = set()
    completed: list[int] = [3]
    ledger = VersionLedger()

    def visible(versions: dict[int, bool], at: int) -> Any:
        below = [e for e in versions if e <= at]
        if not below:
            return None
        newest = max(below)
        return None if versions[newest] else newest  # a tombstone reads as absent

    for epoch, (write, complete) in enumerate(steps, start=4):
        if write is not None:
            ledger.record(REF, epoch, write)
            store[epoch] = history[epoch] = write
            known.add(epoch)
        if not complete:
            continue
        completed.append(epoch)
        pins = {s for s in savepoints if s <= epoch}
        protected = sorted(set(completed[-retained:]) | pins)
        latest = epoch
        for d in ledger.collect(protected, latest):
            assert (d.key_group, d.state_id, d.ukey) == REF
            if d.op == "<":
                for e in [e for e in store if e < d.epoch]:
                    del store[e]
            else:
                assert d.op == "="
                store.pop(d.epoch, None)
        for p in protected:
            assert visible(store, p) == visible(history, p), (p, store, history)
        assert {e for e in history if e > latest} <= set(store)
        kept_known = [e for e in store if e in known and e <= latest]
        assert len(kept_known) <= len(protected)


# -- the store after many checkpoints ----------------------------------------------------

def versions_by_entry(store: StateStore) -> dict[tuple[int, int, bytes], list[tuple[int, int]]]:
    """(key_group, state_id, ukey) -> [(epoch, tombstone)] of every stored version."""
    out: dict[tuple[int, int, bytes], list[tuple[int, int]]] = {}
    for kg, sid, ukey, epoch, tomb in store._query(
            f"SELECT key_group, state_id, ukey, epoch, tombstone FROM {store.t_state} "
            "WHERE chunk = 0 ORDER BY epoch"):
        out.setdefault((int(kg), int(sid), bytes(ukey)), []).append((int(epoch), int(tomb)))
    return out


def run_workload(t: LocalSubtask, checkpoints: range, rng: random.Random,
                 complete: Any = lambda cp: True, initial: dict[Any, Any] | None = None
                 ) -> dict[int, dict[Any, Any]]:
    """Random updates, clears and map changes over 40 keys, starting from `initial`;
    returns each checkpoint's expected state {checkpoint: {key: (value, map)}}."""
    value = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    mapping = t.context.get_map_state(
        MapStateDescriptor("m", Types.PICKLED_BYTE_ARRAY(), Types.PICKLED_BYTE_ARRAY()))
    model: dict[Any, tuple[Any, dict[Any, Any]]] = dict(initial or {})
    expected: dict[int, dict[Any, Any]] = {}
    for cp in checkpoints:
        for _ in range(30):
            key = rng.randrange(40)
            t.key(key)
            v, m = model.get(key, (None, {}))
            m = dict(m)
            roll = rng.random()
            if roll < 0.15:
                value.clear()
                v = None
            elif roll < 0.6:
                v = rng.randrange(1000)
                value.update(v)
            elif roll < 0.8:
                mk = rng.randrange(4)
                mapping.put(mk, cp)
                m[mk] = cp
            else:
                mk = rng.randrange(4)
                mapping.remove(mk)
                m.pop(mk, None)
            model[key] = (v, m)
        t.checkpoint(cp, complete=complete(cp))
        expected[cp] = {k: vm for k, vm in model.items() if vm != (None, {})}
    return expected


def read_all(t: LocalSubtask) -> dict[Any, Any]:
    value = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    mapping = t.context.get_map_state(
        MapStateDescriptor("m", Types.PICKLED_BYTE_ARRAY(), Types.PICKLED_BYTE_ARRAY()))
    out = {}
    for key in range(40):
        t.key(key)
        vm = (value.value(), dict(mapping.items()))
        if vm != (None, {}):
            out[key] = vm
    return out


def test_retained_one_keeps_one_committed_version_per_live_entry(
        store: StateStore, local_dir: str) -> None:
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    t = LocalSubtask(store, options, local_dir=local_dir)
    # Every fifth checkpoint is never completed (aborted); the next completion covers it.
    expected = run_workload(t, range(1, 41), random.Random(7), complete=lambda cp: cp % 5)
    t.checkpoint(41, complete=False)  # snapshotted, not (yet) completed: nothing dirty
    latest = 39
    assert store.latest_committed_epoch("op") == latest

    versions = versions_by_entry(store)
    for entry, found in versions.items():
        committed = [(e, tomb) for e, tomb in found if e <= latest]
        assert len(committed) <= 1, (entry, found)
        # A committed tombstone with nothing older is garbage too.
        assert all(not tomb for _, tomb in committed), (entry, found)
    # Every version is either the one committed version or of the uncommitted epoch 40.
    assert all(e <= latest or e == 40 for found in versions.values() for e, _ in found)
    live = sum(1 for found in versions.values() if any(e <= latest for e, _ in found))
    assert live == sum(1 + len(m) - (v is None) for v, m in expected[latest].values())

    # The committed state is still whole.
    t.crash()
    restored = LocalSubtask(store, options, restored_checkpoint_id=latest, local_dir=local_dir)
    assert read_all(restored) == expected[latest]
    restored.close()


def test_restore_from_each_of_three_retained_checkpoints(
        store_kind: str, store_factory: Any, local_dir: str) -> None:
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=3)
    for restore_from in (12, 11, 10):
        # Each restore on its own namespace: restoring an older checkpoint invalidates the
        # newer ones, so every scenario starts from the same history.
        store = store_factory(store_kind)
        t = LocalSubtask(store, options, local_dir=local_dir)
        expected = run_workload(t, range(1, 13), random.Random(11))
        assert len({repr(expected[c]) for c in (10, 11, 12)}) == 3
        per_entry = Counter(len(v) for v in versions_by_entry(store).values())
        assert max(per_entry) <= 3
        t.crash()
        restored = LocalSubtask(store, options, restored_checkpoint_id=restore_from,
                                local_dir=local_dir)
        assert read_all(restored) == expected[restore_from], restore_from
        restored.close()


@pytest.mark.parametrize("retained", [1, 2])
def test_gc_after_restore_from_older_checkpoint(store: StateStore, local_dir: str,
                                                retained: int) -> None:
    """After falling back to an older retained checkpoint the next attempt's garbage
    collection must still leave that attempt's checkpoints restorable."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=retained)
    t = LocalSubtask(store, options, local_dir=local_dir)
    first = run_workload(t, range(1, 6), random.Random(3))
    t.crash()
    back_to = 6 - retained
    t = LocalSubtask(store, options, restored_checkpoint_id=back_to, local_dir=local_dir)
    assert read_all(t) == first[back_to]
    second = run_workload(t, range(20, 26), random.Random(4), initial=first[back_to])
    t.crash()
    t = LocalSubtask(store, options, restored_checkpoint_id=25, local_dir=local_dir)
    assert read_all(t) == second[25]
    t.close()
