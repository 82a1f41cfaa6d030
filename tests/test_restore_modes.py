"""Lazy and eager restore, and the fresh-start policies, on a real store."""

from __future__ import annotations

import json

import pytest
from conftest import count_store_reads
from pyflink.common import Types
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import CheckpointError
from pyflink_ndb.stores.lineage import Descriptor, Token
from pyflink_ndb.testing import LocalSubtask


def _fill(store, tmp_path, options):
    first = LocalSubtask(store, options, local_dir=str(tmp_path / "first"))
    value = first.context.get_state(ValueStateDescriptor("v", Types.INT()))
    votes = first.context.get_map_state(
        MapStateDescriptor("m", Types.STRING(), Types.INT()))
    for key in range(50):
        first.key(key)
        value.update(key * 10)
        votes.put("a", key)
    first.checkpoint(1)
    first.close()


def _read_all(subtask):
    value = subtask.context.get_state(ValueStateDescriptor("v", Types.INT()))
    votes = subtask.context.get_map_state(MapStateDescriptor("m", Types.STRING(), Types.INT()))
    out = {}
    for key in range(50):
        subtask.key(key)
        out[key] = (value.value(), dict(votes.items()))
    return out


def test_lazy_restore_reads_each_key_from_the_store_when_first_needed(store, tmp_path):
    options = NdbStateOptions(cache_max_entries=10_000)
    _fill(store, tmp_path, options)
    restored = LocalSubtask(store, options, restored_checkpoint_id=1,
                            local_dir=str(tmp_path / "lazy"))
    assert restored.backend.table.store_reads == 0
    assert _read_all(restored) == {k: (k * 10, {"a": k}) for k in range(50)}
    assert restored.backend.table.store_reads >= 50
    restored.close()


def test_eager_restore_prefetches_the_key_groups(store, tmp_path):
    options = NdbStateOptions(cache_max_entries=10_000, restore_mode="eager")
    _fill(store, tmp_path, options)
    restored = LocalSubtask(store, options, restored_checkpoint_id=1,
                            local_dir=str(tmp_path / "eager"))
    reads_after_open = restored.backend.table.store_reads
    values = {}
    value = restored.context.get_state(ValueStateDescriptor("v", Types.INT()))
    for key in range(50):
        restored.key(key)
        values[key] = value.value()
    assert values == {k: k * 10 for k in range(50)}
    assert restored.backend.table.store_reads == reads_after_open, \
        "an eagerly restored value was read from the store again"
    restored.close()


def test_resume_continues_from_the_latest_committed_checkpoint(store, tmp_path):
    _fill(store, tmp_path, NdbStateOptions())
    first = store.read_operator("op").committed
    first_token = store.list_snapshots("op")[0].token.to_json()
    resumed = LocalSubtask(store, NdbStateOptions(on_fresh_start="resume"),
                           local_dir=str(tmp_path / "resume"))
    # A new branch whose lineage is the committed checkpoint; readers still see that one.
    protocol = resumed.backend.protocol
    assert protocol.restored == first
    assert protocol.branch not in {t.branch for t in first.parts}
    origin = store.load_branches([protocol.branch])[protocol.branch].origin
    assert json.loads(origin)["kind"] == "resume"
    assert store.read_operator("op").committed == first
    value = resumed.context.get_state(ValueStateDescriptor("v", Types.INT()))
    resumed.key(3)
    assert value.value() == 30
    value.update(31)
    resumed.checkpoint(1)  # checkpoint ids of the new job start again at 1
    resumed.close()
    committed = store.read_operator("op").committed
    assert committed == Descriptor((Token(protocol.branch, 1, 0, 127),))
    again = LocalSubtask(store, NdbStateOptions(), restored_checkpoint_id=1,
                         local_dir=str(tmp_path / "again"))
    value = again.context.get_state(ValueStateDescriptor("v", Types.INT()))
    again.key(3)
    assert value.value() == 31
    again.key(4)
    assert value.value() == 40
    again.close()
    # The first job's checkpoint 1 is another snapshot with the same id: still itself.
    old = LocalSubtask(store, NdbStateOptions(), restored_checkpoint_id=1,
                       restored_tokens=(first_token,), local_dir=str(tmp_path / "old"))
    value = old.context.get_state(ValueStateDescriptor("v", Types.INT()))
    old.key(3)
    assert value.value() == 30
    old.close()


def test_truncate_starts_empty(store, tmp_path, monkeypatch):
    _fill(store, tmp_path, NdbStateOptions())
    fresh = LocalSubtask(store, NdbStateOptions(on_fresh_start="truncate"),
                         local_dir=str(tmp_path / "truncate"))
    reads = count_store_reads(monkeypatch, store)  # issue 9, item 1
    assert _read_all(fresh) == {k: (None, {}) for k in range(50)}
    assert not reads, f"after truncate no miss is a round trip: {reads}"
    monkeypatch.undo()
    assert store.read_operator("op").committed is None
    assert store.query_committed("op") == []
    assert store.list_snapshots("op") == []  # the old checkpoints are released
    fresh.close()
    with pytest.raises(CheckpointError, match="can no longer be restored"):
        LocalSubtask(store, NdbStateOptions(), restored_checkpoint_id=1,
                     local_dir=str(tmp_path / "old"))


