"""Task-local recovery (`local.recovery`): a failed attempt's tier 2 taken over by the
next attempt of the subtask in the same interpreter (pyflink_ndb/tiers/handover.py).

The next attempt restores a checkpoint of the failed one; what the failed attempt changed
after that checkpoint must not be read from its tier 2 (it is deleted there and read from
the store), everything else is read locally. Each test compares with what the store alone
gives (`local.recovery: false`) and counts the store's point reads."""

from __future__ import annotations

from typing import Any

import pytest
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.testing import LocalSubtask
from pyflink_ndb.tiers import handover

ANY = Types.PICKLED_BYTE_ARRAY()


class Attempt:
    """One subtask attempt with a ValueState, a MapState and a ListState."""

    def __init__(self, store: Any, local_dir: str, options: NdbStateOptions,
                 **kwargs: Any) -> None:
        self.t = LocalSubtask(store, options, local_dir=local_dir, **kwargs)
        ctx = self.t.context
        self.v = ctx.get_state(ValueStateDescriptor("v", ANY))
        self.m = ctx.get_map_state(MapStateDescriptor("m", ANY, ANY))
        self.l = ctx.get_list_state(ListStateDescriptor("l", ANY))

    def write(self, key: Any, n: int) -> None:
        self.t.key(key)
        self.v.update(n)
        self.m.put(n % 3, n)
        self.l.add(n)

    def read(self, key: Any) -> tuple[Any, ...]:
        self.t.key(key)
        return (self.v.value(), dict(self.m.items()), list(self.l.get() or []))

    @property
    def store_reads(self) -> int:
        return self.t.backend.table.store_reads


def value_reads(attempt: Attempt) -> int:
    """The store's point reads for reading every key's ValueState."""
    before = attempt.store_reads
    for k in KEYS:
        attempt.t.key(k)
        attempt.v.value()
    return attempt.store_reads - before


def options(**kw: Any) -> NdbStateOptions:
    return NdbStateOptions(**{"cache_max_entries": 8, "checkpoints_retained": 3, **kw})


KEYS = [f"k{i}" for i in range(60)]


def run_and_crash(store: Any, local_dir: str, opts: NdbStateOptions) -> tuple[Attempt, str]:
    """Attempt 0: checkpoint 1 completed over every key; checkpoint 2 written but never
    heard completed; more changes after it; a key evicted, read back from tier 2 and
    changed in tier 1 only; then a crash. Returns the attempt and its job id."""
    a = Attempt(store, local_dir, opts, job_id="j" * 32)
    for i, k in enumerate(KEYS):
        a.write(k, i)
    a.t.checkpoint(1)
    for k in KEYS[:10]:
        a.write(k, 100)
    a.t.checkpoint(2, complete=False)  # durable; Flink may or may not have completed it
    for k in KEYS[10:20]:
        a.write(k, 200)
    a.read(KEYS[30])  # back from tier 2 into tier 1 ...
    a.write(KEYS[30], 300)  # ... and changed there only: tier 2 holds the older copy
    a.t.crash()
    return a, "j" * 32


@pytest.mark.parametrize("restored", [1, 2])
def test_the_next_attempt_reads_the_failed_attempts_tier_2_exactly(store, local_dir,
                                                                   restored):
    """Restore of checkpoint 1 (2 never completed) or 2: every key reads as the store
    alone gives it, and the keys the failed attempt did not change after the checkpoint
    cost no read of the store."""
    a, job = run_and_crash(store, local_dir, options())
    b = Attempt(store, local_dir, options(), job_id=job, attempt=1,
                restored_checkpoint_id=restored)
    assert b.t.backend.protocol.taken_over is not None
    local_reads = value_reads(b)
    got = {k: b.read(k) for k in KEYS}
    b.t.crash()
    handover.discard_all()
    c = Attempt(store, local_dir, options(local_recovery=False), job_id=job, attempt=2,
                restored_checkpoint_id=restored)
    assert c.t.backend.protocol.taken_over is None
    store_reads = value_reads(c)
    want = {k: c.read(k) for k in KEYS}
    assert got == want
    assert want["k0"] == ((100, {0: 0, 1: 100}, [0, 100]) if restored == 2
                          else (0, {0: 0}, [0]))
    assert want[KEYS[30]] == (30, {0: 30}, [30])
    # Each ValueState read costs the store a point read without the take-over; with it
    # only the keys changed after the checkpoint do (the map's iteration and the list
    # still ask the store: tier 2 may hold only part of a key's entries).
    assert store_reads == len(KEYS)
    assert local_reads == (20 if restored == 1 else 10) + 1


def test_a_restore_older_than_a_completed_checkpoint_does_not_take_it_over(store, local_dir):
    """The failed attempt heard checkpoint 2 completed: it no longer tells epochs 1 and 2
    apart, so a restore of checkpoint 1 (a new job starting from a retained checkpoint)
    leaves its tier 2 and reads the store."""
    opts = options()
    a = Attempt(store, local_dir, opts, job_id="j" * 32)
    for i, k in enumerate(KEYS):
        a.write(k, i)
    a.t.checkpoint(1)
    a.write("k0", 100)
    a.t.checkpoint(2)
    a.t.crash()
    b = Attempt(store, local_dir, opts, job_id="n" * 32, restored_checkpoint_id=1)
    assert b.t.backend.protocol.taken_over is None
    assert b.read("k0") == (0, {0: 0}, [0])


def test_a_savepoint_of_the_failed_attempt_is_taken_over(store, local_dir):
    """A new job restoring a savepoint of the crashed attempt in the same interpreter."""
    opts = options()
    a = Attempt(store, local_dir, opts, job_id="j" * 32)
    for i, k in enumerate(KEYS):
        a.write(k, i)
    a.t.checkpoint(1)
    a.write("k1", 100)
    a.t.snapshot(2, is_savepoint=True)
    a.t.complete(2)
    a.write("k2", 200)
    a.t.crash()
    b = Attempt(store, local_dir, opts, job_id="n" * 32, restored_checkpoint_id=2)
    assert b.t.backend.protocol.taken_over is not None
    assert [b.read(k)[0] for k in ("k0", "k1", "k2")] == [0, 100, 2]


def test_nothing_is_taken_over_without_the_option_or_tier_2(store, local_dir):
    for op, opts in (("op1", options(local_recovery=False)),
                     ("op2", options(local_enabled=False))):
        a = Attempt(store, local_dir, opts, job_id="j" * 32, operator=op)
        a.write("k0", 1)
        a.t.checkpoint(1)
        a.t.crash()
        assert handover.parked_count() == 0
        b = Attempt(store, local_dir, opts, job_id="j" * 32, attempt=1,
                    restored_checkpoint_id=1, operator=op)
        assert b.t.backend.protocol.taken_over is None
        assert b.read("k0") == (1, {1: 1}, [1])
        b.t.crash()


def test_a_normal_close_parks_nothing_and_a_tier_not_taken_expires(store, local_dir,
                                                                   monkeypatch):
    opts = options()
    a = Attempt(store, local_dir, opts, job_id="j" * 32)
    a.write("k0", 1)
    a.t.checkpoint(1)
    a.t.close()
    assert handover.parked_count() == 0
    monkeypatch.setattr(handover, "PARKED_TTL_S", 0.2)
    b = Attempt(store, local_dir, opts, job_id="j" * 32, restored_checkpoint_id=1)
    b.t.crash()
    assert handover.parked_count() == 1
    import time

    deadline = time.monotonic() + 5
    while handover.parked_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert handover.parked_count() == 0
