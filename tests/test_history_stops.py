"""A stop-with-savepoint where only SOME subtasks record the stop (from a breaker,
2026-12-07; model level, LocalSubtask).

Flink reaches FINISHED (and deletes RETAIN_ON_CANCELLATION checkpoints) only when every
task finished. On the MiniCluster (tests/test_breaker_end_failed_stop_flink.py) a task
that fails after the stop's savepoint completed makes Flink 1.20 fail the job for good
(StopWithSavepointStoppingException is not recoverable): no failover, no new branch, and
Flink keeps the retained checkpoints. Here one subtask of a parallelism-2 operator hears
the savepoint's completion and closes normally (it records "ended"); its sibling is
cancelled before it (a crash: no end recorded). The job did not finish, so its retained
checkpoints must stay restorable after a later job ran past its retention.

The version that subsumed a "finished" run's checkpoints counted a run finished when the
branches made after the first ended one all ended: whether the sibling's unended branch
counted depended only on which subtask happened to open first (`ender=1` failed).
"""

from __future__ import annotations

import pytest
from test_history import Attempt

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.testing import local_key_group

RET = "RETAIN_ON_CANCELLATION"


def _key_in(lo: int, hi: int) -> str:
    return next(f"k{i}" for i in range(10_000) if lo <= local_key_group(f"k{i}") <= hi)


@pytest.mark.parametrize("ender", [0, 1])
def test_one_subtask_ending_does_not_finish_a_job_whose_sibling_was_cancelled(
        store, local_dir, ender):
    """Subtasks 0 (key groups 0-63) and 1 (64-127) of job a (num-retained 2) open in that
    order (branch ids grow), complete checkpoints 1-5 and take stop savepoint 6. Subtask
    `ender` hears it completed and closes normally; the other is cancelled (crash) before
    it closes. The job did not finish: Flink keeps chk-4 and chk-5. Job b restores chk-5
    and runs past its retention; job c must restore chk-4 with its exact values.
    `ender=1` failed with the bug (the unended subtask 0 has the lower branch id, and
    b's retention subsumed chk-4)."""
    opts = NdbStateOptions(cache_max_entries=1, checkpoints_retained=2)
    ranges = [(0, 63), (64, 127)]
    keys = [_key_in(lo, hi) for lo, hi in ranges]
    a = [Attempt(store, local_dir, opts, job_id="a" * 32, externalized_retention=RET,
                 subtask_index=i, key_group_start=lo, key_group_end=hi)
         for i, (lo, hi) in enumerate(ranges)]
    assert a[0].t.backend.protocol.branch < a[1].t.backend.protocol.branch
    for cp in range(1, 6):
        for i in (0, 1):
            a[i].put(keys[i], cp)
            a[i].t.checkpoint(cp)
    for i in (0, 1):
        a[i].put(keys[i], 6)
        a[i].t.snapshot(6, is_savepoint=True, ends_job=True)
    a[ender].t.complete(6)
    a[ender].t.close()
    a[1 - ender].t.crash()  # cancelled: the job fails, it never reaches FINISHED
    ended = {b: o.ended for b, o in store.branch_origins("op").items()}
    assert sorted(ended.values(), key=str) == [6, None]

    b = [Attempt(store, local_dir, NdbStateOptions(cache_max_entries=1,
                                                   checkpoints_retained=1),
                 job_id="b" * 32, restored_checkpoint_id=5, externalized_retention=RET,
                 subtask_index=i, key_group_start=lo, key_group_end=hi)
         for i, (lo, hi) in enumerate(ranges)]
    for cp in range(7, 12):
        for i in (0, 1):
            b[i].put(keys[i], cp * 10)
            b[i].t.checkpoint(cp)
    for x in b:
        x.t.crash()

    c = [Attempt(store, local_dir, opts, job_id="c" * 32, restored_checkpoint_id=4,
                 subtask_index=i, key_group_start=lo, key_group_end=hi)
         for i, (lo, hi) in enumerate(ranges)]
    assert [c[i].get(keys[i]) for i in (0, 1)] == [4, 4]
    for x in c:
        x.t.crash()
