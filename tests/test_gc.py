"""Garbage collection (docs/protocol.md, "Garbage collection"): `versions_to_keep` and the
`VersionLedger` alone, and what the store keeps after checkpoints of a `LocalSubtask`.

Rule: of the versions of one entry keep the newest version visible to each protected
snapshot and to the running branch's head, and every version newer than the branch's
latest completed checkpoint; a kept tombstone that hides nothing is dropped too."""

from __future__ import annotations

import gc
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.checkpoint.gc import EntryVersions, VersionLedger, versions_to_keep
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.serialization import encode_key
from pyflink_ndb.stores import StateStore
from pyflink_ndb.stores.base import COMPLETED, WriteRow
from pyflink_ndb.stores.lineage import Ranges, in_ranges, own_range, split_version, version_of
from pyflink_ndb.testing import LocalSubtask

REF = (5, 9, b"key")
OTHER = (5, 9, b"other")
B = 1  # the branch of the unit examples


def v(epoch: int, branch: int = B) -> int:
    return version_of(branch, epoch)


def at(epoch: int, branch: int = B) -> Ranges:
    """What snapshot (branch, epoch) of a fresh branch sees."""
    return (own_range(branch, epoch),)


HEAD: Ranges = (own_range(B),)


def keep(entries: dict[int, bool], views: list[Ranges], keep_above: int) -> set[int]:
    """versions_to_keep over {version: tombstone}."""
    versions = sorted(entries)
    return versions_to_keep(versions, [entries[x] for x in versions], views, keep_above)


def epochs(versions: set[int]) -> list[int]:
    return sorted(split_version(x)[1] for x in versions)


# -- versions_to_keep, by example -------------------------------------------------------

def test_only_the_versions_that_retained_snapshots_see_are_kept() -> None:
    values = {v(e): False for e in (1, 2, 3)}
    assert epochs(keep(values, [HEAD, at(3)], v(3))) == [3]
    # Retained 2 and 3 (num-retained 1, plus one for readers).
    assert epochs(keep(values, [HEAD, at(2), at(3)], v(3))) == [2, 3]


def test_each_retained_checkpoint_keeps_its_version() -> None:
    values = {v(e): False for e in (1, 2, 4, 6)}
    # Snapshots 3, 5 and 6 see versions 2, 4 and 6.
    assert epochs(keep(values, [HEAD, at(3), at(5), at(6)], v(6))) == [2, 4, 6]
    assert epochs(keep(values, [HEAD, at(6), at(7), at(8)], v(8))) == [6]


def test_versions_newer_than_the_latest_completed_checkpoint_are_kept() -> None:
    values = {v(e): False for e in (1, 2, 3)}
    # 2 and 3 may still complete; 1 is what the completed checkpoint sees.
    assert epochs(keep(values, [HEAD, at(1)], v(1))) == [1, 2, 3]
    assert epochs(keep(values, [HEAD, at(1)], v(0))) == [1, 2, 3]


def test_a_tombstone_with_nothing_older_is_dropped() -> None:
    entry = {v(1): False, v(2): True}
    assert keep(entry, [HEAD, at(2)], v(2)) == set()
    # Not while it is newer than the latest completed checkpoint.
    assert epochs(keep(entry, [HEAD, at(1)], v(1))) == [1, 2]


def test_a_tombstone_is_kept_while_an_older_checkpoint_needs_the_value() -> None:
    entry = {v(1): False, v(2): True}
    # Snapshot 1 reads the value, snapshot 2 must not: the tombstone hides it.
    assert epochs(keep(entry, [HEAD, at(1), at(2)], v(2))) == [1, 2]
    assert keep(entry, [HEAD, at(2), at(3)], v(3)) == set()


def test_savepoints_are_views_like_any_protected_snapshot() -> None:
    values = {v(e): False for e in (1, 2, 3, 4)}
    # Savepoint 2 and checkpoint 4.
    assert epochs(keep(values, [HEAD, at(2), at(4)], v(4))) == [2, 4]


