"""Restores on the CLUSTER path (from a breaker, 2026-12-07): a real standalone cluster
(scripts/cluster.sh) in its own folder and ports (var/cluster-breaker, REST 38081, RPC
36123), jobs submitted with `flink run -py`, with `-s PATH`, `-claimMode`, `flink cancel`,
`flink stop`, a TaskManager killed (-9) or paused (SIGSTOP), a job-level num-retained below
the cluster's. Each part starts its own cluster (about 6 minutes in all).

The job (written to a temporary file): NumberSequenceSource(0, N-1) -> map (optional sleep
per record) -> key "k{i % K}" -> pyflink_ndb.process keeping (count, sum) per key.
The exact per-key result is computable; a bounded run ends with Flink's final checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import drop_namespace
from standalone_cluster import StandaloneCluster

from pyflink_ndb.cli import STOPPED_NOTE

pytestmark = pytest.mark.flink

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_DIR = ROOT / "var" / "cluster-breaker"
CKPT_DIR = CLUSTER_DIR / "checkpoints"
REST_PORT = 38081
REST = f"http://localhost:{REST_PORT}"
UID = "bcount"
N = 4000
K = 13

JOB = r'''
import sys, time
import click
from pyflink.common import Types, WatermarkStrategy
from pyflink.datastream import KeyedProcessFunction, MapFunction, StreamExecutionEnvironment
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.state import ValueStateDescriptor
import pyflink_ndb


class Slow(MapFunction):
    def __init__(self, sleep_ms, keys):
        self.sleep_ms, self.keys = sleep_ms, keys

    def map(self, i):
        if self.sleep_ms:
            time.sleep(self.sleep_ms / 1000)
        return ("k%d" % (i % self.keys), i)


class Agg(KeyedProcessFunction):
    def open(self, ctx):
        self.s = ctx.get_state(ValueStateDescriptor("agg", Types.PICKLED_BYTE_ARRAY()))

    def process_element(self, v, ctx):
        c = self.s.value() or (0, 0)
        self.s.update((c[0] + 1, c[1] + v[1]))
        yield v[0]


@click.command()
@click.option("--url")
@click.option("--namespace")
@click.option("--n", type=int)
@click.option("--keys", type=int)
@click.option("--parallelism", type=int, default=2)
@click.option("--sleep-ms", type=float, default=0)
@click.option("--plain", is_flag=True, help="Agg on Flink's own state backend.")
def main(url, namespace, n, keys, parallelism, sleep_ms, plain):
    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(parallelism)
    keyed = (env.from_source(NumberSequenceSource(0, n - 1), WatermarkStrategy.no_watermarks(),
                             "seq").uid("seq")
             .map(Slow(sleep_ms, keys), output_type=Types.TUPLE([Types.STRING(), Types.LONG()]))
             .uid("slow")
             .key_by(lambda r: r[0], key_type=Types.STRING()))
    if plain:
        out = keyed.process(Agg(), output_type=Types.STRING()).uid("%UID%")
    else:
        out = pyflink_ndb.process(keyed, Agg(), output_type=Types.STRING(), uid="%UID%",
            options={"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
                     "state.backend.ndb.on-fresh-start": "fail"})
    from pyflink.datastream.connectors import Sink
    from pyflink.java_gateway import get_gateway
    jvm = get_gateway().jvm
    out.sink_to(Sink(jvm.org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink())
                ).uid("discard")
    env.execute("breaker")


if __name__ == "__main__":
    main()
'''.replace("%UID%", UID)

EXTRA_CONF = "\n".join([
    f"state.checkpoints.dir: file://{CKPT_DIR}",
    "execution.checkpointing.interval: 500ms",
    "state.checkpoints.num-retained: 1",
    "execution.checkpointing.externalized-checkpoint-retention: RETAIN_ON_CANCELLATION",
    "heartbeat.interval: 2000",
    "heartbeat.timeout: 12000",
    "restart-strategy.type: fixed-delay",
    "restart-strategy.fixed-delay.attempts: 20",
    "restart-strategy.fixed-delay.delay: 2s",
])


CLUSTER = StandaloneCluster(CLUSTER_DIR, rest_port=REST_PORT, rpc_port=36123, slots=2,
                            taskmanagers=int(os.environ.get("BREAKER_TMS", "2")),
                            extra_conf=EXTRA_CONF, start_timeout_s=120, rest_timeout_s=10,
                            flink_timeout_s=240)
script, flink, rest = CLUSTER.script, CLUSTER.flink, CLUSTER.rest


def log_tail(lines: int = 40) -> str:
    return CLUSTER.log_tail(lines)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    with CLUSTER.running(up_timeout_s=200) as url:
        yield url


@pytest.fixture
def namespace(mysql_url: str) -> Iterator[str]:
    ns = "brk_" + uuid.uuid4().hex[:8]
    yield ns
    drop_namespace(mysql_url, ns)


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    p = tmp_path / "breaker_job.py"
    p.write_text(JOB)
    return p


def job_args(job: Path, url: str, ns: str, sleep_ms: float, n: int = N) -> list[str]:
    return ["-py", str(job), "--url", url, "--namespace", ns, "--n", str(n),
            "--keys", str(K), "--sleep-ms", str(sleep_ms)]


def expected(n: int = N) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for i in range(n):
        c = out.setdefault(f"k{i % K}", [0, 0])
        c[0] += 1
        c[1] += i
    return {k: (v[0], v[1]) for k, v in out.items()}


def committed(url: str, ns: str) -> dict[str, tuple[int, int]]:
    from pyflink_ndb.config import from_flink_keys
    from pyflink_ndb.serialization.keys import decode_key
    from pyflink_ndb.serialization.values import decode_value
    from pyflink_ndb.stores.factory import open_store
    store = open_store(from_flink_keys({"state.backend.ndb.url": url,
                                        "state.backend.ndb.namespace": ns}))
    try:
        return {decode_key(r["ukey"]): tuple(decode_value(r["vbytes"]))
                for r in store.query_committed(UID, "agg")}
    finally:
        store.close()


def snapshots(url: str, ns: str) -> list[dict[str, Any]]:
    """`pyflink-ndb savepoints --all --format json`."""
    cli = Path(sys.executable).parent / "pyflink-ndb"
    done = subprocess.run([str(cli), "savepoints", "--all", "--url", url, "--namespace", ns,
                           "--format", "json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def origins(url: str, ns: str) -> list[dict[str, Any]]:
    import pymysql
    from conftest import mysql_connect
    conn = mysql_connect(url)
    try:
        with conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(f"SELECT branch_id, job_id, subtask, attempt, origin FROM "
                        f"{ns}_branches ORDER BY branch_id")
            return [{**r, "origin": json.loads(r["origin"] or "{}")} for r in cur.fetchall()]
    finally:
        conn.close()


def on_disk(jid: str) -> list[int]:
    return sorted(int(m.parent.name.split("-")[1])
                  for m in (CKPT_DIR / jid).glob("chk-*/_metadata"))


def job_id(output: str) -> str:
    found = re.search(r"Job has been submitted with JobID ([0-9a-f]{32})", output)
    assert found, f"no JobID in flink run output:\n{output[-3000:]}"
    return found.group(1)


def submit_detached(*args: str) -> str:
    done = flink("run", "-d", *args)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"flink run -d failed:\n{out[-4000:]}\n{log_tail()}"
    return job_id(out)


def run_attached(*args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    done = flink("run", *args, timeout=400)
    return done, done.stdout + done.stderr


def state(jid: str) -> str:
    return CLUSTER.job_state(jid)


def wait_state(jid: str, wanted: set[str], timeout_s: float = 300) -> str:
    return CLUSTER.wait_job_state(jid, wanted, timeout_s, poll_s=0.5)


def completed_ckpts(jid: str) -> int:
    return int(rest(f"/jobs/{jid}/checkpoints")["counts"]["completed"])


def wait_ckpts(jid: str, n: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while completed_ckpts(jid) < n:
        assert time.monotonic() < deadline, f"fewer than {n} checkpoints\n{log_tail()}"
        assert state(jid) == "RUNNING", state(jid)
        time.sleep(0.3)


def cancel(jid: str) -> None:
    done = flink("cancel", jid, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_state(jid, {"CANCELED"}, 90)


def run_then_stop_with_savepoint(job: Path, url: str, ns: str, ckpts: int, *extra: str
                                 ) -> tuple[str, str]:
    """Submit the job (8 ms a record; `extra`: more job arguments), let it complete `ckpts`
    checkpoints, stop it with a savepoint (`flink stop --savepointPath`); returns the job
    id and the savepoint's path."""
    a = submit_detached(*job_args(job, url, ns, sleep_ms=8), *extra)
    wait_state(a, {"RUNNING"}, 120)
    wait_ckpts(a, ckpts)
    stop = flink("stop", "--savepointPath", (CLUSTER_DIR / "savepoints").as_uri(), a,
                 timeout=120)
    out = stop.stdout + stop.stderr
    assert stop.returncode == 0, out[-3000:] + log_tail()
    sp = re.search(r"Savepoint completed\. Path: (\S+)", out).group(1)
    wait_state(a, {"FINISHED"}, 60)
    return a, sp


