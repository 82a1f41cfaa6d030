"""The cluster path: a real local standalone Flink cluster started from the apache-flink
wheel by `scripts/cluster.sh`, the flight-delays job submitted to it with `flink run -py`,
state in the MySQL-protocol server; the committed state read back must equal what pandas
computes from the same CSV lines. Also: stop with a savepoint at parallelism 2 (`flink
stop --savepointPath`) and restore it at parallelism 3 (`flink run -s`), exact state.

The cluster runs in its own folder and on its own ports (var/cluster-test, REST 18081,
RPC 16123), so a cluster started with `make cluster-up` is left alone. It is always
stopped at the end; if it cannot start, the tests fail with the tail of its logs.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import assert_exact, drop_namespace, pandas_aircraft
from standalone_cluster import SCRIPT, StandaloneCluster

from jobs.flight_data import flights_csv
from jobs.flight_delays import OPERATOR_UID, committed_aircraft
from pyflink_ndb.config import from_flink_keys
from pyflink_ndb.stores.factory import open_store

pytestmark = pytest.mark.flink

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 20_000
CLUSTER = StandaloneCluster(ROOT / "var" / "cluster-test", rest_port=18081, rpc_port=16123,
                            slots=3)
log_tail, script, flink, rest = CLUSTER.log_tail, CLUSTER.script, CLUSTER.flink, CLUSTER.rest


def job_args(url: str, namespace: str, parallelism: int, *extra: str) -> list[str]:
    return ["-py", str(ROOT / "jobs" / "flight_delays.py"), "--url", url,
            "--namespace", namespace, "--limit", str(LIMIT), "--parallelism", str(parallelism),
            "--checkpoint-ms", "500", "--cache-entries", "500", *extra]


def job_id(output: str) -> str:
    found = re.search(r"Job has been submitted with JobID ([0-9a-f]{32})", output)
    assert found, f"no JobID in the output of flink run:\n{output[-3000:]}"
    return found.group(1)


def completed_checkpoints(jid: str) -> int:
    return int(rest(f"/jobs/{jid}/checkpoints")["counts"]["completed"])


def check_run(done: subprocess.CompletedProcess[str]) -> str:
    output = done.stdout + done.stderr
    assert done.returncode == 0, (
        f"flink run failed ({done.returncode}):\n{output[-4000:]}\n{log_tail()}")
    return output


@pytest.fixture(scope="session")
def cluster() -> Iterator[str]:
    """A standalone cluster from the wheel (3 slots), stopped at the end in any case."""
    started = time.monotonic()
    with CLUSTER.running(up_timeout_s=150) as url:
        print(f"cluster up in {time.monotonic() - started:.1f} s", file=sys.stderr)
        yield url


@pytest.fixture
def namespace(mysql_url: str) -> Iterator[str]:
    ns = "cluster_" + uuid.uuid4().hex[:8]
    yield ns
    drop_namespace(mysql_url, ns)


def test_flink_run_on_cluster_exact_state(cluster: str, mysql_url: str, namespace: str):
    overview = rest("/overview")
    assert overview["taskmanagers"] >= 1 and overview["slots-available"] >= 2, overview
    started = time.monotonic()
    output = check_run(flink("run", *job_args(mysql_url, namespace, 2)))
    print(f"flink run: {time.monotonic() - started:.1f} s", file=sys.stderr)
    jid = job_id(output)
    # It ran on this cluster (not on a MiniCluster inside the client) and finished there.
    assert rest(f"/jobs/{jid}")["state"] == "FINISHED"
    assert completed_checkpoints(jid) >= 1
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace}
    store = open_store(from_flink_keys(options))
    try:
        assert store.latest_committed_checkpoint(OPERATOR_UID), "no completed checkpoint"
    finally:
        store.close()
    assert_exact(committed_aircraft(options), pandas_aircraft(flights_csv(LIMIT)))


def wait_for_running_job(proc: subprocess.Popen[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [j["jid"] for j in rest("/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
        if running:
            return str(running[0])
        assert proc.poll() is None, "flink run ended before the job ran"
        time.sleep(0.2)
    pytest.fail(f"no running job after {timeout_s} s\n{log_tail()}")


def wait_for_checkpoint(jid: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if completed_checkpoints(jid) >= 1:
            return
        time.sleep(0.2)
    pytest.fail(f"no checkpoint completed in {timeout_s} s\n{log_tail()}")


def ndb_metrics(jid: str) -> dict[str, float]:
    """The pyflink_ndb metrics of every subtask of the job, as the REST API shows them
    (`<subtask>.<operator>.pyflink_ndb.<name>` -> value)."""
    out: dict[str, float] = {}
    for vertex in rest(f"/jobs/{jid}")["vertices"]:
        base = f"/jobs/{jid}/vertices/{vertex['id']}/metrics"
        ids = [m["id"] for m in rest(base) if ".pyflink_ndb." in m["id"]]
        if ids:
            for m in rest(base + "?get=" + ",".join(ids)):
                out[m["id"]] = float(m["value"])
    return out


def wait_for_metrics(jid: str, timeout_s: float = 45) -> dict[str, float]:
    """Wait until the REST API shows a durable checkpoint in the metrics (the web UI's
    metric fetcher refreshes every 10 s)."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        seen = ndb_metrics(jid)
        if any(k.endswith(".pyflink_ndb.checkpointsWritten") and v >= 1
               for k, v in seen.items()):
            return seen
        time.sleep(1)
    pytest.fail(f"no pyflink_ndb metrics over REST after {timeout_s} s: {seen}")