def test_views_across_branches() -> None:
    """Branch 2 restored snapshot (1, 2): epoch 3 of branch 1 is abandoned."""
    child_head: Ranges = (own_range(1, 2), own_range(2))
    child_at_1: Ranges = (own_range(1, 2), own_range(2, 1))
    entry = {v(1, 1): False, v(2, 1): False, v(3, 1): False, v(1, 2): False}
    assert keep(entry, [child_head, child_at_1], v(1, 2)) == {v(1, 2)}
    # Until the child's first checkpoint completes its parent's state stays.
    assert keep(entry, [child_head, (own_range(1, 2),)], v(0, 2)) == {v(2, 1), v(1, 2)}
    # A savepoint of the abandoned attempt keeps what it sees.
    assert keep(entry, [child_head, child_at_1, (own_range(1, 3),)], v(1, 2)) == \
        {v(3, 1), v(1, 2)}
    # An entry the child never wrote: the restored version is what the child reads.
    assert keep({v(1, 1): False, v(3, 1): False}, [child_head, child_at_1], v(1, 2)) == \
        {v(1, 1)}


# -- versions_to_keep against a reference -----------------------------------------------

def read(entry: dict[int, bool], view: Ranges) -> int | None:
    """What a view reads: the newest version inside it, None for a tombstone or nothing."""
    seen = [x for x in entry if in_ranges(x, view)]
    if not seen or entry[max(seen)]:
        return None
    return max(seen)


version_sets = st.dictionaries(
    st.tuples(st.integers(1, 3), st.integers(1, 6)).map(lambda be: version_of(*be)),
    st.booleans(), max_size=10)
views_strategy = st.lists(
    st.lists(st.tuples(st.integers(1, 3), st.integers(0, 6)).map(
        lambda be: own_range(be[0], be[1])), min_size=1, max_size=3).map(tuple),
    min_size=1, max_size=4)


@settings(max_examples=500, deadline=None)
@given(entry=version_sets, views=views_strategy,
       keep_above=st.tuples(st.integers(1, 3), st.integers(0, 6)).map(
           lambda be: version_of(*be)))
def test_kept_versions_read_the_same_in_every_view(entry: dict[int, bool],
                                                   views: list[Ranges],
                                                   keep_above: int) -> None:
    kept = keep(entry, views, keep_above)
    assert kept <= set(entry)
    remaining = {x: entry[x] for x in kept}
    for view in views:
        assert read(remaining, view) == read(entry, view), (view, entry, kept)
    assert {x for x in entry if x > keep_above} <= kept
    # At most one version per view besides those not completed yet.
    assert len({x for x in kept if x <= keep_above}) <= len(views)


# -- VersionLedger ----------------------------------------------------------------------

def test_ledger_records_versions_in_order_and_rewrites_replace_the_flag() -> None:
    ledger = VersionLedger()
    ledger.record(REF, v(2), tombstone=True)
    ledger.record(REF, v(1), tombstone=False)
    ledger.record(REF, v(2), tombstone=False)  # written again in the same epoch
    ledger.record(OTHER, v(1), tombstone=True)
    entry = ledger.get(REF)
    assert entry is not None
    assert (entry.versions, entry.tombstones, entry.complete) == ((v(1), v(2)),
                                                                   (False, False), False)
    assert ledger.pending == {REF, OTHER}
    assert len(ledger) == 2
    assert ledger.get((0, 0, b"never")) is None


@given(st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=30))
def test_entry_versions_stay_sorted_unique_with_the_last_flag(
        writes: list[tuple[int, bool]]) -> None:
    entry = EntryVersions()
    for version, tombstone in writes:
        entry = entry.add(version, tombstone)
    last = dict(writes)
    assert entry.versions == tuple(sorted(last))
    assert entry.tombstones == tuple(last[version] for version in sorted(last))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.booleans()),
                         max_size=12), max_size=6),
       st.integers(2, 8), st.sets(st.integers(0, 3)))