def partial_then_cancel(job: Path, url: str, ns: str, ckpts: int = 3) -> tuple[str, int]:
    """A throttled run, cancelled after `ckpts` completed checkpoints; returns the job id
    and the retained checkpoint Flink keeps on disk."""
    jid = submit_detached(*job_args(job, url, ns, sleep_ms=8))
    wait_state(jid, {"RUNNING"}, 120)
    wait_ckpts(jid, ckpts)
    cancel(jid)
    kept = on_disk(jid)
    assert len(kept) == 1, kept
    part = committed(url, ns)
    assert 0 < sum(v[0] for v in part.values()) < N, "not cancelled mid-stream"
    return jid, kept[0]


def test_claim_mode_from_cli_reaches_job_and_drops_snapshot(cluster, mysql_url, namespace,
                                                            job_file):
    """`flink run -s chk -claimMode CLAIM`: Flink deletes the claimed checkpoint once the
    new job subsumes it; pyflink-ndb must record the claim and drop it too."""
    a, n = partial_then_cancel(job_file, mysql_url, namespace)
    chk = CKPT_DIR / a / f"chk-{n}"
    # B runs long enough to complete several checkpoints: a job that finishes before
    # its retention subsumed anything leaves its last snapshots listed (README, "What can
    # be restored": the store cannot tell a finished job from a cancelled one).
    done, out = run_attached("-s", str(chk), "-claimMode", "CLAIM",
                             *job_args(job_file, mysql_url, namespace, 5))
    assert done.returncode == 0, out[-4000:] + log_tail()
    b = job_id(out)
    assert state(b) == "FINISHED"
    assert committed(mysql_url, namespace) == expected()
    # Flink itself honoured the claim: the claimed checkpoint's folder is gone.
    flink_deleted = not (chk / "_metadata").exists()
    rows = [o for o in origins(mysql_url, namespace) if o["job_id"] == b]
    claims = [bool(o["origin"].get("claim")) for o in rows]
    listed = [(s.get("job"), s.get("checkpoint"), s.get("note") or s.get("why"), s)
              for s in snapshots(mysql_url, namespace)]
    a_listed = [x for x in listed if x[0] == a and x[1] == n]
    print("flink deleted:", flink_deleted, "claims:", claims, "listed:", listed,
          file=sys.stderr)
    assert flink_deleted, "Flink did not delete the claimed checkpoint: -claimMode lost?"
    assert claims and all(claims), f"the bridge did not see CLAIM: {rows}"
    assert not a_listed, (f"Flink deleted {chk} (claimed, subsumed), but pyflink-ndb still "
                          f"lists it as restorable: {a_listed}")


