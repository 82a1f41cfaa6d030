"""The failures of the issue "Checkpoint history with identity", one test each, on SQLite
and MariaDB (docs/protocol.md explains why each holds).

Flink's side is played by `LocalSubtask`: a "zombie" is an attempt object that keeps
running after a newer attempt restored; `restored_checkpoint_id` restores the tokens
that the snapshot stored, as Flink hands back the union list state.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from click.testing import CliRunner
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.cli import main as cli
from pyflink_ndb.config import NdbStateOptions, from_flink_keys
from pyflink_ndb.errors import CheckpointError, FencedError, NamespaceInUseError
from pyflink_ndb.runtime.bridge import parse_bind_info
from pyflink_ndb.serialization.keys import decode_key, split_key
from pyflink_ndb.stores.base import StateStore
from pyflink_ndb.testing import LocalSubtask, local_key_group

ANY = Types.PICKLED_BYTE_ARRAY()


class Attempt:
    """One subtask attempt with one ValueState."""

    def __init__(self, store: StateStore, local_dir: str, options: NdbStateOptions | None = None,
                 **kwargs: Any) -> None:
        self.t = LocalSubtask(store, options or NdbStateOptions(cache_max_entries=1),
                              local_dir=local_dir, **kwargs)
        self.v = self.t.context.get_state(ValueStateDescriptor("v", ANY))

    def put(self, key: Any, value: Any) -> None:
        self.t.key(key)
        self.v.update(value)

    def get(self, key: Any) -> Any:
        self.t.key(key)
        return self.v.value()


def committed(store: StateStore, operator: str = "op") -> dict[Any, Any]:
    """What a reader (`pyflink-ndb query`) sees: key -> value of the ValueState."""
    out = {}
    for rec in store.iter_committed(operator, "v"):
        prefix, _ = split_key(rec["ukey"])
        out[decode_key(prefix)] = pickle.loads(rec["vbytes"])
    return out


# -- 1. zombie attempts ----------------------------------------------------------------------
def test_zombie_writes_after_the_restore_are_fenced_and_invisible(store, local_dir):
    a = Attempt(store, local_dir)
    a.put("k", 1)
    a.t.checkpoint(1)
    b = Attempt(store, local_dir, restored_checkpoint_id=1)  # Flink replaced a; a runs on
    a.put("k", 2)
    a.put("zombie-only", 9)
    with pytest.raises(FencedError, match="no longer owns"):
        a.t.snapshot(2)
    assert (b.get("k"), b.get("zombie-only")) == (1, None)
    assert committed(store) == {"k": 1}
    b.put("k", 3)
    b.t.checkpoint(3)
    assert committed(store) == {"k": 3}
    c = Attempt(store, local_dir, restored_checkpoint_id=3)
    assert (c.get("k"), c.get("zombie-only")) == (3, None)


def test_late_notification_of_a_zombie_is_fenced_and_collects_nothing(store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    a = Attempt(store, local_dir, options)
    a.put("k", 1)
    a.put("other", 1)
    a.t.checkpoint(1)
    a.put("k", 2)
    a.t.snapshot(2)  # completed by Flink; a's notification is still queued
    b = Attempt(store, local_dir, options, restored_checkpoint_id=2)
    rows = store.count_rows()
    with pytest.raises(FencedError):
        a.t.complete(2)
    with pytest.raises(FencedError):
        a.t.complete(1)
    assert store.count_rows() == rows
    assert (b.get("k"), b.get("other")) == (2, 1)


def test_lazy_read_takes_the_restored_checkpoint_not_the_newest_row(store, local_dir):
    a = Attempt(store, local_dir)
    a.put("k", 1)
    a.t.checkpoint(1)
    a.put("k", 2)
    a.t.snapshot(2)  # written, never completed: the newest row of "k" in the table
    b = Attempt(store, local_dir, restored_checkpoint_id=1)
    assert b.get("k") == 1
    assert committed(store) == {"k": 1}


# -- 2. stop-with-savepoint, then a retained checkpoint --------------------------------------
def test_savepoint_completion_does_not_subsume_the_retained_checkpoint(store, local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    a = Attempt(store, local_dir, options)
    a.put("k", 1)
    a.t.checkpoint(1)
    for _ in range(3):  # savepoints, each notified as stop-with-savepoint notifies
        a.put("k", a.get("k") + 1)
        sp = a.t.backend.snapshot(2 + _, True)
        a.t.storage.record("op", 2 + _, sp)
        a.t.complete(2 + _)
    assert store.latest_committed_checkpoint("op") == 1  # readers follow checkpoints
    b = Attempt(store, local_dir, options, restored_checkpoint_id=1)  # Flink's failover
    assert b.get("k") == 1
    c = Attempt(store, local_dir, options, restored_checkpoint_id=4)  # the last savepoint
    assert c.get("k") == 4


# -- 3. a fixed job id ----------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["fail", "resume", "truncate"])
def test_fresh_start_with_a_fixed_job_id_follows_on_fresh_start(store, local_dir, policy):
    a = Attempt(store, local_dir, job_id="00000000000000000000000000000000")
    a.put("k", 1)
    a.t.checkpoint(1)
    a.t.crash()
    options = NdbStateOptions(cache_max_entries=1, on_fresh_start=policy)
    if policy == "fail":
        with pytest.raises(NamespaceInUseError):
            Attempt(store, local_dir, options, job_id="00000000000000000000000000000000")
        assert Attempt(store, local_dir, restored_checkpoint_id=1).get("k") == 1
        return
    b = Attempt(store, local_dir, options, job_id="00000000000000000000000000000000")
    assert b.get("k") == (1 if policy == "resume" else None)
    assert committed(store) == ({"k": 1} if policy == "resume" else {})
    if policy == "truncate":
        with pytest.raises(CheckpointError, match="no longer be restored"):
            Attempt(store, local_dir, restored_checkpoint_id=1)


# -- 4. retained checkpoints from every layer of configuration ------------------------------
def test_num_retained_comes_from_flink_1_20_keys_of_every_layer():
    assert from_flink_keys({"execution.checkpointing.num-retained": "3"}
                           ).checkpoints_retained == 3
    assert from_flink_keys({"state.checkpoints.num-retained": "2",
                            "execution.checkpointing.num-retained": "4"}
                           ).checkpoints_retained == 4
    tm_only = ('{"options": {}, "cluster_options": {"execution.checkpointing.num-retained": '
               '"5"}, "operator_id": "x"}')
    keys, _ = parse_bind_info(tm_only)
    assert from_flink_keys(keys).checkpoints_retained == 5
    job_wins = ('{"options": {}, "cluster_options": {"execution.checkpointing.num-retained": '
                '"5"}, "job_options": {"execution.checkpointing.num-retained": "7"}, '
                '"operator_id": "x"}')
    keys, _ = parse_bind_info(job_wins)
    assert from_flink_keys(keys).checkpoints_retained == 7


def test_the_oldest_retained_checkpoint_stays_restorable(store, local_dir):
    options = from_flink_keys({"execution.checkpointing.num-retained": "3",
                               "state.backend.ndb.cache.max-entries": "1"})
    a = Attempt(store, local_dir, options)
    for cp in range(1, 7):
        a.put("k", cp)
        a.t.checkpoint(cp)
    assert Attempt(store, local_dir, options, restored_checkpoint_id=4).get("k") == 4


# -- 5. savepoints and branches -------------------------------------------------------------
def test_a_retained_checkpoint_restored_after_an_older_one_keeps_its_own_values(store,
                                                                                 local_dir):
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=3)
    run1 = Attempt(store, local_dir, options)
    for cp in (1, 2, 3):
        run1.put("k", cp)
        run1.t.checkpoint(cp)
    tokens3 = run1.t.storage.tokens("op", 3)
    tokens1 = run1.t.storage.tokens("op", 1)
    run2 = Attempt(store, local_dir, options, restored_checkpoint_id=1,
                   restored_tokens=tokens1)
    run2.put("k", 20)
    run2.t.checkpoint(2)  # checkpoint 2 again, of another branch
    run2.t.checkpoint(3)
    run3 = Attempt(store, local_dir, options, restored_checkpoint_id=3,
                   restored_tokens=tokens3)
    assert run3.get("k") == 3
    run4 = Attempt(store, local_dir, options, restored_checkpoint_id=3)  # run 2's
    assert run4.get("k") == 20


def test_an_aborted_savepoint_is_released(store, local_dir):
    a = Attempt(store, local_dir)
    a.put("k", 1)
    a.t.checkpoint(1)
    a.put("k", 2)
    a.t.snapshot(2, is_savepoint=True)
    a.t.abort(2)
    assert [s.epoch for s in store.list_snapshots("op")] == [1]
    with pytest.raises(CheckpointError, match="no longer be restored"):
        Attempt(store, local_dir, restored_checkpoint_id=2)
    a.put("k", 3)
    a.t.checkpoint(3)
    a.t.checkpoint(4)
    assert a.get("k") == 3


# -- 6. restore cost --------------------------------------------------------------------------
def test_restore_reads_and_deletes_no_state_row(store, local_dir):
    a = Attempt(store, local_dir, NdbStateOptions(cache_max_entries=10_000))
    for i in range(2_000):
        a.put(i, i)
    a.t.checkpoint(1)
    for i in range(2_000):
        a.put(i, -i)
    a.t.snapshot(2)  # never completes: format 1 deleted these rows before the first record
    rows = store.count_rows()
    seen: list[str] = []
    original = store._execute

    def spy(text: str, params: Any = ()) -> Any:
        seen.append(text)
        return original(text, params)

    store._execute = spy  # type: ignore[method-assign]
    try:
        b = Attempt(store, local_dir, restored_checkpoint_id=1)
    finally:
        store._execute = original  # type: ignore[method-assign]
    touching = [t for t in seen if store.t_state in t]
    assert touching == [], touching
    assert store.count_rows() == rows
    assert (b.get(7), b.get(1999)) == (7, 1999)


# -- 7. readers ---------------------------------------------------------------------------
def test_readers_see_one_checkpoint_while_subtasks_restore(store, local_dir):
    halves = [(0, 63), (64, 127)]
    run = [Attempt(store, local_dir, subtask_index=i, key_group_start=a, key_group_end=b)
           for i, (a, b) in enumerate(halves)]
    keys = list(range(40))

    def owner(key: Any) -> int:
        return 0 if local_key_group(key) <= 63 else 1

    for value in (1, 2):
        for k in keys:
            run[owner(k)].put(k, value)
        for t in run:
            t.t.snapshot(value)
        for t in run:
            t.t.complete(value)
    assert set(committed(store).values()) == {2}
    # A new job from checkpoint 1: subtask 0 claims first; readers switch at once and whole.
    Attempt(store, local_dir, restored_checkpoint_id=1, subtask_index=0, key_group_start=0,
            key_group_end=63)
    assert committed(store) == dict.fromkeys(keys, 1)


def test_query_decodes_values_over_256_kib_and_reads_only_what_it_prints(tmp_path, local_dir):
    from pyflink_ndb.stores import open_store

    url = f"sqlite:///{tmp_path / 'q.sqlite'}"
    store = open_store(NdbStateOptions(url=url, namespace="q"))
    a = Attempt(store, local_dir, NdbStateOptions(cache_max_entries=10_000))
    big = "x" * (600 * 1024)
    a.put("big", big)
    for i in range(3_000):
        a.put(f"k{i:05d}", i)
    a.t.checkpoint(1)
    out = CliRunner().invoke(cli, ["query", "--url", url, "--namespace", "q", "--limit",
                                   "0"])
    assert out.exit_code == 0, out.output
    assert f'"key": "big", "value": "{big}"' in out.output
    fetched: list[int] = []
    from pyflink_ndb.stores.base import StateStore as Base

    original = Base._query

    def counting(self: Base, text: str, params: Any = ()) -> list[tuple[Any, ...]]:
        rows = original(self, text, params)
        if self.t_state in text:
            fetched.append(len(rows))
        return rows

    Base._query = counting  # type: ignore[method-assign]
    try:
        out = CliRunner().invoke(cli, ["query", "--url", url, "--namespace", "q",
                                       "--limit", "5"])
    finally:
        Base._query = original  # type: ignore[method-assign]
    assert out.exit_code == 0, out.output
    assert len(out.stdout.strip().splitlines()) == 5
    assert sum(fetched) <= 10, fetched  # a page of 5, and the chunks of a big value


# -- P6: bounded garbage ----------------------------------------------------------------------
def test_row_count_of_a_steady_job_stays_flat_over_100_checkpoints(store, local_dir):
    options = NdbStateOptions(cache_max_entries=100, checkpoints_retained=1)
    a = Attempt(store, local_dir, options)
    counts = []
    for cp in range(1, 101):
        for k in range(50):
            a.put(k, cp)
        a.t.checkpoint(cp)
        counts.append(store.count_rows())
    assert counts[5:] == [counts[5]] * 95
    assert counts[-1] <= 50 * 3  # retained 1 + 1 for readers + the head
    assert len(store.list_snapshots("op")) <= 2


def test_a_new_job_keeps_a_pending_checkpoint_of_the_previous_job_restorable(store,
                                                                             local_dir):
    """Flink may have completed checkpoint 2 without telling the task before the job was
    cancelled: a new job (attempt 0) from checkpoint 1 keeps it restorable."""
    a = Attempt(store, local_dir)
    a.put("k", 1)
    a.t.checkpoint(1)
    a.put("k", 2)
    old2 = a.t.snapshot(2)
    b = Attempt(store, local_dir, restored_checkpoint_id=1)
    b.put("k", 10)
    b.t.checkpoint(2)  # checkpoint 2 of the new job
    b.t.checkpoint(3)
    c = Attempt(store, local_dir, restored_checkpoint_id=2, restored_tokens=(old2,))
    assert c.get("k") == 2


def test_rows_of_abandoned_branches_and_epochs_disappear(store, local_dir):
    a = Attempt(store, local_dir, job_id="a" * 32)
    for k in range(200):
        a.put(k, 1)
    a.t.checkpoint(1)
    for k in range(200, 400):
        a.put(k, 2)
    a.t.snapshot(2)  # never completes
    b = Attempt(store, local_dir, restored_checkpoint_id=1, attempt=1,
                job_id="a" * 32)  # a task failover
    assert store.count_rows() == 400
    b.put("new", 3)
    b.t.checkpoint(3)
    assert store.count_rows() == 201
    assert b.get(300) is None and b.get(100) == 1



def _savepoint_notes(store: StateStore, store_kind: str, tmp_path: Any,
                     request: pytest.FixtureRequest) -> dict[tuple[str, int], str]:
    """`pyflink-ndb savepoints --all` of `store`'s namespace: each snapshot's note by (the
    first letter of its job id, its checkpoint id)."""
    url = (f"sqlite:///{tmp_path / 'state.sqlite'}" if store_kind == "sqlite"
           else request.getfixturevalue("mysql_url"))
    out = CliRunner().invoke(cli, ["savepoints", "--url", url, "--namespace", store.namespace,
                                   "--all", "--format", "json"])
    assert out.exit_code == 0, out.output
    return {(r["job"][0], r["checkpoint"]): r["note"]
            for r in map(json.loads, out.stdout.splitlines())}


def test_a_retained_checkpoint_another_job_started_from_stays_restorable(
        store, local_dir, store_kind, tmp_path, request, caplog):
    """Flink 1.20 restores a savepoint or retained checkpoint at job submission in NO_CLAIM
    mode by default (`execution.state-recovery.claim-mode`): the snapshot stays the
    user's and several jobs may start from it. Job b starts from job a's checkpoint 2 and
    completes more checkpoints than are retained; job c then starts from the same
    checkpoint 2 and sees its values (it failed with CheckpointError before: found by a new
    user). Released (`pyflink-ndb release`), it is gone. A failover, which restores the
    job's own checkpoint, claims it: it is subsumed as any checkpoint of the job."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    a = Attempt(store, local_dir, options, job_id="a" * 32)
    a.put("k", 1)
    a.t.checkpoint(1)
    a.put("k", 2)
    a.t.checkpoint(2)
    a.t.crash()
    b = Attempt(store, local_dir, options, job_id="b" * 32, restored_checkpoint_id=2)
    for cp in range(3, 8):
        b.put("k", cp * 10)
        b.t.checkpoint(cp)
    b_branch = b.t.backend.protocol.branch
    b.t.crash()
    caplog.set_level("INFO", logger="pyflink_ndb")
    caplog.clear()
    c = Attempt(store, local_dir, options, job_id="c" * 32, restored_checkpoint_id=2)
    assert c.get("k") == 2
    assert f"restored checkpoint 2 of job {'a' * 32} without claiming it (Flink's claim " \
        "mode NO_CLAIM or LEGACY): it stays restorable until `pyflink-ndb release`" \
        in caplog.text
    c.t.crash()
    caplog.clear()
    # A failover of job b (attempt 1, the same job) restores b's own checkpoint 7 and
    # runs on: 7 is subsumed like any checkpoint of b, a's checkpoint 2 is not.
    b2 = Attempt(store, local_dir, options, job_id="b" * 32, restored_checkpoint_id=7,
                 attempt=1)
    assert "without claiming" not in caplog.text  # a failover restores its own checkpoint
    for cp in range(8, 12):
        b2.put("k", cp * 10)
        b2.t.checkpoint(cp)
    listed = {(r.branch, r.epoch) for r in store.list_snapshots("op")}
    assert (b_branch, 7) not in listed
    assert (a.t.backend.protocol.branch, 2) in listed
    # `pyflink-ndb savepoints --all` says why it stays (read from the branches' origins).
    notes = _savepoint_notes(store, store_kind, tmp_path, request)
    assert notes[("a", 2)] == "pinned until released (a job was started from it)"
    assert not any(note.startswith("pinned") for key, note in notes.items() if key != ("a", 2))
    with pytest.raises(CheckpointError, match="savepoints --all"):
        Attempt(store, local_dir, options, job_id="d" * 32, restored_checkpoint_id=7)
    store.delete_snapshots("op", [(a.t.backend.protocol.branch, 2)])  # pyflink-ndb release
    with pytest.raises(CheckpointError, match="no longer be restored"):
        Attempt(store, local_dir, options, job_id="e" * 32, restored_checkpoint_id=2)

