"""Adversarial scenarios against the checkpoint history (docs/protocol.md, P1-P6).

Each `xfail(strict=True)` test is a violation found by review: it fails today and must
pass once the bug is fixed. The other tests are attacks that held, kept as regression
tests. Flink's side is played by `LocalSubtask` (tokens passed explicitly where two
jobs reuse checkpoint ids); key-group ranges are Flink's
(`KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex`).
"""

from __future__ import annotations

import pickle
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import drop_namespace, unique_namespace
from pyflink.common.time import Time
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

from pyflink_ndb.checkpoint import protocol
from pyflink_ndb.cli import main as cli
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import CheckpointError, FencedError, StaleReadError
from pyflink_ndb.serialization.keys import decode_key, split_key
from pyflink_ndb.stores import StateStore, open_store
from pyflink_ndb.stores.lineage import Token
from pyflink_ndb.testing import LocalSubtask, ManualClock, key_group_ranges
from pyflink_ndb.testing import local_key_group as key_group_of

ANY = Types.PICKLED_BYTE_ARRAY()


class Job:
    """One operator at some parallelism with a value, a map and a list state."""

    def __init__(self, store: StateStore, parallelism: int, local_dir: str,
                 options: NdbStateOptions, tokens: tuple[str, ...] | None = None,
                 restored: int | None = None, clock: ManualClock | None = None,
                 ttl_ms: int | None = None, attempt: int = 0,
                 job_id: str | None = None) -> None:
        if tokens is not None and restored is None:
            restored = 1  # any id: the tokens identify the snapshot
        job_id = job_id or f"job-{uuid.uuid4().hex[:12]}"  # all subtasks' (a failover's too)
        self.ranges = key_group_ranges(parallelism)
        self.subtasks = [
            LocalSubtask(store, options, subtask_index=i, key_group_start=a, key_group_end=b,
                         restored_checkpoint_id=restored, restored_tokens=tokens,
                         local_dir=local_dir, clock=clock, attempt=attempt,
                         job_id=job_id)
            for i, (a, b) in enumerate(self.ranges)]
        self.states = []
        for t in self.subtasks:
            value = ValueStateDescriptor("v", ANY)
            if ttl_ms is not None:
                value.enable_time_to_live(
                    StateTtlConfig.new_builder(Time.milliseconds(ttl_ms))
                    .update_ttl_on_create_and_write()
                    .set_state_visibility(StateTtlConfig.StateVisibility.NeverReturnExpired)
                    .build())
            self.states.append({
                "v": t.context.get_state(value),
                "m": t.context.get_map_state(MapStateDescriptor("m", ANY, ANY)),
                "l": t.context.get_list_state(ListStateDescriptor("l", ANY))})

    def _route(self, key: Any) -> dict[str, Any]:
        kg = key_group_of(key)
        i = next(i for i, (a, b) in enumerate(self.ranges) if a <= kg <= b)
        self.subtasks[i].key(key)
        return self.states[i]

    def put(self, key: Any, value: Any) -> None:
        self._route(key)["v"].update(value)

    def get(self, key: Any) -> Any:
        return self._route(key)["v"].value()

    def state(self, key: Any) -> dict[str, Any]:
        return self._route(key)

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> tuple[str, ...]:
        return tuple(t.snapshot(checkpoint_id, savepoint) for t in self.subtasks)

    def complete(self, checkpoint_id: int) -> None:
        for t in self.subtasks:
            t.complete(checkpoint_id)

    @property
    def job_id(self) -> str:
        return self.subtasks[0].backend.info.job_id

    def checkpoint(self, checkpoint_id: int, savepoint: bool = False) -> tuple[str, ...]:
        tokens = self.snapshot(checkpoint_id, savepoint)
        self.complete(checkpoint_id)
        return tokens

    def crash(self) -> None:
        for t in self.subtasks:
            t.crash()


def committed(store: StateStore, page_rows: int = 1000) -> dict[Any, Any]:
    out = {}
    for rec in store.iter_committed("op", "v", page_rows=page_rows):
        prefix, _ = split_key(rec["ukey"])
        out[decode_key(prefix)] = pickle.loads(rec["vbytes"])
    return out


