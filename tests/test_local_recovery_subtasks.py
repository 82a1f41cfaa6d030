"""Task-local recovery (`local.recovery`, a breaker of 2026-12-07) with two subtasks in one
interpreter: both crash and both take their own tier over; a rescale (one subtask over
both ranges, then two again) takes no tier; two new jobs restore one savepoint at once
(one takes the tier over, the other reads the store). Every read equals the model of the
restored snapshot."""

from __future__ import annotations

from typing import Any

from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.testing import LocalSubtask, key_group_ranges, local_key_group
from pyflink_ndb.tiers import handover

ANY = Types.PICKLED_BYTE_ARRAY()
KEYS = [f"k{i}" for i in range(40)]
OPTS = NdbStateOptions(cache_max_entries=3, checkpoints_retained=5)


class Op:
    def __init__(self, store: Any, local_dir: str, parallelism: int, job: str, attempt: int,
                 restored: int | None) -> None:
        self.ranges = key_group_ranges(parallelism)
        self.ts = [LocalSubtask(store, OPTS, local_dir=local_dir, job_id=job, attempt=attempt,
                                subtask_index=i, key_group_start=a, key_group_end=b,
                                restored_checkpoint_id=restored)
                   for i, (a, b) in enumerate(self.ranges)]
        self.states = [(t.context.get_state(ValueStateDescriptor("v", ANY)),
                        t.context.get_map_state(MapStateDescriptor("m", ANY, ANY)),
                        t.context.get_list_state(ListStateDescriptor("l", ANY)))
                       for t in self.ts]

    def route(self, key: str) -> tuple[LocalSubtask, Any]:
        kg = local_key_group(key)
        i = next(i for i, (a, b) in enumerate(self.ranges) if a <= kg <= b)
        self.ts[i].key(key)
        return self.ts[i], self.states[i]

    def write(self, key: str, n: int) -> None:
        _, (v, m, lst) = self.route(key)
        v.update(n)
        m.put(n % 3, n)
        if n % 5 == 0:
            m.clear()
        lst.add(n)

    def read(self, key: str) -> Any:
        _, (v, m, lst) = self.route(key)
        return (v.value(), sorted(m.items()), list(lst.get() or []))

    def snapshot(self, cid: int, **kw: Any) -> None:
        for t in self.ts:
            t.snapshot(cid, **kw)

    def complete(self, cid: int) -> None:
        for t in self.ts:
            t.complete(cid)

    def crash(self) -> None:
        for t in self.ts:
            t.crash()

    def taken(self) -> list[bool]:
        return [t.backend.protocol.taken_over is not None for t in self.ts]


def model_write(model: dict[str, Any], key: str, n: int) -> None:
    v, m, lst = model.get(key, (None, {}, []))
    m = dict(m)
    m[n % 3] = n
    if n % 5 == 0:
        m = {}
    model[key] = (n, m, lst + [n])


def as_read(model: dict[str, Any], key: str) -> Any:
    v, m, lst = model.get(key, (None, {}, []))
    return (v, sorted(m.items()), lst)


def test_two_subtasks_crash_restore_rescale_and_two_jobs_from_one_savepoint(store, local_dir):
    model: dict[str, Any] = {}
    snaps: dict[int, dict[str, Any]] = {}
    op = Op(store, local_dir, 2, "a" * 32, 0, None)
    for i, k in enumerate(KEYS):
        op.write(k, i)
        model_write(model, k, i)
    op.snapshot(1)
    op.complete(1)
    snaps[1] = dict(model)
    for i, k in enumerate(KEYS[::3]):
        op.write(k, 100 + i)
        model_write(model, k, 100 + i)
    op.snapshot(2)  # completed by Flink, the subtasks never hear of it
    snaps[2] = dict(model)
    for i, k in enumerate(KEYS[1::4]):
        op.write(k, 200 + i)
        model_write(model, k, 200 + i)
    op.crash()
    assert handover.parked_count() == 2

    # failover: both subtasks restore checkpoint 2 and take their own tier over
    op = Op(store, local_dir, 2, "a" * 32, 1, 2)
    assert op.taken() == [True, True]
    assert {k: op.read(k) for k in KEYS} == {k: as_read(snaps[2], k) for k in KEYS}
    model = dict(snaps[2])
    for i, k in enumerate(KEYS[2::5]):
        op.write(k, 300 + i)
        model_write(model, k, 300 + i)
    op.snapshot(3, is_savepoint=True)
    snaps[3] = dict(model)
    for i, k in enumerate(KEYS[::2]):
        op.write(k, 400 + i)
        model_write(model, k, 400 + i)
    op.snapshot(4)
    op.complete(4)
    snaps[4] = dict(model)
    for i, k in enumerate(KEYS[::7]):
        op.write(k, 500 + i)
    op.crash()
    assert handover.parked_count() == 2

    # rescale: one subtask over both ranges restores 4 and takes no tier
    one = Op(store, local_dir, 1, "b" * 32, 0, 4)
    assert one.taken() == [False]
    assert handover.parked_count() == 2
    assert {k: one.read(k) for k in KEYS} == {k: as_read(snaps[4], k) for k in KEYS}
    one.crash()  # (its own tier parks, under its own branch)

    # two new jobs from savepoint 3 (older than the completed 4: the tiers cannot serve it)
    c = Op(store, local_dir, 2, "c" * 32, 0, 3)
    assert c.taken() == [False, False]
    assert {k: c.read(k) for k in KEYS} == {k: as_read(snaps[3], k) for k in KEYS}
    c.crash()
    handover.discard_all()

    # again, without a completed checkpoint after the savepoint: the first job takes over
    op = Op(store, local_dir, 2, "d" * 32, 0, 4)
    model = dict(snaps[4])
    for i, k in enumerate(KEYS[::3]):
        op.write(k, 600 + i)
        model_write(model, k, 600 + i)
    op.snapshot(5, is_savepoint=True)
    op.complete(5)
    snaps[5] = dict(model)
    for i, k in enumerate(KEYS[1::2]):
        op.write(k, 700 + i)
    op.crash()
    first = Op(store, local_dir, 2, "e" * 32, 0, 5)
    second = Op(store, local_dir, 2, "f" * 32, 0, 5)
    assert first.taken() == [True, True] and second.taken() == [False, False]
    want = {k: as_read(snaps[5], k) for k in KEYS}
    for i, k in enumerate(KEYS[::4]):  # the two jobs write concurrently
        first.write(k, 800 + i)
        second.write(k, 900 + i)
    m1, m2 = dict(snaps[5]), dict(snaps[5])
    for i, k in enumerate(KEYS[::4]):
        model_write(m1, k, 800 + i)
        model_write(m2, k, 900 + i)
    assert {k: first.read(k) for k in KEYS} == {k: as_read(m1, k) for k in KEYS}
    assert {k: second.read(k) for k in KEYS} == {k: as_read(m2, k) for k in KEYS}
    assert want  # (snapshot 5's model, unchanged by either job)
    first.crash()
    second.crash()