@pytest.mark.parametrize("mode", ["CLAIM", "LEGACY"])
def test_a_checkpoint_restored_in_claim_mode_is_the_restoring_jobs(store, local_dir, mode):
    """Flink's CLAIM mode (`execution.state-recovery.claim-mode: CLAIM`) makes the restored
    snapshot the new job's: Flink deletes it once the job's own checkpoints subsume it, and
    so does retention here (a restore of it afterwards fails). LEGACY, like NO_CLAIM, leaves
    it the user's: it stays restorable until released."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    a = Attempt(store, local_dir, options, job_id="a" * 32)
    a.put("k", 2)
    a.t.checkpoint(2)
    a.t.crash()
    b = Attempt(store, local_dir, options, job_id="b" * 32, restored_checkpoint_id=2,
                restore_claim_mode=mode)
    assert b.get("k") == 2
    for cp in range(3, 7):
        b.put("k", cp * 10)
        b.t.checkpoint(cp)
    b.t.crash()
    listed = {(r.branch, r.epoch) for r in store.list_snapshots("op")}
    if mode == "CLAIM":
        assert (a.t.backend.protocol.branch, 2) not in listed
        with pytest.raises(CheckpointError, match="no longer be restored"):
            Attempt(store, local_dir, options, job_id="c" * 32, restored_checkpoint_id=2)
    else:
        assert (a.t.backend.protocol.branch, 2) in listed
        c = Attempt(store, local_dir, options, job_id="c" * 32, restored_checkpoint_id=2)
        assert c.get("k") == 2


def test_a_fixed_job_id_restoring_its_retained_checkpoint_at_submission_keeps_it(
        store, local_dir):
    """Application mode with HA gives every run the same job id: a new run restoring a
    retained checkpoint (`execution.state-recovery.path` .../chk-2) looks like a failover by
    the job id alone. The path tells them apart: the checkpoint stays restorable for a
    third run; a failover of the second run (its own checkpoint, the same path in its
    configuration) claims what it restores."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    job, path = "0" * 32, "file:///checkpoints/00000000000000000000000000000000/chk-2"
    a = Attempt(store, local_dir, options, job_id=job)
    a.put("k", 2)
    a.t.checkpoint(2)
    a.t.crash()
    b = Attempt(store, local_dir, options, job_id=job, restored_checkpoint_id=2,
                restore_path=path)
    for cp in range(3, 8):
        b.put("k", cp * 10)
        b.t.checkpoint(cp)
    b_branch = b.t.backend.protocol.branch
    b.t.crash()
    listed = {(r.branch, r.epoch) for r in store.list_snapshots("op")}
    assert (a.t.backend.protocol.branch, 2) in listed
    c = Attempt(store, local_dir, options, job_id=job, restored_checkpoint_id=2,
                restore_path=path + "/_metadata")
    assert c.get("k") == 2
    c.t.crash()
    b2 = Attempt(store, local_dir, options, job_id=job, restored_checkpoint_id=7,
                 restore_path=path, attempt=1)
    for cp in range(8, 12):
        b2.put("k", cp * 10)
        b2.t.checkpoint(cp)
    assert (b_branch, 7) not in {(r.branch, r.epoch) for r in store.list_snapshots("op")}


