"""What readers see (`committed`) after a restore of a snapshot that is only restorable in
part: retention is decided per subtask, so one subtask may have dropped its part of an old
checkpoint (and garbage-collected the versions only that part saw) while another subtask
still holds its own part (real MariaDB)."""

from __future__ import annotations

import pytest
from conftest import TIER_OPTIONS, mysql_connect
from pyflink.common import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.errors import CheckpointError
from pyflink_ndb.serialization.keys import encode_key
from pyflink_ndb.stores import views
from pyflink_ndb.stores.lineage import version_of
from pyflink_ndb.testing import LocalSubtask, local_key_group

OPERATOR = "op"


def _pair(store, local_dir, job_id):
    """Subtasks 0 (key groups 0-63) and 1 (64-127) of one job."""
    return [LocalSubtask(store, TIER_OPTIONS["cache10k"], subtask_index=i,
                         key_group_start=a, key_group_end=b, job_id=job_id,
                         local_dir=f"{local_dir}/{job_id}-{i}")
            for i, (a, b) in enumerate(((0, 63), (64, 127)))]


@pytest.mark.mysql
def test_a_restore_of_a_partly_released_checkpoint_does_not_move_what_readers_see(
        store_factory, local_dir, mysql_url):
    """Subtask 0 retains its last 2 completed checkpoints; subtask 1's completion
    notifications of checkpoints 4-6 are lost (Flink does not guarantee them), so it keeps
    its part of checkpoint 3 while subtask 0 released its part and deleted the version of
    checkpoint 3 (a savepoint keeps an older one). A new job is then started from
    checkpoint 3: subtask 1's claim succeeds, subtask 0's fails (its part is gone). What
    readers see must not become checkpoint 3 on the strength of subtask 1's part: a
    validated read (views.versions_read_query + newest_in_ranges, committed unchanged)
    would answer the savepoint's older value, which checkpoint 3 never held."""
    store = store_factory("mysql")
    key = next(f"k{i}" for i in range(1000) if local_key_group(f"k{i}") <= 63)
    kg = local_key_group(key)
    x, y = _pair(store, local_dir, "job-a")
    value = x.context.get_state(ValueStateDescriptor("v", Types.STRING()))
    y.context.get_state(ValueStateDescriptor("v", Types.STRING()))
    branch = x.backend.protocol.branch

    def both(checkpoint_id, is_savepoint=False, complete_y=True):
        for t in (x, y):
            t.snapshot(checkpoint_id, is_savepoint)
        x.complete(checkpoint_id)
        if complete_y:
            y.complete(checkpoint_id)

    x.key(key)
    value.update("old")
    both(1)
    both(2, is_savepoint=True)  # keeps version 1 ("old") of the key
    value.update("new")
    both(3)
    value.update("newer")
    for checkpoint_id in (4, 5, 6):
        both(checkpoint_id, complete_y=False)
    x.backend.drain()
    x.crash()
    y.crash()

    con = mysql_connect(mysql_url)
    try:
        cur = con.cursor()
        cur.execute(views.versions_read_query(store.namespace),
                    (kg, store.state_ids(OPERATOR)[0], encode_key(key)))
        stored = sorted(r[0] for r in cur.fetchall())
        assert version_of(branch, 3) not in stored, "checkpoint 3's version was collected"
        assert version_of(branch, 1) in stored, "the savepoint's version stays"

        # A new job from checkpoint 3: subtask 1 claims first, subtask 0 cannot restore.
        for index, (a, b) in ((1, (64, 127)), (0, (0, 63))):
            try:
                LocalSubtask(store, TIER_OPTIONS["cache10k"], subtask_index=index,
                             key_group_start=a, key_group_end=b, job_id="job-b",
                             local_dir=f"{local_dir}/job-b-{index}",
                             restored_checkpoint_id=3).crash()
            except CheckpointError:
                pass
            else:
                assert index == 1, "subtask 0 restored a part that is gone"

        committed = store.read_operator(OPERATOR).committed
        assert committed is not None
        ranges = next(r for a, b, r, _ in store.committed_segments(committed)
                      if a <= kg <= b)
        cur.execute(views.versions_read_query(store.namespace),
                    (kg, store.state_ids(OPERATOR)[0], encode_key(key)))
        row = views.newest_in_ranges(cur.fetchall(), ranges)
        seen = {3: version_of(branch, 3), 6: version_of(branch, 4)}[committed.checkpoint_id]
        assert row is not None and row[0] == seen, (
            f"committed is checkpoint {committed.checkpoint_id}, whose version of the key "
            f"is {seen}; the validated read answered version {row and row[0]}")
    finally:
        con.close()