def test_no_claim_twice_then_listing_matches_disk(cluster, mysql_url, namespace, job_file):
    """NO_CLAIM (default) restore of a cancelled job's retained checkpoint, twice: both
    exact (neither restores the other's state), and every checkpoint the CLI says Flink
    keeps on disk is there."""
    a, n = partial_then_cancel(job_file, mysql_url, namespace)
    chk = CKPT_DIR / a / f"chk-{n}"
    for _ in range(2):
        done, out = run_attached("-s", str(chk), *job_args(job_file, mysql_url, namespace, 0))
        assert done.returncode == 0, out[-4000:] + log_tail()
        assert committed(mysql_url, namespace) == expected()
        assert (chk / "_metadata").exists()
    listed = snapshots(mysql_url, namespace)
    print("listed:", listed, file=sys.stderr)
    assert any(s.get("job") == a and s.get("checkpoint") == n for s in listed), listed


def test_claim_mode_savepoint_dropped_like_flink(cluster, mysql_url, namespace, job_file):
    """`flink stop --savepointPath`, then `flink run -s SAVEPOINT -claimMode CLAIM` to the
    end: Flink treats the claimed savepoint as a checkpoint and deletes it once subsumed;
    pyflink-ndb must not keep listing it as restorable (pinned until released)."""
    _, sp = run_then_stop_with_savepoint(job_file, mysql_url, namespace, 2)
    sp_path = Path(sp.replace("file:", "", 1)) if sp.startswith("file:") else Path(sp)
    sp_ckpt = [s["checkpoint"] for s in snapshots(mysql_url, namespace)
               if s["kind"] == "savepoint"]
    assert len(sp_ckpt) == 1, snapshots(mysql_url, namespace)
    done, o = run_attached("-s", sp, "-claimMode", "CLAIM",  # long enough to subsume it
                           *job_args(job_file, mysql_url, namespace, 5))
    assert done.returncode == 0, o[-4000:] + log_tail()
    assert committed(mysql_url, namespace) == expected()
    flink_deleted = not (sp_path / "_metadata").exists()
    listed = [s for s in snapshots(mysql_url, namespace) if s["kind"] == "savepoint"]
    print("savepoint", sp_path, "flink deleted:", flink_deleted, "listed:", listed,
          file=sys.stderr)
    assert flink_deleted, "Flink kept the claimed savepoint"
    assert not listed, f"Flink deleted the claimed savepoint {sp}; pyflink-ndb lists {listed}"