@pytest.mark.parametrize(("path", "restored", "expected"), [
    ("file:///c/0a1b/chk-17", 17, True),
    ("file:///c/0a1b/chk-17/", 17, True),
    ("s3://bucket/c/0a1b/chk-17/_metadata", 17, True),
    ("file:///c/0a1b/chk-17", 18, False),  # a failover to the job's own checkpoint
    ("file:///c/0a1b/chk-170", 17, False),
    ("file:///s/savepoint-0a1b2c-0123456789ab", 17, False),  # savepoints: pinned anyway
    (None, 17, False),
])
def test_a_restore_at_submission_is_the_checkpoint_the_path_names(path, restored, expected):
    from pyflink_ndb.runtime.backend import BindInfo

    info = BindInfo("op", restored_checkpoint_id=restored, restore_path=path)
    assert info.restores_at_submission is expected


def test_a_snapshot_restores_only_in_the_namespace_that_took_it(store_kind, store_factory,
                                                                 local_dir):
    """Branch ids count from 1 in every namespace: a savepoint restored into another
    namespace, or into its own after a `drop` and a new run, found a branch and checkpoint
    of the same numbers there and restored that run's state without a word (a breaker's
    find with real jobs: every output wrong). The token's nonce names the branch row that
    took it: elsewhere the restore fails. A token of an older version (no nonce) still
    restores where it was taken."""
    options = NdbStateOptions(cache_max_entries=1)
    x = store_factory(store_kind)
    a = Attempt(x, local_dir, options, job_id="a" * 32)
    a.put("k", 1)
    a.t.checkpoint(1)
    token = a.t.storage.tokens("op", 1)
    a.t.crash()
    y = store_factory(store_kind)  # another namespace, where another job ran as far
    b = Attempt(y, local_dir, options, job_id="b" * 32)
    b.put("k", 99)
    b.t.checkpoint(1)
    b.t.crash()
    with pytest.raises(CheckpointError, match=f"was not taken in .* namespace "
                       f"'{y.namespace}' .*made by job {'b' * 32}"):
        Attempt(y, local_dir, options, restored_checkpoint_id=1, restored_tokens=token)
    legacy = tuple(json.dumps({k: v for k, v in json.loads(t).items() if k != "nonce"})
                   for t in token)
    c = Attempt(x, local_dir, options, restored_checkpoint_id=1, restored_tokens=legacy)
    assert c.get("k") == 1
    c.t.crash()
    # The namespace dropped and used again: the same numbers, another run.
    x.drop_tables()
    x.open()
    d = Attempt(x, local_dir, options, job_id="d" * 32)
    d.put("k", 42)
    d.t.checkpoint(1)
    d.t.crash()
    with pytest.raises(CheckpointError, match="dropped and used again"):
        Attempt(x, local_dir, options, restored_checkpoint_id=1, restored_tokens=token)