def test_recording_an_epoch_at_once_equals_recording_its_rows_one_by_one(
        epochs: list[list[tuple[int, int, bool]]], max_entries: int,
        inherited: set[int]) -> None:
    """`record_epoch` (the writer's fast path) against a loop over `record`: the same
    versions, flags, completeness, order of eviction and pending set, also when epochs
    come back to an older version and when the bounded ledger forgets entries."""
    one_by_one, at_once = VersionLedger(max_entries), VersionLedger(max_entries)
    asked: list[int] = []

    def only_own(key_group: int) -> bool:
        asked.append(key_group)
        return key_group not in inherited
    for epoch, writes in enumerate(epochs, 1):
        version = v(epoch if epoch % 4 else 1)  # every fourth epoch rewrites version 1
        rows = [WriteRow(kg, 9, b"k%d" % key, tomb, None if tomb else b"x", None, None)
                for kg, key, tomb in writes]
        for row in rows:
            one_by_one.record((row.key_group, row.state_id, row.ukey), version,
                              row.tombstone, row.key_group not in inherited)
        asked.clear()
        at_once.record_epoch(rows, version, only_own)
        assert len(asked) == len(set(asked))  # once per key group at most
        assert at_once.pending == one_by_one.pending
        assert at_once.forgot == one_by_one.forgot
        assert list(at_once._entries) == list(one_by_one._entries)  # the same LRU order
        for ref in one_by_one._entries:
            assert at_once.get(ref) == one_by_one.get(ref)


def test_the_ledger_leaves_the_garbage_collector_nothing_to_traverse() -> None:
    """The ledger's entries are tuples of atomic values, which CPython's cyclic garbage
    collector stops tracking once they survived collections: a full collection, which
    stops every thread of the TaskManager's interpreter, does not walk them."""
    ledger = VersionLedger()
    rows = [WriteRow(1, 9, b"k%d" % i, i % 3 == 0, None, None, None) for i in range(100)]
    ledger.record_epoch(rows, v(1), lambda key_group: True)
    ledger.record(REF, v(2), tombstone=False)
    ledger.learn(OTHER, [(v(1), True)])
    gc.collect()  # untracks the inner tuples, which makes their entry untrackable
    gc.collect()
    stored = list(ledger._entries.values())
    assert len(stored) == 102
    assert not any(gc.is_tracked(entry) for entry in stored)
    assert not any(gc.is_tracked(ref) for ref in ledger.pending)


def test_ledger_learns_older_versions_once() -> None:
    ledger = VersionLedger()
    ledger.record(REF, v(1, 2), tombstone=False)
    # Read from the store: an ancestor's versions, and the one written by this attempt
    # (its flag as recorded wins).
    entry = ledger.learn(REF, [(v(3, 1), False), (v(1, 1), True), (v(1, 2), True)])
    assert entry.complete
    assert entry.versions == (v(1, 1), v(3, 1), v(1, 2))
    assert entry.tombstones == (True, False, False)
    fresh = ledger.learn(OTHER, [])
    assert fresh.complete and fresh.versions == ()


def test_doubted_entries_are_read_from_the_store_again() -> None:
    """A failed write may have committed some rows (VersionLedger.doubt): a known entry
    becomes incomplete without losing its place or versions, an unknown one is added
    incomplete, both are pending; learning the store's versions completes them."""
    ledger = VersionLedger(max_entries=3)
    ledger.record(REF, v(1), tombstone=False, only_own=True)
    ledger.record(OTHER, v(1), tombstone=False, only_own=True)
    ledger.pending.clear()
    third = (5, 9, b"third")
    ledger.doubt([REF, third])
    entry = ledger.get(REF)
    assert entry is not None and not entry.complete and entry.versions == (v(1),)
    new = ledger.get(third)
    assert new is not None and not new.complete and new.versions == ()
    assert ledger.pending == {REF, third}
    assert list(ledger._entries) == [REF, OTHER, third]  # REF kept its place
    learned = ledger.learn(REF, [(v(1), False), (v(2), False)])
    assert learned.complete and learned.versions == (v(1), v(2))