def test_restore_into_other_namespace_with_colliding_ids_fails(cluster, mysql_url,
                                                                namespace, job_file):
    """Two namespaces with the same branch ids and checkpoint ids: A1's retained checkpoint
    restored with --namespace of A2 must fail, not restore A2's state."""
    other = "brk_" + uuid.uuid4().hex[:8]
    try:
        a1, n1 = partial_then_cancel(job_file, mysql_url, namespace)
        # A2's store keeps its checkpoints (retained 50) so that A1's id is among them.
        a2 = submit_detached("-Dstate.backend.ndb.checkpoints.retained=50",
                             *job_args(job_file, mysql_url, other, sleep_ms=8))
        wait_state(a2, {"RUNNING"}, 120)
        while True:
            latest = rest(f"/jobs/{a2}/checkpoints")["latest"]["completed"]
            if latest and latest["id"] >= n1:
                break
            time.sleep(0.02)
        req = urllib.request.Request(f"{REST}/jobs/{a2}?mode=cancel", method="PATCH")
        urllib.request.urlopen(req, timeout=10).read()
        wait_state(a2, {"CANCELED"}, 90)
        ids2 = {s["checkpoint"] for s in snapshots(mysql_url, other)}
        before = committed(mysql_url, other)
        print("n1", n1, "ids in other:", ids2, file=sys.stderr)
        assert n1 in ids2, "no id collision: timing"
        done, o = run_attached("-s", str(CKPT_DIR / a1 / f"chk-{n1}"),
                               "-Drestart-strategy.type=none",
                               *job_args(job_file, mysql_url, other, 0))
        after = committed(mysql_url, other)
        assert done.returncode != 0, (
            f"restored A1's checkpoint {n1} into namespace {other} (ids {ids2}); state "
            f"{before} -> {after}")
        assert "CheckpointError" in o + log_tail(200), o[-3000:]
        assert after == before
    finally:
        drop_namespace(mysql_url, other)