@pytest.mark.parametrize("retention", ["RETAIN_ON_CANCELLATION", "DELETE_ON_CANCELLATION",
                                       "NO_EXTERNALIZED_CHECKPOINTS"])
def test_a_later_jobs_retention_leaves_an_ended_jobs_retained_checkpoints(
        store, local_dir, store_kind, tmp_path, request, retention):
    """Job a keeps its checkpoints when it ends (`externalized-checkpoint-retention`):
    Flink leaves a's last retained checkpoints on disk whatever later jobs do. Job b
    restores a's newest and runs on past its own retention; a's older retained checkpoint
    must still restore (it failed with CheckpointError: b's retention subsumed it; a
    breaker's find with real jobs). With NO_EXTERNALIZED_CHECKPOINTS (Flink's default)
    Flink deletes a's checkpoints when a ends: b's retention subsumes them as before. Of
    a's, Flink keeps its newest num-retained (2 here: 4 and 5); the one more a's own
    retention kept for readers (3) goes."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=2)
    a = Attempt(store, local_dir, options, job_id="a" * 32, externalized_retention=retention)
    for cp in range(1, 6):
        a.put("k", cp)
        a.t.checkpoint(cp)
    a.t.crash()
    a_branch = a.t.backend.protocol.branch
    assert {e for b, e in ((r.branch, r.epoch) for r in store.list_snapshots("op"))
            if b == a_branch} == {3, 4, 5}
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    b = Attempt(store, local_dir, options, job_id="b" * 32, restored_checkpoint_id=5,
                externalized_retention=retention)
    for cp in range(6, 11):
        b.put("k", cp * 10)
        b.t.checkpoint(cp)
    listed = {(r.branch, r.epoch) for r in store.list_snapshots("op")}
    if retention == "NO_EXTERNALIZED_CHECKPOINTS":
        assert (a_branch, 4) not in listed
        with pytest.raises(CheckpointError, match="no longer be restored"):
            Attempt(store, local_dir, options, job_id="c" * 32, restored_checkpoint_id=4)
        return
    assert (a_branch, 4) in listed and (a_branch, 3) not in listed
    notes = _savepoint_notes(store, store_kind, tmp_path, request)
    assert notes[("a", 4)] == \
        "kept until released (its job retains its checkpoints when it ends)"
    assert notes[("a", 5)] == "pinned until released (a job was started from it)"
    b.t.crash()
    c = Attempt(store, local_dir, options, job_id="c" * 32, restored_checkpoint_id=4)
    assert c.get("k") == 4


def _stop_with_savepoint(store, local_dir, mode: str = "RETAIN_ON_CANCELLATION",
                         failover: bool = False) -> tuple[int, str]:
    """Job a keeps 2 checkpoints (Flink's num-retained 2) and its checkpoints when it
    ends (`mode`), completes checkpoints 1-5 and is stopped with savepoint 6 (synchronous:
    completed, then every subtask closes normally). With `failover`, the job fails while
    finishing: Flink restores its checkpoint 5 in a new attempt of the same run, which is
    then cancelled (Flink keeps the retained checkpoints). Returns a's first branch and
    the savepoint's token."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=2)
    job = "a" * 32
    a = Attempt(store, local_dir, options, job_id=job, externalized_retention=mode)
    for cp in range(1, 6):
        a.put("k", cp)
        a.t.checkpoint(cp)
    a.put("k", 6)
    token = a.t.snapshot(6, is_savepoint=True, ends_job=True)
    a.t.complete(6)
    a.t.close()
    if failover:
        again = Attempt(store, local_dir, options, job_id=job, externalized_retention=mode,
                        attempt=1, restored_checkpoint_id=5)
        assert again.get("k") == 5
        again.t.crash()
    return a.t.backend.protocol.branch, token


def test_a_stop_with_savepoint_keeps_the_retained_checkpoints_and_says_so(
        store, local_dir, store_kind, tmp_path, request):
    """A stop-with-savepoint usually ends the job FINISHED, and Flink deletes its retained
    checkpoints then (`CheckpointProperties`); but a task that fails after the stop's
    savepoint completed leaves the job FAILED, and Flink keeps them (a breaker's find: a
    version that subsumed them on the subtasks' record of the stop lost them). So a
    later job's retention keeps them, and the listing says what happened to them."""
    from pyflink_ndb.cli import STOPPED_NOTE

    a_branch, token = _stop_with_savepoint(store, local_dir)
    notes = _savepoint_notes(store, store_kind, tmp_path, request)
    assert notes[("a", 4)] == STOPPED_NOTE
    assert notes[("a", 6)] == "pinned until released"
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    b = Attempt(store, local_dir, options, job_id="b" * 32, restored_checkpoint_id=6,
                restored_tokens=[token])
    assert b.get("k") == 6
    for cp in range(7, 11):
        b.put("k", cp * 10)
        b.t.checkpoint(cp)
    b.t.crash()
    assert {4, 5, 6} <= _epochs_of(store, a_branch)
    assert _savepoint_notes(store, store_kind, tmp_path, request)[("a", 4)] == STOPPED_NOTE
    c = Attempt(store, local_dir, options, job_id="c" * 32, restored_checkpoint_id=4)
    assert c.get("k") == 4


def test_a_failover_after_the_stop_savepoint_keeps_the_retained_checkpoints(
        store, local_dir, store_kind, tmp_path, request):
    """The stop's savepoint completed and the subtask recorded the stop, but the job
    failed over to checkpoint 5 (a new attempt of the run, which records nothing) and was
    then cancelled, so Flink keeps the job's retained checkpoints (4 and 5): a later job
    must not subsume them, 4 must restore, and the listing does not call the job
    stopped."""
    a_branch, token = _stop_with_savepoint(store, local_dir, failover=True)
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    b = Attempt(store, local_dir, options, job_id="b" * 32, restored_checkpoint_id=6,
                restored_tokens=[token])
    for cp in range(7, 11):
        b.put("k", cp * 10)
        b.t.checkpoint(cp)
    b.t.crash()
    assert {4, 5} <= _epochs_of(store, a_branch)
    assert _savepoint_notes(store, store_kind, tmp_path, request)[("a", 4)] == \
        "kept until released (its job retains its checkpoints when it ends)"
    c = Attempt(store, local_dir, options, job_id="c" * 32, restored_checkpoint_id=4)
    assert c.get("k") == 4


def test_only_a_completed_stop_savepoint_and_a_normal_close_record_the_stop(store, local_dir):
    """The stop is recorded only when the stop's savepoint completed and the subtask
    then closed normally: not for a savepoint that is not a stop's, not for one that was
    aborted or never heard of, not when the subtask was cancelled after it (a crash)."""
    from pyflink_ndb.stores.base import stopped_runs

    def ended(run_it) -> bool:
        a = Attempt(store, local_dir, job_id=uuid4_job())
        a.put("k", 1)
        run_it(a.t)
        origins = store.branch_origins("op")
        return origins[a.t.backend.protocol.branch].run in stopped_runs(origins)

    def stop(t, complete=True, close=True, ends_job=True):
        t.snapshot(1, is_savepoint=True, ends_job=ends_job)
        if complete:
            t.complete(1)
        (t.close if close else t.crash)()

    assert ended(stop)
    assert not ended(lambda t: stop(t, ends_job=False))
    assert not ended(lambda t: stop(t, complete=False))
    assert not ended(lambda t: stop(t, close=False))
    assert not ended(lambda t: (t.snapshot(1, is_savepoint=True, ends_job=True),
                                t.abort(1), t.close()))


def uuid4_job() -> str:
    import uuid

    return uuid.uuid4().hex


def _epochs_of(store, branch: int) -> set[int]:
    return {r.epoch for r in store.list_snapshots("op") if r.branch == branch}


def _run_a_cancelled_job(store, local_dir, job_id: str, mode: str = "RETAIN_ON_CANCELLATION",
                         pending: bool = False) -> int:
    """A job that keeps 2 checkpoints (Flink's num-retained 2) completes checkpoints 1-5
    (and, with `pending`, writes 6 whose completion it never hears of) and is cancelled;
    returns its branch."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=2)
    a = Attempt(store, local_dir, options, job_id=job_id, externalized_retention=mode)
    for cp in range(1, 6):
        a.put("k", cp)
        a.t.checkpoint(cp)
    if pending:
        a.put("k", 6)
        a.t.checkpoint(6, complete=False)
    a.t.crash()
    return a.t.backend.protocol.branch


@pytest.mark.parametrize("start", ["restore", "resume"])
def test_a_fixed_job_ids_new_run_leaves_the_previous_runs_retained_checkpoints(
        store, local_dir, start):
    """Application mode with HA: every run has the same job id. Run 2 (restored from run
    1's newest retained checkpoint, or resumed without one) must not subsume run 1's
    retained checkpoints, which Flink keeps: runs, not job ids, tell whose they are (a
    review's find: by the job id alone run 1's checkpoints were run 2's own)."""
    job = "0" * 32
    first = _run_a_cancelled_job(store, local_dir, job)
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1,
                              on_fresh_start="resume")
    extra: dict[str, Any] = ({"restored_checkpoint_id": 5,
                              "restore_path": f"file:///c/{job}/chk-5"}
                             if start == "restore" else {})
    b = Attempt(store, local_dir, options, job_id=job,
                externalized_retention="RETAIN_ON_CANCELLATION", **extra)
    for cp in range(6, 11):
        b.put("k", cp * 10)
        b.t.checkpoint(cp)
    b.t.crash()
    assert _epochs_of(store, first) == {4, 5}
    c = Attempt(store, local_dir, options, job_id=job, restored_checkpoint_id=4,
                restored_tokens=None, restore_path=f"file:///c/{job}/chk-4")
    assert c.get("k") == 4


def test_a_new_jobs_failover_keeps_an_ended_jobs_pending_checkpoint(store, local_dir):
    """Job a (keeps its checkpoints) wrote checkpoint 6, which Flink completed, but was
    cancelled before it heard so: the store holds it pending. Job b starts from a's
    checkpoint 5, and its first attempt fails before it claims: attempt 1 claims with a's
    branch as the previous owner. A failover forgets the previous owners' pending
    checkpoints (Flink never completed them) only for its own run: a's checkpoint 6 stays
    restorable (a review's find)."""
    first = _run_a_cancelled_job(store, local_dir, "a" * 32, pending=True)
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    b = Attempt(store, local_dir, options, job_id="b" * 32, restored_checkpoint_id=5,
                attempt=1)
    b.put("k", 70)
    b.t.checkpoint(7)
    b.t.crash()
    assert 6 in _epochs_of(store, first)
    c = Attempt(store, local_dir, options, job_id="c" * 32, restored_checkpoint_id=6)
    assert c.get("k") == 6


def test_a_checkpoint_restored_in_claim_mode_goes_though_its_job_retained_it(store,
                                                                             local_dir):
    """A retained checkpoint restored in CLAIM mode is the new job's (Flink deletes it once
    subsumed), even though its job kept its checkpoints when it ended: only the others of
    them stay (a review's find: the retained-by-its-job rule kept the claimed one too)."""
    first = _run_a_cancelled_job(store, local_dir, "a" * 32)
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    b = Attempt(store, local_dir, options, job_id="b" * 32, restored_checkpoint_id=5,
                restore_claim_mode="CLAIM")
    for cp in range(6, 11):
        b.put("k", cp * 10)
        b.t.checkpoint(cp)
    assert _epochs_of(store, first) == {4}


def test_a_savepoint_restored_in_claim_mode_is_subsumed_like_a_checkpoint(store, local_dir):
    """`flink run -s SAVEPOINT -claimMode CLAIM`: the new job owns the savepoint and Flink
    deletes it once the job's checkpoints subsume it; it stayed pinned here (a breaker's
    find on a cluster). Restored without claiming, a savepoint stays until released."""
    options = NdbStateOptions(cache_max_entries=1, checkpoints_retained=1)
    a = Attempt(store, local_dir, options, job_id="a" * 32)
    a.put("k", 1)
    a.t.snapshot(2, is_savepoint=True)
    a.put("k", 2)
    a.t.snapshot(3, is_savepoint=True)
    a.t.crash()
    a_branch = a.t.backend.protocol.branch
    b = Attempt(store, local_dir, options, job_id="b" * 32, restored_checkpoint_id=2)
    b.t.checkpoint(4)
    b.t.crash()
    c = Attempt(store, local_dir, options, job_id="c" * 32, restored_checkpoint_id=3,
                restore_claim_mode="CLAIM")
    assert c.get("k") == 2
    for cp in range(4, 8):
        c.put("k", cp)
        c.t.checkpoint(cp)
    assert _epochs_of(store, a_branch) == {2}  # 3 claimed and subsumed; 2 still b's pin


def test_garbage_collection_of_many_entries_at_once(store, local_dir):
    """Statements naming entries one by one stay within the store's limits (SQLite allows
    an expression depth of 1000)."""
    options = NdbStateOptions(cache_max_entries=10_000, checkpoints_retained=1)
    a = Attempt(store, local_dir, options)
    for cp in range(1, 5):
        for k in range(1_200):
            a.put(k, cp)
        a.t.checkpoint(cp)
    assert store.count_rows() == 1_200 * 2
    b = Attempt(store, local_dir, options, restored_checkpoint_id=4)
    for k in range(1_200):  # rewrites entries whose older versions b must read first
        b.put(k, 5)
    b.t.checkpoint(5)
    assert store.count_rows() == 1_200 * 2  # versions 4 and 5 (checkpoints 4, 5, the head)
    b.t.checkpoint(6)
    # Checkpoint 4 of job a, which job b was started from, stays restorable (Flink's
    # NO_CLAIM restore: the snapshot stays the user's) until it is released.
    assert store.count_rows() == 1_200 * 2
    store.delete_snapshots("op", [(a.t.backend.protocol.branch, 4)])  # pyflink-ndb release
    b.t.checkpoint(7)
    assert store.count_rows() == 1_200  # 6, 7 and the head all see version 5
    assert b.get(7) == 5


def test_cli_filters_that_match_nothing_list_what_exists(tmp_path, local_dir):
    from pyflink_ndb.stores import open_store

    url = f"sqlite:///{tmp_path / 'c.sqlite'}"
    store = open_store(NdbStateOptions(url=url, namespace="c"))
    a = Attempt(store, local_dir)
    a.put("k", 1)
    a.t.checkpoint(1)
    base = ["--url", url, "--namespace", "c"]
    runner = CliRunner()
    out = runner.invoke(cli, ["query", *base, "--operator", "nope"])
    assert out.exit_code != 0 and "its operators: op" in out.output
    out = runner.invoke(cli, ["query", *base, "--state", "nope"])
    assert out.exit_code != 0 and "states: v" in out.output
    out = runner.invoke(cli, ["query", *base, "--limit", "-1"])
    assert out.exit_code != 0 and "--limit" in out.output
    out = runner.invoke(cli, ["release", *base, "--operator", "op", "--checkpoint", "9"])
    assert out.exit_code != 0 and "checkpoint 1 (completed" in out.output
    out = runner.invoke(cli, ["release", *base, "--operator", "op", "--checkpoint", "1"])
    assert out.exit_code != 0 and "what readers see" in out.output
    out = runner.invoke(cli, ["query", *base, "--sql", "--operator", "op"])
    assert out.exit_code == 0 and "-- parameters:" in out.output


def test_cli_sql_of_one_state_runs_and_reads_that_state(tmp_path, local_dir):
    """`query --sql --operator U --state S` prints a statement of that state only (a new
    user found `--state` ignored); run as printed, it returns the committed value."""
    import json
    import sqlite3

    from pyflink_ndb.stores import open_store

    path = tmp_path / "s.sqlite"
    url = f"sqlite:///{path}"
    store = open_store(NdbStateOptions(url=url, namespace="c"))
    a = Attempt(store, local_dir)
    a.put("k", 41)
    a.t.checkpoint(1)
    base = ["--url", url, "--namespace", "c", "--operator", "op"]
    out = CliRunner().invoke(cli, ["query", *base, "--sql", "--state", "v"])
    assert out.exit_code == 0, out.output
    sql, params = out.output.strip().rsplit("\n-- parameters: ", 1)
    assert sql.endswith("AND c.state_name = ?") and json.loads(params)[-1] == "v"
    rows = sqlite3.connect(path).execute(sql, json.loads(params)).fetchall()
    assert [(r[0], r[1]) for r in rows] == [("op", "v")]
    out = CliRunner().invoke(cli, ["query", *base, "--sql", "--state", "nope"])
    assert out.exit_code != 0 and "No state 'nope' in operator(s) op; states: v." in out.output


@pytest.mark.parametrize(("operator", "hint"), [
    ("0123456789abcdef0123456789abcdef", True), ("counter", False)])
def test_a_fresh_start_conflict_says_what_a_hex_operator_name_is(store, operator, hint):
    """A fresh user saw only a 32-digit hex name for the operator of a switched job (its
    Flink operator ID): the message says where it comes from and that the CLI takes the
    uid."""
    from pyflink_ndb.checkpoint.protocol import fresh_start_conflict
    from pyflink_ndb.stores.lineage import Descriptor, Token

    err = fresh_start_conflict(store, NdbStateOptions(), operator,
                               Descriptor((Token(1, 3, 0, 127),)))
    text = str(err)
    assert f"operator {operator!r}" in text and "checkpoint 3" in text
    assert ("Flink operator ID of a switched operator" in text) is hint
    assert "on-fresh-start" in text