def test_ledger_forgets_deleted_versions_and_old_entries() -> None:
    ledger = VersionLedger(max_entries=2)
    for epoch in (1, 2, 3):
        ledger.record(REF, v(epoch), tombstone=epoch == 2)
    ledger.forget_versions(REF, {v(1), v(2)})
    entry = ledger.get(REF)
    assert entry is not None and (entry.versions, entry.tombstones) == ((v(3),), (False,))
    ledger.forget_versions((0, 0, b"unknown"), {v(1)})  # nothing to forget
    ledger.record(OTHER, v(1), tombstone=False)
    ledger.record((5, 9, b"third"), v(1), tombstone=False)
    # Bounded: the least recently written entry is forgotten (read again when needed).
    assert len(ledger) == 2 and ledger.get(REF) is None


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(0, 3), version_sets, st.booleans()),
                        max_size=12),
       views_by_kg=st.lists(views_strategy, min_size=4, max_size=4),
       keep_above=st.tuples(st.integers(1, 3), st.integers(0, 6)).map(
           lambda be: version_of(*be)))
def test_deciding_many_entries_at_once_equals_versions_to_keep_per_entry(
        entries: list[tuple[int, dict[int, bool], bool]], views_by_kg: list[list[Ranges]],
        keep_above: int) -> None:
    """`VersionLedger.decide` (memoised per distinct case) and `forget_many` against
    `versions_to_keep` and `forget_versions` per entry: the same versions dropped, the
    same entries done, the same versions left; key groups 0 and 1 share their views, so
    the memo is hit across key groups."""
    views_by_kg[1] = list(views_by_kg[0])
    ledger, reference = VersionLedger(), VersionLedger()
    refs = []
    for n, (kg, versions, complete) in enumerate(entries):
        ref = (kg, 9, b"k%d" % n)
        refs.append(ref)
        for led in (ledger, reference):
            if complete:
                led.learn(ref, sorted(versions.items()))
            else:
                for x, t in sorted(versions.items()):
                    led.record(ref, x, t)
    refs.append((0, 9, b"unknown"))  # not in the ledger: skipped
    assert ledger.unknown(refs) == [r for r in refs
                                    if (e := reference.get(r)) is None or not e.complete]
    dropped, done = ledger.decide(refs, lambda kg: views_by_kg[kg], keep_above)
    want_dropped, want_done = [], []
    for ref in refs:
        entry = reference.get(ref)
        if entry is None:
            continue
        if entry.complete and len(entry.versions) == 1 and not entry.tombstones[0]:
            if entry.versions[0] <= keep_above:
                want_done.append(ref)
            continue
        if entry.versions and entry.versions[0] > keep_above:
            continue
        kept = versions_to_keep(entry.versions, entry.tombstones, views_by_kg[ref[0]],
                                keep_above)
        drop = tuple(x for x in entry.versions if x not in kept)
        if drop:
            want_dropped.append((ref, drop))
            reference.forget_versions(ref, set(drop))
        if len(kept) <= 1 and all(x <= keep_above for x in kept):
            want_done.append(ref)
    assert (dropped, done) == (want_dropped, want_done)
    ledger.forget_many(dropped)
    assert {r: ledger.get(r) for r in refs} == {r: reference.get(r) for r in refs}


Step = tuple[bool | None, bool]  # (None: no write / tombstone flag, completed)