# == failures on the cluster: stop-with-savepoint, kill -9 and SIGSTOP of a TaskManager ==
DISK_NOTES = ("kept until released (its job retains its checkpoints when it ends)",
              "pinned until released (a job was started from it)")


def listing_vs_disk(url: str, ns: str, job: str) -> list[dict]:
    """Checkpoints of the cancelled job `job` that the CLI says Flink keeps for the user,
    whose chk-N folder is gone. (Not of a job that finished: Flink deletes those, and the
    store cannot tell finished from cancelled; README, "What can be restored".)"""
    bad = []
    for s in snapshots(url, ns):
        if s["kind"] == "checkpoint" and s["job"] == job and s["note"] in DISK_NOTES:
            if not (CKPT_DIR / s["job"] / f"chk-{s['checkpoint']}" / "_metadata").exists():
                bad.append(s)
    return bad


def tm_pids() -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "TaskManagerRunner" in cmd and str(CLUSTER_DIR / "conf") in cmd:
            out.append(int(d.name))
    return out


def pid_listening_on(port: int) -> int | None:
    done = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if re.search(rf":{port}\s", line):
            found = re.search(r"pid=(\d+)", line)
            if found:
                return int(found.group(1))
    return None


def tm_pid_of_job(jid: str) -> int:
    """The pid of a TaskManager that runs a subtask of the keyed operator."""
    for v in rest(f"/jobs/{jid}")["vertices"]:
        if "bcount" in v["name"].lower() or "keyed" in v["name"].lower() or True:
            for tm in rest(f"/jobs/{jid}/vertices/{v['id']}/taskmanagers")["taskmanagers"]:
                tmid = tm.get("taskmanager-id") or tm.get("resource-id") or ""
                port = re.search(r":(\d+)-", tmid)
                if port:
                    pid = pid_listening_on(int(port.group(1)))
                    if pid in tm_pids():
                        return pid
    pids = tm_pids()
    pytest.fail(f"no TaskManager pid found for {jid}; TM pids {pids}")