def rows_of(store: StateStore, key: Any) -> int:
    """Rows of `key` in the state table (every state, version and chunk)."""
    return sum(1 for (ukey,) in store._read("rows", f"SELECT ukey FROM {store.t_state}")
               if decode_key(split_key(bytes(ukey))[0]) == key)


@pytest.fixture
def second_store(store: StateStore, request: pytest.FixtureRequest
                 ) -> Iterator[StateStore]:
    """Another connection to the same namespace (another process / task manager)."""
    url = store.describe()
    if not url.startswith("sqlite"):
        url = request.getfixturevalue("mysql_url")
    other = open_store(NdbStateOptions(url=url, namespace=store.namespace))
    yield other
    other.close()


# == bugs ==================================================================================
def test_rescale_merge_keeps_flinks_retained_checkpoints_restorable(store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=2)
    keys = [f"k{i}" for i in range(30)]
    old = Job(store, 2, local_dir, options)
    tokens = {}
    for c in (1, 2, 3):
        for k in keys:
            old.put(k, (k, c))
        tokens[c] = old.checkpoint(c)
    old.crash()
    new = Job(store, 1, local_dir, options, tokens[3])  # rescale 2 -> 1 from checkpoint 3
    for k in keys:
        new.put(k, (k, 4))
    new.checkpoint(4)
    # num-retained = 2: Flink keeps checkpoints 3 and 4; 3 must restore exactly.
    again = Job(store, 1, local_dir, options, tokens[3])
    assert {k: again.get(k) for k in keys} == {k: (k, 3) for k in keys}


def test_lost_notification_does_not_decide_restorability(store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=3)
    j0 = Job(store, 1, local_dir, options)
    j0.put("k", 1)
    savepoint = j0.checkpoint(1, savepoint=True)
    j0.put("k", 2)
    retained = j0.snapshot(2)  # completed by the JobManager; the task is cancelled before
    # it hears of it (cancel with RETAIN_ON_CANCELLATION keeps chk-2 on disk).
    j0.crash()
    Job(store, 1, local_dir, options, savepoint).crash()  # a new job from the savepoint
    # The same sequence with the notification delivered keeps chk-2 restorable (held).
    assert Job(store, 1, local_dir, options, retained).get("k") == 2