@settings(max_examples=300, deadline=None)
@given(
    old=st.dictionaries(st.integers(1, 3), st.booleans(), max_size=3),
    steps=st.lists(st.tuples(st.one_of(st.none(), st.booleans()), st.booleans()),
                   min_size=1, max_size=25),
    retained=st.integers(1, 4),
    savepoints=st.sets(st.integers(1, 25), max_size=2),
)
def test_collection_with_the_ledger_never_changes_what_a_protected_snapshot_sees(
        old: dict[int, bool], steps: list[Step], retained: int, savepoints: set[int]) -> None:
    """One entry: versions of the restored branch 1 (epochs 1-3, unknown to the ledger),
    then branch 2 (restored from (1, 3)) writes and completes checkpoints. After every
    collection, as the protocol runs it, each protected snapshot reads what it read
    before, versions newer than the latest completed checkpoint stay, and the completed
    versions kept never outnumber the views."""
    store = {version_of(1, e): t for e, t in old.items()}  # what the database holds
    history = dict(store)  # without garbage collection
    inherited = own_range(1, 3)
    ledger = VersionLedger()
    completed: list[int] = []
    pins: list[int] = []
    for epoch, (write, complete) in enumerate(steps, start=1):
        if write is not None:
            ledger.record(REF, version_of(2, epoch), write)
            store[version_of(2, epoch)] = history[version_of(2, epoch)] = write
        if epoch in savepoints:
            pins.append(epoch)
        if not complete:
            continue
        completed.append(epoch)
        protected = sorted(set(completed[-(retained + 1):]) | set(pins))
        views = [(inherited, own_range(2))] + [(inherited, own_range(2, p))
                                               for p in protected]
        keep_above = version_of(2, epoch)
        entry = ledger.get(REF)
        if entry is None or not entry.complete:
            entry = ledger.learn(REF, sorted(store.items()))
        kept = versions_to_keep(entry.versions, entry.tombstones, views, keep_above)
        deleted = {x for x in entry.versions if x not in kept}
        for x in deleted:
            del store[x]
        ledger.forget_versions(REF, deleted)
        for view in views:
            assert read(store, view) == read(history, view), (view, store, history)
        assert {x for x in history if x > keep_above} <= set(store)
        assert len([x for x in store if x <= keep_above]) <= len(views)
        assert ledger.get(REF).versions == tuple(sorted(store))  # type: ignore[union-attr]


# -- the store after checkpoints of a LocalSubtask --------------------------------------

def versions_by_entry(store: StateStore) -> dict[tuple[int, int, bytes], list[tuple[int, int]]]:
    """(key_group, state_id, ukey) -> [(epoch, tombstone)] of every stored version (one
    branch: the epochs tell them apart)."""
    out: dict[tuple[int, int, bytes], list[tuple[int, int]]] = {}
    for kg, sid, ukey, version, tomb in store._query(
            f"SELECT key_group, state_id, ukey, version, tombstone FROM {store.t_state} "
            "WHERE chunk = 0 ORDER BY version"):
        out.setdefault((int(kg), int(sid), bytes(ukey)), []).append(
            (split_version(int(version))[1], int(tomb)))
    return out


def committed_checkpoint(store: StateStore) -> int | None:
    row = store.read_operator("op")
    return None if row is None or row.committed is None else row.committed.checkpoint_id