def ensure_two_tms() -> None:
    while len(tm_pids()) < 2:
        done = script("taskmanager", "start", timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        time.sleep(1)
    deadline = time.monotonic() + 120
    while rest("/overview")["taskmanagers"] < 2:
        assert time.monotonic() < deadline, log_tail()
        time.sleep(1)


def wait_no_jobs_running() -> None:
    deadline = time.monotonic() + 60
    while any(j["state"] not in ("FINISHED", "CANCELED", "FAILED")
              for j in rest("/jobs/overview")["jobs"]):
        assert time.monotonic() < deadline
        time.sleep(1)


def test_stop_with_savepoint_restore_twice_and_listing(cluster, mysql_url, namespace,
                                                       job_file):
    """stop --savepointPath mid-stream; restore the savepoint twice (exact both times); the
    savepoint stays listed, pinned until released (NO_CLAIM: Flink keeps it). The stopped
    job ran with RETAIN_ON_CANCELLATION, yet Flink deleted its checkpoints when it
    finished: the listing says so (it keeps them until released: the job might have
    failed while stopping, tests/test_stop_then_failure_flink.py).
    (The restored jobs end with their bounded input, which the store does not record:
    their last checkpoints stay listed; README, "What can be restored".)"""
    ensure_two_tms()
    a, sp = run_then_stop_with_savepoint(job_file, mysql_url, namespace, 3)
    part = committed(mysql_url, namespace)
    assert 0 < sum(v[0] for v in part.values()) < N
    assert on_disk(a) == [], "Flink kept a finished job's retained checkpoints"
    notes = {s["note"] for s in snapshots(mysql_url, namespace)
             if s["kind"] == "checkpoint" and s["job"] == a}
    # (a periodic checkpoint in flight at the stop stays pending: Flink never completed it)
    assert STOPPED_NOTE in notes
    assert notes <= {"readers see it", "pending (not completed)", STOPPED_NOTE}, notes
    for i in range(2):
        done, o = run_attached("-s", sp, *job_args(job_file, mysql_url, namespace, 0))
        assert done.returncode == 0, o[-4000:] + log_tail()
        got = committed(mysql_url, namespace)
        assert got == expected(), f"restore {i}: {got} != {expected()}"
    listed = snapshots(mysql_url, namespace)
    print("listing:", listed, file=sys.stderr)
    assert [s["note"] for s in listed if s["kind"] == "savepoint"] == \
        ["pinned until released"], listed


def test_a_change_of_backend_is_refused_both_ways(cluster, mysql_url, namespace, job_file):
    """`flink run -s` across the two backends (README, "Limits";
    `state.backend.ndb.restore.backend-change`): the pyflink-ndb job's savepoint restored
    by the same job with Agg on Flink's backend (`--plain`) is refused by the client before
    anything is submitted; the plain job's savepoint restored by the pyflink-ndb job fails
    its subtasks with StateCompatibilityError naming the state. Flink alone would start the
    state empty both times, without an error."""
    ensure_two_tms()
    jobs_before = len(rest("/jobs/overview")["jobs"])
    _, sp = run_then_stop_with_savepoint(job_file, mysql_url, namespace, 2)
    done, o = run_attached("-s", sp, *job_args(job_file, mysql_url, namespace, 0), "--plain")
    assert done.returncode != 0, o[-4000:]
    assert "StateCompatibilityError" in o and f"uid {UID} (operator ID" in o, o[-4000:]
    assert len(rest("/jobs/overview")["jobs"]) == jobs_before + 1  # none submitted

    _, plain_sp = run_then_stop_with_savepoint(job_file, mysql_url, namespace, 2, "--plain")
    done, o = run_attached("-s", plain_sp, "-Drestart-strategy.type=none",
                           *job_args(job_file, mysql_url, namespace, 0))
    assert done.returncode != 0, o[-4000:]
    assert "StateCompatibilityError" in o and "'agg' (value)" in o, o[-4000:] + log_tail()


def test_kill_tm_then_cancel_then_restore_retained(cluster, mysql_url, namespace, job_file):
    """kill -9 the TaskManager running the tasks while checkpoints run; the job recovers on
    the other one; cancel later; restore the retained checkpoint: exact."""
    ensure_two_tms()
    a = submit_detached(*job_args(job_file, mysql_url, namespace, sleep_ms=12))
    wait_state(a, {"RUNNING"}, 120)
    wait_ckpts(a, 2)
    pid = tm_pid_of_job(a)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    # Flink notices, restarts on the other TaskManager; a new one replaces the dead one.
    deadline = time.monotonic() + 120
    while True:
        j = rest(f"/jobs/{a}")
        if j["state"] == "RUNNING" and all(v["status"] == "RUNNING" for v in j["vertices"]) \
                and time.monotonic() - killed_at > 3:
            break
        assert j["state"] not in ("FAILED", "FINISHED"), (j["state"], log_tail())
        assert time.monotonic() < deadline, log_tail()
        time.sleep(0.5)
    ensure_two_tms()
    before = int(rest(f"/jobs/{a}/checkpoints")["counts"]["completed"])
    wait_ckpts(a, before + 2)
    cancel(a)
    kept = on_disk(a)
    print("after kill+cancel on disk:", kept, "origins:",
          [(o["branch_id"], o["subtask"], o["attempt"], o["origin"].get("kind"))
           for o in origins(mysql_url, namespace)], file=sys.stderr)
    assert len(kept) == 1
    part = committed(mysql_url, namespace)
    assert 0 < sum(v[0] for v in part.values()) < N, "not cancelled mid-stream"
    done, o = run_attached("-s", str(CKPT_DIR / a / f"chk-{kept[0]}"),
                           *job_args(job_file, mysql_url, namespace, 0))
    assert done.returncode == 0, o[-4000:] + log_tail()
    assert committed(mysql_url, namespace) == expected()
    bad = listing_vs_disk(mysql_url, namespace, a)
    assert not bad, f"listed as kept by Flink, but not on disk: {bad}"


def test_sigstop_tm_replaced_attempt_exact(cluster, mysql_url, namespace, job_file):
    """SIGSTOP the TaskManager running the tasks for 30 s (heartbeat timeout 12 s: Flink
    replaces the attempts on the other TaskManager), SIGCONT; the job finishes exact."""
    ensure_two_tms()
    a = submit_detached(*job_args(job_file, mysql_url, namespace, sleep_ms=10))
    wait_state(a, {"RUNNING"}, 120)
    wait_ckpts(a, 2)
    pid = tm_pid_of_job(a)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(30)
    finally:
        os.kill(pid, signal.SIGCONT)
    final = wait_state(a, {"FINISHED", "FAILED", "CANCELED"}, 400)
    print("origins:", [(o["branch_id"], o["subtask"], o["attempt"], o["origin"].get("kind"))
                       for o in origins(mysql_url, namespace)], file=sys.stderr)
    assert final == "FINISHED", log_tail()
    got = committed(mysql_url, namespace)
    assert got == expected(), f"{got} != {expected()}"
    ensure_two_tms()


# == the JobManager's num-retained over a job-level value ==============================
# Flink 1.20's JobManager keeps the number of retained checkpoints its own
# (cluster) configuration says (`execution.checkpointing.num-retained`); a job-level value
# (`flink run -D ...`, or the job's configuration) does not change what Flink keeps on disk,
# but pyflink-ndb's retention takes the job's value over the TaskManager's. Cluster: 3
# retained; job: -D ...num-retained=1. Every checkpoint Flink keeps must restore.
@pytest.fixture(scope="module")
def cluster3() -> Iterator[str]:
    CLUSTER.extra_conf = EXTRA_CONF.replace("state.checkpoints.num-retained: 1",
                                            "execution.checkpointing.num-retained: 3")
    try:
        with CLUSTER.running(up_timeout_s=200) as url:
            yield url
    finally:
        CLUSTER.extra_conf = EXTRA_CONF


def test_job_level_num_retained_lower_than_cluster(cluster3, mysql_url, namespace,
                                                   job_file):
    a = submit_detached("-Dexecution.checkpointing.num-retained=1",
                        *job_args(job_file, mysql_url, namespace, sleep_ms=8))
    wait_state(a, {"RUNNING"}, 120)
    wait_ckpts(a, 6)
    cancel(a)
    kept = on_disk(a)
    print("on disk:", kept, "listed:", [(s["job"][:6], s["checkpoint"], s["note"])
                                        for s in snapshots(mysql_url, namespace)],
          file=sys.stderr)
    assert len(kept) == 3, kept
    for n in kept:  # oldest first
        done, o = run_attached("-s", str(CKPT_DIR / a / f"chk-{n}"),
                               "-Drestart-strategy.type=none",
                               *job_args(job_file, mysql_url, namespace, 0))
        assert done.returncode == 0, f"restore of chk-{n} (Flink keeps {kept}) failed:\n" + \
            "\n".join(line for line in (o + log_tail(200)).splitlines()
                      if "CheckpointError" in line)[-2000:]
        assert committed(mysql_url, namespace) == expected()