def test_stop_with_savepoint_then_restore_at_other_parallelism(
        cluster: str, mysql_url: str, namespace: str, tmp_path: Path):
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace}
    csv = flights_csv(LIMIT)
    wanted = pandas_aircraft(csv)

    # Parallelism 2, slowed down so that it is still running when stopped.
    first = subprocess.Popen(
        ["bash", *SCRIPT, "flink", "run", *job_args(mysql_url, namespace, 2,
                                                    "--throttle-ms", "3")],
        env=CLUSTER.env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(first.stdout or []), daemon=True)
    reader.start()
    try:
        jid = wait_for_running_job(first)
        wait_for_checkpoint(jid)
        # Issue 10: the backend's metrics are in Flink's metric system, read over REST.
        metrics = wait_for_metrics(jid)
        names = {k.rsplit(".", 1)[1] for k in metrics}
        assert {"tier1Hits", "storeReads", "entriesWritten", "rowsWritten", "retries",
                "checkpointsFailed"} <= names, sorted(names)
        assert sum(v for k, v in metrics.items() if k.endswith(".entriesWritten")) >= 1
        assert sum(v for k, v in metrics.items() if k.endswith(".checkpointsFailed")) == 0
        stop = flink("stop", "--savepointPath", (tmp_path / "savepoints").as_uri(), jid,
                     timeout=90)
        stopped = stop.stdout + stop.stderr
        assert stop.returncode == 0, f"flink stop failed:\n{stopped[-3000:]}\n{log_tail()}"
        found = re.search(r"Savepoint completed\. Path: (\S+)", stopped)
        assert found, f"no savepoint path in the output of flink stop:\n{stopped[-3000:]}"
        savepoint = found.group(1)
        first.wait(timeout=90)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    reader.join(timeout=10)
    assert rest(f"/jobs/{jid}")["state"] == "FINISHED", "".join(output)[-3000:]

    part = committed_aircraft(options)
    flown = sum(v[0] for v in part.values())
    assert 0 < flown < sum(v[0] for v in wanted.values()), (
        f"the stopped run committed {flown} flights: not stopped mid-stream")

    # Restore the savepoint at parallelism 3 (unthrottled): exact state at the end.
    output2 = check_run(flink("run", "-s", savepoint, *job_args(mysql_url, namespace, 3)))
    jid2 = job_id(output2)
    assert rest(f"/jobs/{jid2}")["state"] == "FINISHED"
    assert completed_checkpoints(jid2) >= 1
    assert_exact(committed_aircraft(options), wanted)