def test_row_counts_after_checkpoints(store: StateStore, local_dir: str) -> None:
    """10 keys rewritten every checkpoint, num-retained 1: the versions of the last two
    completed checkpoints stay (one more for readers), nothing else."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    t = LocalSubtask(store, options, local_dir=local_dir)
    value = t.context.get_state(ValueStateDescriptor("v", Types.INT()))
    counts = []
    for cp in range(1, 8):
        for key in range(10):
            t.key(key)
            value.update(cp * 100 + key)
        t.checkpoint(cp)
        counts.append(store.count_rows())
    assert counts == [10] + [20] * 6
    assert [s.epoch for s in store.list_snapshots("op")] == [6, 7]
    # A snapshot taken and not completed keeps its versions beside the retained ones.
    for key in range(10):
        t.key(key)
        value.update(-key)
    t.checkpoint(8, complete=False)
    assert store.count_rows() == 30
    t.complete(8)
    assert store.count_rows() == 20
    # Deleted keys: the tombstones stay while a retained checkpoint still sees a value.
    for key in range(10):
        t.key(key)
        value.clear()
    t.checkpoint(9)
    assert store.count_rows() == 20
    assert all([tomb for _, tomb in found] == [0, 1] for found in
               versions_by_entry(store).values())
    t.close()


def test_row_counts_with_three_retained_checkpoints(store: StateStore, local_dir: str) -> None:
    options = NdbStateOptions(cache_max_entries=10_000, checkpoints_retained=3)
    t = LocalSubtask(store, options, local_dir=local_dir)
    value = t.context.get_state(ValueStateDescriptor("v", Types.INT()))
    counts = []
    for cp in range(1, 9):
        for key in range(5):
            t.key(key)
            value.update(cp)
        t.checkpoint(cp)
        counts.append(store.count_rows())
    assert counts == [5, 10, 15, 20, 20, 20, 20, 20]
    t.close()


def test_an_entry_written_in_a_burst_keeps_one_version_once_retention_passes(
        store: StateStore, local_dir: str) -> None:
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    t = LocalSubtask(store, options, local_dir=local_dir)
    value = t.context.get_state(ValueStateDescriptor("v", Types.INT()))
    for cp in range(1, 11):
        if cp <= 2:
            t.key("once")
            value.update(cp)
        t.key("always")
        value.update(cp)
        t.checkpoint(cp)
    # Snapshots 9 and 10 and the head all see version 2 of "once"; version 1 is needed
    # by none of them.
    assert [s.epoch for s in store.list_snapshots("op")] == [9, 10]
    found = {k[2]: [e for e, _ in vs] for k, vs in versions_by_entry(store).items()}
    assert found == {encode_key("always"): [9, 10], encode_key("once"): [2]}
    t.close()


def test_a_checkpoint_that_never_completed_keeps_no_retention_slot(
        store: StateStore, local_dir: str) -> None:
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    t = LocalSubtask(store, options, local_dir=local_dir)
    value = t.context.get_state(ValueStateDescriptor("v", Types.INT()))
    for cp in range(1, 7):
        t.key("k")
        value.update(cp)
        t.checkpoint(cp, complete=cp != 5)
    # Readers moved from checkpoint 4 straight to 6: a reader that started on 4 must
    # still find its versions (one completed checkpoint more than Flink retains).
    assert committed_checkpoint(store) == 6
    completed = [s.epoch for s in store.list_snapshots("op") if s.status == COMPLETED]
    assert completed == [4, 6]
    assert [e for found in versions_by_entry(store).values() for e, _ in found] == [4, 5, 6]
    t.close()


def test_background_cleanup_removes_what_a_restore_abandoned(store: StateStore,
                                                             local_dir: str) -> None:
    """Checkpoint 2 of the first attempt never completed; the restore from checkpoint 1
    reads around its rows at once, and the first completed checkpoint of the new attempt
    deletes them (4 key groups: within one checkpoint's cleanup budget)."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    t = LocalSubtask(store, options, max_parallelism=4, local_dir=local_dir, job_id="j")
    value = t.context.get_state(ValueStateDescriptor("v", Types.INT()))
    for key in range(10):
        t.key(key)
        value.update(key)
    t.checkpoint(1)
    for key in range(10):
        t.key(key)
        value.update(100 + key)
    t.checkpoint(2, complete=False)
    t.crash()
    assert store.count_rows() == 20
    t = LocalSubtask(store, options, max_parallelism=4, restored_checkpoint_id=1,
                     local_dir=local_dir, attempt=1, job_id="j")  # a task failover
    value = t.context.get_state(ValueStateDescriptor("v", Types.INT()))
    assert [s.epoch for s in store.list_snapshots("op")] == [1]  # 2 is no snapshot now
    assert store.count_rows() == 20  # a restore deletes nothing
    t.key(0)
    value.update(-1)
    t.checkpoint(2)  # the new attempt's checkpoint 2
    # Checkpoint 1 (kept for readers) sees the 10 first versions, the new checkpoint 2
    # sees 9 of them and the new version of key 0; the abandoned epoch is gone.
    assert store.count_rows() == 11
    values = {}
    for key in range(10):
        t.key(key)
        values[key] = value.value()
    assert values == {0: -1, **{k: k for k in range(1, 10)}}
    t.close()


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
            val, m = model.get(key, (None, {}))
            m = dict(m)
            roll = rng.random()
            if roll < 0.15:
                value.clear()
                val = None
            elif roll < 0.6:
                val = rng.randrange(1000)
                value.update(val)
            elif roll < 0.8:
                mk = rng.randrange(4)
                mapping.put(mk, cp)
                m[mk] = cp
            else:
                mk = rng.randrange(4)
                mapping.remove(mk)
                m.pop(mk, None)
            model[key] = (val, m)
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


def test_retained_one_keeps_what_the_last_two_completed_checkpoints_see(
        store: StateStore, local_dir: str) -> None:
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    t = LocalSubtask(store, options, local_dir=local_dir)
    # Every fifth checkpoint is never completed (aborted); the next completion covers it.
    expected = run_workload(t, range(1, 41), random.Random(7), complete=lambda cp: cp % 5)
    t.checkpoint(41, complete=False)  # snapshotted, not (yet) completed: nothing dirty
    latest = 39
    assert committed_checkpoint(store) == latest

    versions = versions_by_entry(store)
    for entry, found in versions.items():
        completed = [e for e, _ in found if e <= latest]
        assert len(completed) <= 2, (entry, found)  # for checkpoints 38 and 39
    # Every version is one of those or of the uncompleted epoch 40.
    assert all(e <= latest or e == 40 for found in versions.values() for e, _ in found)
    assert {s.epoch for s in store.list_snapshots("op")} == {38, 39, 40, 41}

    # The committed state is still whole, and so is the one before it.
    t.crash()
    for cp in (38, latest):
        restored = LocalSubtask(store, options, restored_checkpoint_id=cp,
                                local_dir=local_dir)
        assert read_all(restored) == expected[cp]
        restored.crash()


def test_restore_from_each_of_three_retained_checkpoints(
        store_kind: str, store_factory: Any, local_dir: str) -> None:
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=3)
    store = store_factory(store_kind)
    t = LocalSubtask(store, options, local_dir=local_dir)
    expected = run_workload(t, range(1, 13), random.Random(11))
    assert len({repr(expected[c]) for c in (10, 11, 12)}) == 3
    per_entry = [len(found) for found in versions_by_entry(store).values()]
    assert max(per_entry) <= 4  # three retained checkpoints and one for readers
    t.crash()
    # Restores do not delete anything: each retained checkpoint, in any order.
    for restore_from in (10, 12, 9, 11):
        restored = LocalSubtask(store, options, restored_checkpoint_id=restore_from,
                                local_dir=local_dir)
        assert read_all(restored) == expected[restore_from], restore_from
        restored.crash()


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


