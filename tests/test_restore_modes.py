"""Lazy and eager restore, and the fresh-start policies, on a real store."""

from __future__ import annotations

from pyflink.common import Types
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
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


def test_resume_continues_from_the_latest_committed_epoch(store, tmp_path):
    _fill(store, tmp_path, NdbStateOptions())
    resumed = LocalSubtask(store, NdbStateOptions(on_fresh_start="resume"),
                           local_dir=str(tmp_path / "resume"))
    assert resumed.backend.epoch_offset() == 1
    value = resumed.context.get_state(ValueStateDescriptor("v", Types.INT()))
    resumed.key(3)
    assert value.value() == 30
    value.update(31)
    resumed.checkpoint(1)  # checkpoint ids of the new job start again at 1: epoch 2
    resumed.close()
    again = LocalSubtask(store, NdbStateOptions(), restored_checkpoint_id=1,
                         restored_epoch_offset=1, local_dir=str(tmp_path / "again"))
    value = again.context.get_state(ValueStateDescriptor("v", Types.INT()))
    again.key(3)
    assert value.value() == 31
    again.key(4)
    assert value.value() == 40
    again.close()


def test_truncate_starts_empty(store, tmp_path):
    _fill(store, tmp_path, NdbStateOptions())
    fresh = LocalSubtask(store, NdbStateOptions(on_fresh_start="truncate"),
                         local_dir=str(tmp_path / "truncate"))
    assert _read_all(fresh) == {k: (None, {}) for k in range(50)}
    assert store.latest_committed_epoch("op") is None
    fresh.close()


def test_restoring_a_savepoint_that_a_failover_rolled_back_fails_loudly(store, tmp_path):
    import pytest

    from pyflink_ndb.errors import CheckpointError

    options = NdbStateOptions(cache_max_entries=1)
    job = LocalSubtask(store, options, local_dir=str(tmp_path / "a"))
    value = job.context.get_state(ValueStateDescriptor("v", Types.INT()))
    job.key("k")
    value.update(1)
    job.checkpoint(1)
    value.update(2)
    job.backend.snapshot(2, is_savepoint=True)  # an intermediate savepoint
    job.crash()
    # Failover to checkpoint 1 (Flink never fails over to a savepoint): savepoint 2's rows
    # are rolled back, so restoring it later must not silently return checkpoint 1's state.
    LocalSubtask(store, options, restored_checkpoint_id=1,
                 local_dir=str(tmp_path / "b")).close()
    with pytest.raises(CheckpointError, match="can no longer be restored"):
        LocalSubtask(store, options, restored_checkpoint_id=2, local_dir=str(tmp_path / "c"))


def test_a_new_job_from_a_savepoint_reuses_rolled_back_epochs(store, tmp_path):
    """Old job: checkpoint 1, savepoint 2, checkpoint 3, then a failover to 1 rolls back
    savepoint 2. A new job from checkpoint 1 takes checkpoints 2 and 3 again (Flink continues
    the ids): restoring its checkpoint 2 is valid."""
    options = NdbStateOptions(cache_max_entries=1)
    old = LocalSubtask(store, options, local_dir=str(tmp_path / "a"))
    value = old.context.get_state(ValueStateDescriptor("v", Types.INT()))
    old.key("k")
    value.update(1)
    old.checkpoint(1)
    value.update(2)
    old.backend.snapshot(2, is_savepoint=True)
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