def test_a_savepoint_stays_restorable_after_a_failover_to_an_older_checkpoint(store,
                                                                             tmp_path):
    """Savepoints are pinned until released: a failover to checkpoint 1 abandons the
    attempt that took savepoint 2, and savepoint 2 still restores its own state."""
    options = NdbStateOptions(cache_max_entries=1)
    job = LocalSubtask(store, options, local_dir=str(tmp_path / "a"))
    value = job.context.get_state(ValueStateDescriptor("v", Types.INT()))
    job.key("k")
    value.update(1)
    job.checkpoint(1)
    value.update(2)
    job.snapshot(2, is_savepoint=True)  # an intermediate savepoint
    job.crash()
    # Failover to checkpoint 1 (Flink never fails over to a savepoint).
    back = LocalSubtask(store, options, restored_checkpoint_id=1,
                        local_dir=str(tmp_path / "b"))
    value = back.context.get_state(ValueStateDescriptor("v", Types.INT()))
    back.key("k")
    assert value.value() == 1
    back.close()
    savepoint = LocalSubtask(store, options, restored_checkpoint_id=2,
                             local_dir=str(tmp_path / "c"))
    value = savepoint.context.get_state(ValueStateDescriptor("v", Types.INT()))
    savepoint.key("k")
    assert value.value() == 2
    savepoint.close()


def test_restoring_a_released_savepoint_or_an_abandoned_checkpoint_fails_loudly(store,
                                                                              tmp_path):
    options = NdbStateOptions(cache_max_entries=1)
    job = LocalSubtask(store, options, local_dir=str(tmp_path / "a"), job_id="j")
    value = job.context.get_state(ValueStateDescriptor("v", Types.INT()))
    job.key("k")
    value.update(1)
    job.checkpoint(1)
    value.update(2)
    savepoint = job.snapshot(2, is_savepoint=True)
    value.update(3)
    job.checkpoint(3, complete=False)  # never completed
    job.crash()
    LocalSubtask(store, options, restored_checkpoint_id=1, attempt=1,
                 local_dir=str(tmp_path / "b"), job_id="j").close()  # a task failover
    # Checkpoint 3 never completed and the failover abandoned it: its rows are no state.
    with pytest.raises(CheckpointError, match="can no longer be restored"):
        LocalSubtask(store, options, restored_checkpoint_id=3, local_dir=str(tmp_path / "c"))
    # A released savepoint (pyflink-ndb release-savepoint) is no longer restorable either.
    token = Token.from_json(savepoint)
    assert store.delete_snapshots("op", [(token.branch, token.epoch)]) == 1
    with pytest.raises(CheckpointError, match="can no longer be restored"):
        LocalSubtask(store, options, restored_checkpoint_id=2, local_dir=str(tmp_path / "d"))


def test_a_new_job_from_a_checkpoint_reuses_checkpoint_ids(store, tmp_path):
    """Old job: checkpoint 1, savepoint 2, then a failover to 1. A new job from checkpoint 1
    takes checkpoint 2 again (Flink continues the ids): restoring its checkpoint 2 gives
    its state, and the old savepoint 2 (the same id) gives the old one."""
    options = NdbStateOptions(cache_max_entries=1)
    old = LocalSubtask(store, options, local_dir=str(tmp_path / "a"))
    value = old.context.get_state(ValueStateDescriptor("v", Types.INT()))
    old.key("k")
    value.update(1)
    old.checkpoint(1)
    value.update(2)
    old_savepoint = old.snapshot(2, is_savepoint=True)
    old.crash()
    LocalSubtask(store, options, restored_checkpoint_id=1, local_dir=str(tmp_path / "b")).close()
    new = LocalSubtask(store, options, restored_checkpoint_id=1, local_dir=str(tmp_path / "c"))
    value = new.context.get_state(ValueStateDescriptor("v", Types.INT()))
    new.key("k")
    value.update(20)
    new.checkpoint(2)
    new.crash()
    again = LocalSubtask(store, options, restored_checkpoint_id=2, local_dir=str(tmp_path / "d"))
    value = again.context.get_state(ValueStateDescriptor("v", Types.INT()))
    again.key("k")
    assert value.value() == 20
    again.close()
    older = LocalSubtask(store, options, restored_checkpoint_id=2,
                         restored_tokens=(old_savepoint,), local_dir=str(tmp_path / "e"))
    value = older.context.get_state(ValueStateDescriptor("v", Types.INT()))
    older.key("k")
    assert value.value() == 2
    older.close()