def test_garbage_collection_in_chunks_ends_each_pass(store_factory, local_dir, monkeypatch):
    """Runs of a bounded chunk: entries kept for retention stay pending, and the pass still
    ends (no endless re-queueing), while old versions are still collected."""
    from pyflink.common import Types
    from pyflink.datastream.state import ValueStateDescriptor

    import pyflink_ndb.checkpoint.protocol as protocol_module
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.testing import LocalSubtask

    monkeypatch.setattr(protocol_module, "GC_ENTRIES_PER_RUN", 7)
    store = store_factory("sqlite")
    t = LocalSubtask(store, NdbStateOptions(checkpoints_retained=1), local_dir=local_dir)
    state = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    for cid in range(1, 6):
        for i in range(50):
            t.key(i)
            state.update((cid, i))
        t.checkpoint(cid)  # waits for the writer: returns only if the pass ended
    # Retained: checkpoints 4 and 5 (+1 for readers): at most 3 versions per entry.
    assert store.count_rows() <= 50 * 3
    t.close()


def test_a_drained_close_leaves_garbage_collection_to_the_restoring_attempt(
        store: StateStore, local_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop-with-savepoint: the subtask's close waits for the savepoint's completion, not
    for garbage collection (it stops at its next yield); the attempt that restores the
    savepoint adopts the entries the stopped one wrote and collects their superseded
    versions, so nothing is left behind (docs/protocol.md, "Garbage collection")."""
    import time

    from pyflink_ndb.checkpoint.protocol import CheckpointProtocol

    collect = CheckpointProtocol.collect_garbage
    mode = {"gc": "skip"}

    def slow_collect(self: CheckpointProtocol, refs: Any = None, between: Any = None,
                     **kwargs: Any) -> int:
        if mode["gc"] == "skip":
            return 0  # the stopped attempt leaves every superseded version behind
        if mode["gc"] == "block":  # a long collection that yields, as the real one does
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if between is not None:
                    between()
                time.sleep(0.01)
        return collect(self, refs, between, **kwargs)
    monkeypatch.setattr(CheckpointProtocol, "collect_garbage", slow_collect)
    options = NdbStateOptions(cache_max_entries=10, checkpoints_retained=1)
    t = LocalSubtask(store, options, local_dir=local_dir)
    value = t.context.get_state(ValueStateDescriptor("v", Types.INT()))
    for cp in range(1, 5):
        for key in range(40):
            t.key(key)
            value.update(cp * 100 + key)
        t.checkpoint(cp)
    assert store.count_rows() == 4 * 40
    t.snapshot(5, is_savepoint=True)
    mode["gc"] = "block"
    t.complete(5, wait=False)
    started = time.monotonic()
    t.close()  # drained, as at the end of stop-with-savepoint
    assert time.monotonic() - started < 10  # not the 60 s of the blocked collection
    assert store.count_rows() == 4 * 40  # nothing collected yet
    mode["gc"] = "real"
    child = LocalSubtask(store, options, restored_checkpoint_id=5, local_dir=local_dir)
    value = child.context.get_state(ValueStateDescriptor("v", Types.INT()))
    for cp in range(6, 8):
        child.key(1000)  # no entry of the savepoint is written again
        value.update(cp)
        child.checkpoint(cp)
    # The savepoint, the child's retained checkpoints and its head all see checkpoint 4's
    # versions of the 40 keys: the 3 older versions of each are gone.
    found = versions_by_entry(store)
    assert sorted(len(v) for ref, v in found.items() if ref[2] != encode_key(1000)) \
        == [1] * 40
    for key in range(40):
        child.key(key)
        assert value.value() == 400 + key
    child.close()


def test_a_pass_preempted_at_every_chance_still_ends(store_factory, local_dir, monkeypatch):
    """Each collection run gives way at its second yield (as if a checkpoint job were
    always queued): every run still does one statement whose work is remembered (versions
    read, a batch of deletions the ledger then forgets), so the pass ends and the
    superseded versions are gone."""
    from pyflink_ndb.checkpoint import protocol as protocol_module
    from pyflink_ndb.checkpoint.writer import BackgroundWriter, Preempted

    monkeypatch.setattr(protocol_module, "GC_ENTRIES_PER_YIELD", 50)
    real = BackgroundWriter.check_cancelled
    preempted = [0]

    def always_preempt(self: BackgroundWriter) -> None:
        real(self)
        running = self._s.running
        if running is not None and running.preemptible:
            preempted[0] += 1
            raise Preempted(running.name)
    monkeypatch.setattr(BackgroundWriter, "check_cancelled", always_preempt)
    store = store_factory("sqlite")
    t = LocalSubtask(store, NdbStateOptions(checkpoints_retained=1), local_dir=local_dir)
    value = t.context.get_state(ValueStateDescriptor("v", Types.INT()))
    t.backend.protocol.ledger.forgot = True  # versions are read: more statements per run
    for cid in range(1, 6):
        for key in range(400):
            t.key(key)
            value.update(cid * 1000 + key)
        t.snapshot(cid)
        t.complete(cid, wait=False)
        assert t.backend.drain(timeout_s=60), "the pass ended"
    assert preempted[0] > 10
    # Retained: checkpoints 4 and 5, +1 for readers (3): at most 3 versions per entry.
    assert max(len(v) for v in versions_by_entry(store).values()) <= 3
    for key in (0, 399):
        t.key(key)
        assert value.value() == 5000 + key
    t.close()
