"""Faults injected by the dozen (issue 8), the quick variant of `make faults`: crashes at
every step of the protocol and bad records (MiniCluster), the database killed, away for
10 s and 60 s, locked and deadlocked (through a proxy), TaskManagers killed and frozen
past the heartbeat timeout, the JobManager killed (ZooKeeper HA: a new JobManager
recovers the job), rescale 2→3→1 with a crash (standalone cluster with two
TaskManagers). Every run ends with its committed state compared with the model: 0 lost,
0 doubled, every fault recovered without operator action. About 6 minutes here.

The JobManager kill needs no ZooKeeper installed: scripts/cluster.sh (FLINK_HA=zookeeper)
runs the ZooKeeper server that the apache-flink wheel bundles (flink-dist, Flink's
bin/zookeeper.sh); when it cannot start, the cluster run fails and so does this test.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from faults.runner import QUICK, run_variant, write_results

pytestmark = pytest.mark.flink

ROOT = Path(__file__).resolve().parent.parent


def test_quick_fault_runs_lose_and_double_nothing(mysql_url: str, tmp_path: Path):
    started = time.time()
    results = run_variant(QUICK, mysql_url, tmp_path / "work")
    text = write_results(results, ROOT / "var" / "faults-quick.md", QUICK,
                         time.time() - started)
    faults = [f for r in results for f in r.faults]
    kinds = {f.kind.split(":")[0] for f in faults}
    assert len(faults) >= 30, text
    assert {"crash", "bad record", "db", "TaskManager kill -9 (2 TaskManagers)",
            "zombie TaskManager (SIGSTOP past heartbeat timeout, SIGCONT)",
            "JobManager kill -9 (ZooKeeper HA)", "rescale"} <= kinds, text
    for kind in ("db: outage 10 s", "db: outage 60 s",
                 "db: server-side KILL of the job's sessions",
                 "db: lock-wait timeout (owner row locked 56 s)"):
        assert any(f.kind == kind for f in faults), (kind, text)
    # Deadlocks: the competitor provokes one only when it catches a job transaction queued
    # behind its lock, which it does not always (the job's subtasks no longer deadlock
    # each other on the owner row since _lock_operator locks before it inserts), so the
    # quick variant requires the lock waits above, not a deadlock; `make faults` reports
    # the deadlocks it provoked.
    not_recovered = [(f.kind, f.detail) for f in faults if f.recovered_s is None]
    assert not not_recovered, text
    for r in results:
        assert r.verdict is not None and r.verdict.exact, (r.name, r.verdict, text)
        assert not r.midrun_bad, (r.name, r.midrun_bad)
        assert r.verdict.lost == 0 and r.verdict.doubled == 0
