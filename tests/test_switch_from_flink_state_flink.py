"""A savepoint taken with the switch off, restored with it on, and the other way (a new
user's trial, 2026-12-07).

Real MiniCluster jobs (thread mode) on MariaDB: test_restores_across_jobs_flink's job (a
ValueState, a ListState, a MapState and a TTL ValueState per key) runs on Flink's own state
backend (HashMap or RocksDB), takes a savepoint and is cancelled. The same job restored
from that savepoint with the job-wide switch on keeps its keyed state in pyflink-ndb, so
Flink would drop the savepoint's keyed state without a word (it keeps restored state that no
operator registers). The switched operator must refuse (`restore.backend-change: fail`,
the default) and name the states, or, told to `ignore`, start its state empty and run on.
The other way, a savepoint of the switched job restored with the switch off would start
Flink's keyed state empty the same way: the client refuses the job at submission.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import cloudpickle
import pytest
from conftest import drop_namespace, unique_namespace
from test_restores_across_jobs_flink import (
    KEYS,
    RECORDS,
    cancel,
    check,
    finish,
    lines,
    savepoint_then_cancel,
    start,
)

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Flink's names and kinds of the job's keyed states (the StateMetaInfoSnapshot of each).
FLINK_STATES = ("'n' (value)", "'seqs' (list)", "'buckets' (map)", "'prev' (value)")


def savepoint_off(backend: str, ns: str, url: str, tmp_path: Path) -> str:
    """The job with the switch off on `backend` to its third checkpoint, then a savepoint
    (cancelled after it); returns the savepoint's path."""
    savepoint, _ = savepoint_then_cancel("flink", ns, url, tmp_path, tmp_path / "ckpt",
                                         extra={"state.backend.type": backend})
    check(lines(tmp_path / "a.txt"), RECORDS, to_end=False)
    return savepoint


def failure_text(error: BaseException) -> str:
    """The job's failure and its causes, as text (PEMJA puts Python's traceback in)."""
    parts = []
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        parts.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    return "\n".join(parts)


@pytest.mark.parametrize("backend", ["hashmap", "rocksdb"])
def test_switched_restore_of_flink_keyed_state_fails_and_names_the_states(
        backend, tmp_path, mysql_url):
    ns = unique_namespace("frfl")
    try:
        savepoint = savepoint_off(backend, ns, mysql_url, tmp_path)
        # Flink's default restart strategy with checkpointing (exponential delay, no limit
        # of attempts) would restore and refuse for ever: the refusal fails the job at once.
        b = start("switch", 1, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=0.0, restore=savepoint, name="from-flink",
                  extra={"state.backend.type": backend,
                         "restart-strategy.type": "exponential-delay"})
        with ThreadPoolExecutor(1) as pool, pytest.raises(Exception) as failed:
            ended = pool.submit(finish, b)
            try:
                ended.result(timeout=90)
            except FutureTimeout:
                cancel(b)
                pytest.fail("the refused job was restarted, not failed")
        text = failure_text(failed.value)
        assert "StateCompatibilityError" in text, text[-3000:]
        assert "SuppressRestartsException" in text, text[-3000:]
        for state in FLINK_STATES:
            assert state in text, (state, text[-3000:])
        assert "state.backend.ndb.restore.backend-change: ignore" in text
        assert not lines(tmp_path / "b.txt"), "a record was processed on lost state"
    finally:
        drop_namespace(mysql_url, ns)


def test_ignore_starts_the_switched_state_empty_and_runs_on(tmp_path, mysql_url):
    ns = unique_namespace("frfi")
    try:
        savepoint = savepoint_off("hashmap", ns, mysql_url, tmp_path)
        first_a = {o[0]: o for o in reversed(lines(tmp_path / "a.txt"))}
        ignore = {"state.backend.ndb.restore.backend-change": "ignore"}
        b = start("switch", 1, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=2.0, restore=savepoint, name="from-flink", extra=ignore)
        try:
            deadline = time.monotonic() + 60
            while len(lines(tmp_path / "b.txt")) < 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            savepoint_b = b.trigger_savepoint(str(tmp_path / "sp-b")).result()
        except BaseException:
            cancel(b)
            raise
        finish(b)
        out = lines(tmp_path / "b.txt")
        seqs = sorted(o[1] for o in out)
        assert seqs == list(range(seqs[0], RECORDS)), "not each seq once to the end"
        first_b: dict[str, tuple] = {}
        for o in out:
            first_b.setdefault(o[0], o)
        assert len(first_b) == KEYS
        for key, o in first_b.items():
            # Started empty: the first record of each key counts 1, lists only itself.
            assert o[2:5] == (1, 1, o[1]), (key, o, first_a.get(key))

        # Flink's backend keeps the ignored states in the job's later snapshots; a
        # snapshot the switched operator took itself (its tokens' epoch is the snapshot's
        # id) restores without the setting, its pyflink-ndb state (a new user's find: it
        # was refused, advising to restore with the switch off).
        c = start("switch", 1, ns, mysql_url, tmp_path / "c.txt", records=RECORDS,
                  throttle_ms=0.0, restore=savepoint_b, name="from-flink")
        finish(c)
        first_c = first_of_each_key(lines(tmp_path / "c.txt"))
        assert len(first_c) == KEYS
        last_b: dict[str, tuple] = {o[0]: o for o in out if o[1] < min(
            o[1] for o in lines(tmp_path / "c.txt"))}
        for key, o in first_c.items():  # B's state at its savepoint, one record on
            assert o[2] == last_b[key][2] + 1 and o[3] == o[2], (key, o, last_b[key])
    finally:
        drop_namespace(mysql_url, ns)


def first_of_each_key(out: list[tuple]) -> dict[str, tuple]:
    first: dict[str, tuple] = {}
    for o in out:
        first.setdefault(o[0], o)
    return first


def test_a_switched_savepoint_restored_with_the_switch_off_is_refused_at_submission(
        tmp_path, mysql_url, caplog):
    from pyflink_ndb.errors import StateCompatibilityError

    ns = unique_namespace("tofl")
    try:
        savepoint, _ = savepoint_then_cancel("switch", ns, mysql_url, tmp_path,
                                             tmp_path / "ckpt")
        with pytest.raises(StateCompatibilityError) as refused:
            start("flink", 1, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=0.0, restore=savepoint, name="to-flink")
        message = str(refused.value)
        assert "uid count (operator ID " in message, message
        assert "state.backend.ndb.restore.backend-change: ignore" in message
        assert not lines(tmp_path / "b.txt")

        # The same savepoint with the switch on passes the check and restores its state.
        b = start("switch", 1, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=0.0, restore=savepoint, name="to-flink")
        finish(b)
        check(lines(tmp_path / "b.txt"), RECORDS)

        with caplog.at_level("WARNING"):
            c = start("flink", 1, ns, mysql_url, tmp_path / "c.txt", records=RECORDS,
                      throttle_ms=0.0, restore=savepoint, name="to-flink",
                      extra={"state.backend.ndb.restore.backend-change": "ignore"})
        finish(c)
        assert "uid count" in caplog.text and "starts empty" in caplog.text
        first = first_of_each_key(lines(tmp_path / "c.txt"))
        assert len(first) == KEYS
        for key, o in first.items():  # Flink's state started empty, as told
            assert o[2:5] == (1, 1, o[1]), (key, o)
    finally:
        drop_namespace(mysql_url, ns)