def test_a_slow_reader_is_exact_or_detectably_stale(store, second_store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    keys = [f"k{i:02d}" for i in range(20)]
    job = Job(store, 1, local_dir, options)
    for k in keys:
        job.put(k, 1)
    job.checkpoint(1)
    reader = second_store.iter_committed("op", "v", page_rows=3)
    seen = [next(reader) for _ in range(3)]
    for c in (2, 3):  # readers are promised one checkpoint more than Flink retains
        for k in keys:
            job.put(k, c)
        job.checkpoint(c)
    try:
        seen += list(reader)
    except StaleReadError:
        return
    values = {decode_key(split_key(r["ukey"])[0]): pickle.loads(r["vbytes"]) for r in seen}
    assert values in ({k: c for k in keys} for c in (1, 2, 3)), values


def test_superseded_versions_of_cold_entries_are_collected_after_a_crash(store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    a = Job(store, 1, local_dir, options)
    a.put("cold", 0)
    a.checkpoint(1)
    for c in range(2, 7):
        a.put("cold", c)
        last = a.snapshot(c)  # completed by Flink, notifications lost
    a.crash()
    b = Job(store, 1, local_dir, options, last)
    for c in range(7, 12):
        b.put("hot", c)
        b.checkpoint(c)
    assert b.get("cold") == 6
    # Every protected snapshot and the head see the same version of "cold" (P6: at most
    # one version per protected snapshot plus the head, i.e. one here).
    assert rows_of(store, "cold") == 1


def test_a_refused_restore_leaves_readers_on_a_completed_checkpoint(store, second_store,
                                                                    local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=2)
    j0 = Job(store, 1, local_dir, options)
    tokens = {}
    for c in (1, 2, 3):
        j0.put("k", c)
        tokens[c] = j0.checkpoint(c)
    claim = second_store.claim_new_branch

    def claim_while_j0_runs_on(*args: Any, **kwargs: Any) -> Any:
        for c in (4, 5):  # J0 still runs: 4 and 5 complete, 2 is subsumed meanwhile
            j0.put("k", c)
            j0.checkpoint(c)
        return claim(*args, **kwargs)
    second_store.claim_new_branch = claim_while_j0_runs_on  # type: ignore[method-assign]
    with pytest.raises(CheckpointError, match="no longer be restored"):
        Job(second_store, 1, local_dir, options, tokens[2])
    # The refused attempt must leave what readers see on the latest completed checkpoint.
    assert committed(store) == {"k": 5}


def store_url(store: StateStore, request: pytest.FixtureRequest) -> str:
    url = store.describe()
    return url if url.startswith("sqlite") else str(request.getfixturevalue("mysql_url"))


def test_releasing_one_jobs_savepoint_keeps_a_sibling_jobs_savepoint(store, local_dir,
                                                                     request):
    options = NdbStateOptions(cache_max_entries=1)
    base = Job(store, 1, local_dir, options)
    base.put("k", 0)
    start = base.checkpoint(1, savepoint=True)
    base.crash()
    savepoints = []
    for value in (1, 2):  # two jobs from one savepoint: both take savepoint 2
        job = Job(store, 1, local_dir, options, start)
        job.put("k", value)
        savepoints.append(job.checkpoint(2, savepoint=True))
        job.crash()
    # Checkpoint id 2 names two savepoints: the CLI refuses to guess.
    args = ["release", "--url", store_url(store, request), "--namespace", store.namespace,
            "--operator", "op", "--checkpoint", "2"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code != 0 and "several jobs" in out.output, out.output
    first = Token.from_json(savepoints[0][0]).branch
    out = CliRunner().invoke(cli, [*args, "--branch", str(first)])
    assert out.exit_code == 0, out.output
    assert Job(store, 1, local_dir, options, savepoints[1]).get("k") == 2


def test_side_branch_checkpoints_can_be_released(store, local_dir, request):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    keys = [f"k{i}" for i in range(50)]
    j0 = Job(store, 1, local_dir, options)
    for k in keys:
        j0.put(k, 0)
    start = j0.checkpoint(1, savepoint=True)
    for c in (2, 3):
        for k in keys:
            j0.put(k, c)
        j0.checkpoint(c)  # J0's retained checkpoints: a side branch once J1 runs
    j0.crash()
    j1 = Job(store, 1, local_dir, options, start)
    for c in range(2, 8):
        j1.put("x", c)
        j1.checkpoint(c)
    assert store.count_rows() >= 2 * len(keys)  # J0's checkpoints 2 and 3 are kept
    # J0's retained checkpoints are deleted from Flink's storage: release them.
    for c in (2, 3):
        out = CliRunner().invoke(cli, ["release", "--url", store_url(store, request),
                                       "--namespace", store.namespace, "--operator", "op",
                                       "--checkpoint", str(c), "--job", j0.job_id])
        assert out.exit_code == 0, out.output
    for c in range(8, 10):
        j1.put("x", c)
        j1.checkpoint(c)
    assert store.count_rows() <= len(keys) + 2


def test_cleanup_spends_its_budget_on_a_large_abandoned_snapshot(store, local_dir, request):
    options = NdbStateOptions(cache_max_entries=100_000, checkpoints_retained=1)
    store = open_store(NdbStateOptions(url=store_url(store, request),
                                       namespace=store.namespace, write_batch_rows=2))
    request.addfinalizer(store.close)
    assert store.delete_limit_rows == 20
    keys = [f"k{i}" for i in range(200)]
    a = Job(store, 1, local_dir, options)
    a.put("x", 0)
    first = a.checkpoint(1)
    for k in keys:
        a.put(k, 2)
    a.snapshot(2)  # never completed: 200 abandoned rows once the job fails over
    a.crash()
    b = Job(store, 1, local_dir, options, first, attempt=1, job_id=a.job_id)  # a task failover
    b.put("x", 3)
    b.checkpoint(3)  # 64 cleanup statements of 20 rows: room for 1280 rows
    b.put("x", 4)
    b.checkpoint(4)
    assert store.count_rows() <= 3, store.count_rows()


def test_cleanup_out_of_time_leaves_the_rest_to_the_next_checkpoint(store, local_dir,
                                                                   monkeypatch):
    """The wall-clock bound of a checkpoint's background work: with no time left the
    cleanup deletes nothing and loses nothing; the next checkpoint with time finishes it."""
    options = NdbStateOptions(cache_max_entries=100_000, checkpoints_retained=1)
    a = Job(store, 1, local_dir, options)
    a.put("x", 0)
    first = a.checkpoint(1)
    for k in range(50):
        a.put(f"k{k}", 2)
    a.snapshot(2)  # never completed: 50 abandoned rows once the job fails over
    a.crash()
    rows = store.count_rows()
    monkeypatch.setattr(protocol, "BACKGROUND_SECONDS_PER_CHECKPOINT", -1.0)
    b = Job(store, 1, local_dir, options, first, attempt=1, job_id=a.job_id)
    b.checkpoint(3)
    assert store.count_rows() == rows  # out of time before its first statement
    assert b.get("x") == 0 and b.get("k1") is None
    monkeypatch.setattr(protocol, "BACKGROUND_SECONDS_PER_CHECKPOINT", 3600.0)
    b.checkpoint(4)
    assert store.count_rows() <= 3, store.count_rows()
    assert b.get("x") == 0 and b.get("k1") is None


# == attacks that held =====================================================================
@pytest.mark.mysql
def test_a_snapshot_recorded_after_the_opens_first_read_is_still_forgotten(
        store, local_dir, monkeypatch):
    """The replaced attempt's pending snapshot 2 is recorded just after the failover's
    open read the snapshot list (its writer was still finishing): the claim decides what
    to forget on the rows it reads under the owner row's lock, so 2 is forgotten all the
    same (a failover restores the latest completed checkpoint: Flink never completed 2)."""
    options = NdbStateOptions(cache_max_entries=100_000, checkpoints_retained=1)
    a = Job(store, 1, local_dir, options)
    a.put("x", 0)
    first = a.checkpoint(1)
    a.put("x", 2)
    a.snapshot(2)  # pending
    a.crash()
    real = store.list_snapshots
    monkeypatch.setattr(store, "list_snapshots", lambda operator=None: [
        r for r in real(operator) if r.epoch != 2])  # the list read before 2 was recorded
    b = Job(store, 1, local_dir, options, first, attempt=1, job_id=a.job_id)  # a task failover
    monkeypatch.undo()
    assert sorted(r.epoch for r in store.list_snapshots()) == [1]
    assert b.get("x") == 0


def test_zombie_flushing_in_a_thread_while_the_replacement_claims(mysql_url, local_dir):
    namespace = unique_namespace("adv")
    stores = [open_store(NdbStateOptions(url=mysql_url, namespace=namespace,
                                         write_batch_rows=20)) for _ in range(2)]
    try:
        options = NdbStateOptions(cache_max_entries=100_000, write_batch_rows=20,
                                  checkpoints_retained=1)
        keys = [f"k{i}" for i in range(1200)]
        zombie = Job(stores[0], 1, local_dir, options)
        for k in keys:
            zombie.put(k, 1)
        first = zombie.checkpoint(1)
        for k in keys:
            zombie.put(k, 2)
        zombie.put("zombie-only", 2)
        outcome: list[str] = []

        def flush() -> None:
            try:
                zombie.snapshot(2)
                outcome.append("written")
            except FencedError:
                outcome.append("fenced")
        thread = threading.Thread(target=flush)
        thread.start()
        time.sleep(0.1)  # some batches are in
        replacement = Job(stores[1], 1, local_dir, options, first)
        thread.join()
        # Usually fenced mid-flush (its early batches are in); a fast server may let it
        # finish before the claim: the replacement must read the same either way.
        assert outcome in (["fenced"], ["written"])
        assert [k for k in keys if replacement.get(k) != 1] == []
        assert replacement.get("zombie-only") is None
        for k in keys[:100]:
            replacement.put(k, 3)
        replacement.checkpoint(3)
        for c in (4, 5, 6):
            replacement.put("x", c)
            last = replacement.checkpoint(c)
        wanted = {**{k: 1 for k in keys}, **{k: 3 for k in keys[:100]}, "x": 6}
        assert committed(stores[1]) == wanted
        assert committed(stores[1]) == wanted
        again = Job(stores[1], 1, local_dir, options, last)
        assert {k: again.get(k) for k in wanted} == wanted
    finally:
        for s in stores:
            s.close()
        drop_namespace(mysql_url, namespace)


def test_rescale_2_3_1_with_zombies_of_the_old_parallelism_notified_late(store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    keys = [f"k{i}" for i in range(40)]
    two = Job(store, 2, local_dir, options)
    for k in keys:
        two.put(k, (2, k))
        two.state(k)["m"].put("p", 2)
        two.state(k)["l"].add(2)
    t1 = two.checkpoint(1)
    for k in keys:
        two.put(k, "late")
    two.snapshot(2)  # the JobManager never completes it
    three = Job(store, 3, local_dir, options, t1)
    with pytest.raises(FencedError):
        two.complete(2)
    with pytest.raises(FencedError):
        two.complete(1)
    for k in keys:
        assert three.get(k) == (2, k)
        three.state(k)["m"].put("p", 3)
        three.state(k)["l"].add(3)
    t3 = three.checkpoint(3)
    assert committed(store) == {k: (2, k) for k in keys}
    one = Job(store, 1, local_dir, options, t3)
    with pytest.raises(FencedError):
        three.complete(3)
    for k in keys:
        s = one.state(k)
        assert (s["v"].value(), dict(s["m"].items()), s["l"].get()) == ((2, k), {"p": 3},
                                                                         [2, 3])
    for k in keys[::2]:
        one.state(k)["m"].remove("p")
        one.state(k)["l"].clear()
    for c in (4, 5, 6):
        one.put("x", c)
        t = one.checkpoint(c)
    again = Job(store, 3, local_dir, options, t)
    for i, k in enumerate(keys):
        s = again.state(k)
        assert (dict(s["m"].items()), s["l"].get()) == (({}, []) if i % 2 == 0 else
                                                        ({"p": 3}, [2, 3]))


@pytest.mark.parametrize("retained", [1, 2, 3])
def test_retention_with_lost_notifications_aborts_and_savepoints(store, local_dir, retained):
    """Checkpoints 1..10 of one job, some notifications lost, some aborted, savepoints in
    between; afterwards Flink's retained checkpoints and every savepoint restore exactly."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=retained)
    job = Job(store, 2, local_dir, options)
    keys = [f"k{i}" for i in range(8)]
    flink_completed: list[int] = []
    savepoints: list[int] = []
    snaps: dict[int, tuple[tuple[str, ...], dict[str, Any]]] = {}
    model: dict[str, Any] = {}
    for c in range(1, 11):
        for k in keys[: c % len(keys) + 1]:
            model[k] = (c, k)
            job.put(k, model[k])
        savepoint = c in (3, 7)
        tokens = job.snapshot(c, savepoint)
        snaps[c] = (tokens, dict(model))
        if c in (5, 9):
            for t in job.subtasks:  # aborted: Flink never completes it
                t.abort(c)
            continue
        (savepoints if savepoint else flink_completed).append(c)
        if c in (2, 4, 6):  # lost, or only one subtask heard of it
            job.subtasks[0].complete(c)
            continue
        job.complete(c)
    job.crash()
    for c in flink_completed[-retained:] + savepoints:
        tokens, wanted = snaps[c]
        restored = Job(store, 2, local_dir, options, tokens)
        assert {k: restored.get(k) for k in keys} == {k: wanted.get(k) for k in keys}, c
        restored.crash()


def test_sibling_jobs_from_one_savepoint_reusing_checkpoint_ids(store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1,
                              write_batch_rows=3)
    keys = [f"k{i}" for i in range(12)]
    base = Job(store, 2, local_dir, options)
    for k in keys:
        base.put(k, ("sp", k))
    savepoint = base.checkpoint(1, savepoint=True)
    base.crash()
    snaps = {}
    for name in ("j1", "j2", "j3"):
        job = Job(store, 2, local_dir, options, savepoint)
        assert {k: job.get(k) for k in keys} == {k: ("sp", k) for k in keys}
        model = {k: ("sp", k) for k in keys}
        for c in range(2, 6):  # every sibling reuses ids 2..5
            for k in keys[: c + 2]:
                model[k] = (name, c)
                job.put(k, model[k])
            snaps[(name, c)] = (job.checkpoint(c), dict(model))
        job.crash()
    for (name, c), (tokens, model) in snaps.items():
        if c < 5:
            continue  # num-retained = 1
        restored = Job(store, 2, local_dir, options, tokens)
        assert {k: restored.get(k) for k in keys} == model, (name, c)
        restored.crash()
    again = Job(store, 2, local_dir, options, savepoint)
    assert {k: again.get(k) for k in keys} == {k: ("sp", k) for k in keys}


def test_ttl_with_restores_of_older_snapshots(store, local_dir):
    clock = ManualClock()
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=3)
    job = Job(store, 1, local_dir, options, clock=clock, ttl_ms=10_000)
    job.put("a", 1)
    job.put("b", 1)
    t1 = job.checkpoint(1)
    clock.advance(6_000)
    job.put("a", 2)  # a lives until 16 s, b until 10 s
    t2 = job.checkpoint(2)
    clock.advance(6_000)  # 12 s: b and the first version of a expired
    job.put("c", 3)
    t3 = job.checkpoint(3)
    assert (job.get("a"), job.get("b")) == (2, None)
    job.crash()
    for tokens, a in ((t1, None), (t2, 2), (t3, 2)):
        restored = Job(store, 1, local_dir, options, tokens, clock=clock, ttl_ms=10_000)
        assert (restored.get("a"), restored.get("b")) == (a, None)
        restored.crash()
    clock.advance(5_000)  # 17 s: everything but c expired
    restored = Job(store, 1, local_dir, options, t3, clock=clock, ttl_ms=10_000)
    assert (restored.get("a"), restored.get("b"), restored.get("c")) == (None, None, 3)
    restored.put("d", 4)
    restored.checkpoint(4)
    restored.checkpoint(5)
    assert restored.get("c") == 3


def test_resume_with_savepoints_pinned_then_restore_the_savepoints(store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    job = Job(store, 2, local_dir, options)
    job.put("k", 1)
    job.checkpoint(1)
    job.put("k", 2)
    sp2 = job.checkpoint(2, savepoint=True)
    job.put("k", 3)
    job.checkpoint(3)
    job.crash()
    resume = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1,
                             on_fresh_start="resume")
    resumed = Job(store, 2, local_dir, resume)
    assert resumed.get("k") == 3
    for c in range(4, 9):
        resumed.put("k", c)
        resumed.checkpoint(c)
    sp9 = resumed.checkpoint(9, savepoint=True)
    resumed.crash()
    resumed = Job(store, 2, local_dir, resume)
    assert resumed.get("k") == 8  # resume follows checkpoints, not savepoints
    resumed.put("k", 10)
    resumed.checkpoint(10)
    resumed.checkpoint(11)
    resumed.crash()
    assert Job(store, 2, local_dir, options, sp2).get("k") == 2
    assert Job(store, 2, local_dir, options, sp9).get("k") == 8


@pytest.mark.mysql
def test_a_reader_thread_during_checkpoints_sees_whole_checkpoints(mysql_url, local_dir):
    namespace = unique_namespace("adv")
    writer = open_store(NdbStateOptions(url=mysql_url, namespace=namespace))
    reader = open_store(NdbStateOptions(url=mysql_url, namespace=namespace))
    try:
        options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=3)
        keys = [f"k{i}" for i in range(30)]
        job = Job(writer, 2, local_dir, options)
        for k in keys:
            job.put(k, 0)
        job.checkpoint(1)
        models = {1: {k: 0 for k in keys}}
        stop = threading.Event()
        reads: list[dict[Any, Any]] = []

        def read() -> None:
            while not stop.is_set():
                reads.append(committed(reader))
        thread = threading.Thread(target=read)
        thread.start()
        try:
            for c in range(2, 12):
                for k in keys[c % 3::3]:
                    job.put(k, c)
                if c % 4 == 0:
                    job.put(keys[c], None)
                job.checkpoint(c)
                models[c] = {k: job.get(k) for k in keys if job.get(k) is not None}
                time.sleep(0.02)
        finally:
            stop.set()
            thread.join()
        assert reads
        wanted = list(models.values())
        assert [r for r in reads if r not in wanted] == []
    finally:
        writer.close()
        reader.close()
        drop_namespace(mysql_url, namespace)
