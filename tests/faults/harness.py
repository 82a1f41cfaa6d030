"""Plumbing of the fault runs: the job as a killable subprocess (MiniCluster) or on the
standalone cluster, a watcher of the committed checkpoint, database faults (server-side
KILL, a proxy to stop or black-hole, a competing session's locks) and the bookkeeping of
faults and checks.

Nothing here stops or reconfigures the shared MySQL-protocol server: outages happen in a
TcpProxy in front of it, KILL hits only the job's own connections (those the proxy
forwards), locks are taken on the run's own namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

from pyflink_ndb.config import from_flink_keys
from pyflink_ndb.errors import StaleReadError
from pyflink_ndb.faults import (
    OPERATOR_UID,
    Verdict,
    check_sequence_state,
    read_events,
    read_sequence_state,
)
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.stores.mysql import parse_mysql_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: tcp_proxy
from tcp_proxy import TcpProxy  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
SEQJOB = ROOT / "tests" / "faults" / "seqjob.py"


def say(message: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- bookkeeping ---------------------------------------------------------------------------
@dataclass
class Fault:
    """One injected fault. `lifted_s`: when it ended (an outage's end; = injected_s for an
    instant fault); `recovered_s`: when the job next committed a checkpoint newer than
    the last one committed when the fault ended (None: never)."""

    kind: str
    injected_s: float
    lifted_s: float
    recovered_s: float | None = None
    detail: str = ""
    #: A fault that restarts the tasks: the attempt it failed (the recovery is a commit
    #: after a later attempt opened, not a checkpoint that was in flight).
    failed_attempt: int | None = None
    events: Path | None = None
    not_before_s: float = 0.0

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_s is None else max(0.0, self.recovered_s - self.lifted_s)

    def restarted(self) -> bool:
        """For a fault that restarts the tasks: has a later attempt opened? (sets
        `not_before_s` to when it did; see :func:`new_attempt`). Always True for other
        faults."""
        if self.failed_attempt is None or self.events is None:
            return True
        if not self.not_before_s:
            opened = [e["t"] for e in read_events(self.events) if e["event"] == "open"
                      and new_attempt(e, self.failed_attempt, self.injected_s)]
            if opened:
                self.not_before_s = min(opened)
        return bool(self.not_before_s)


#: Subtasks of one attempt open within this many seconds of each other.
STRAGGLE_S = 5.0


def new_attempt(event: dict[str, Any], attempt: int, after_s: float) -> bool:
    """Is `event` (an `open` or `first_record`) of an attempt that started after the fault
    at `after_s`, which failed attempt `attempt` (-1: none)? Flink numbers the attempts of
    a job from 0 each time a JobManager (re)creates it (after a failover of the JobManager,
    also after one that lost its ZooKeeper leadership and regained it), so a number other
    than `attempt` is a new attempt, and the same number is one too once it is
    `STRAGGLE_S` after the fault (before that it may be a sibling subtask of the failed
    attempt that opened late)."""
    return event["t"] >= after_s and (event["attempt"] != attempt
                                      or event["t"] >= after_s + STRAGGLE_S)


@dataclass
class RunResult:
    name: str
    faults: list[Fault] = field(default_factory=list)
    verdict: Verdict | None = None
    midrun_checks: int = 0
    midrun_bad: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def kinds(self) -> set[str]:
        return {f.kind for f in self.faults}


def table(results: list[RunResult]) -> str:
    """The markdown table: per fault kind."""
    rows = ["| fault kind | injected | recovered | records checked | updates lost | "
            "updates doubled | mid-run checks (bad) | time to recover median / max (s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    kinds: dict[str, list[tuple[Fault, RunResult]]] = {}
    for run in results:
        for f in run.faults:
            kinds.setdefault(f.kind, []).append((f, run))
    total = [0, 0]
    for kind in sorted(kinds):
        pairs = kinds[kind]
        runs = {id(r): r for _, r in pairs}.values()
        times = [f.recovery_s for f, _ in pairs if f.recovery_s is not None]
        recovered = sum(1 for f, _ in pairs if f.recovered_s is not None)
        records = sum(r.verdict.records for r in runs if r.verdict)
        lost = sum(r.verdict.lost for r in runs if r.verdict)
        doubled = sum(r.verdict.doubled for r in runs if r.verdict)
        checks = sum(r.midrun_checks for r in runs)
        bad = sum(len(r.midrun_bad) for r in runs)
        med = f"{statistics.median(times):.1f} / {max(times):.1f}" if times else "-"
        rows.append(f"| {kind} | {len(pairs)} | {recovered} | {records:,} | {lost} | "
                    f"{doubled} | {checks} ({bad}) | {med} |")
        total[0] += len(pairs)
        total[1] += recovered
    runs_all = [r for r in results if r.verdict]
    rows.append(f"| **all** | **{total[0]}** | **{total[1]}** | "
                f"{sum(r.verdict.records for r in runs_all):,} | "
                f"{sum(r.verdict.lost for r in runs_all)} | "
                f"{sum(r.verdict.doubled for r in runs_all)} | "
                f"{sum(r.midrun_checks for r in results)} "
                f"({sum(len(r.midrun_bad) for r in results)}) | |")
    return "\n".join(rows)


# -- the committed checkpoint, watched -----------------------------------------------------
class CommitWatcher:
    """Polls the operator's committed checkpoint (every `poll_s`) on a connection of its
    own, and at most every `check_every_s` reads the committed state and checks
    `count == last` for every key (a mid-run check)."""

    def __init__(self, url: str, namespace: str, poll_s: float = 0.25,
                 check_every_s: float = 1.0) -> None:
        self.options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace}
        self.poll_s = poll_s
        self.check_every_s = check_every_s
        self.timeline: list[tuple[float, int]] = []
        self.checks = 0
        self.bad: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="commit-watcher")

    def __enter__(self) -> CommitWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        store = None
        last_check = 0.0
        while not self._stop.is_set():
            try:
                if store is None:
                    store = open_store(from_flink_keys(self.options))
                ckpt = store.latest_committed_checkpoint(OPERATOR_UID)
                now = time.time()
                if ckpt is not None and (not self.timeline or self.timeline[-1][1] != ckpt):
                    self.timeline.append((now, ckpt))
                    if now - last_check >= self.check_every_s:
                        last_check = now
                        self._check(store)
            except StaleReadError:
                pass  # GC overtook the read: the next one reads a newer checkpoint
            except Exception:  # noqa: BLE001 (the database may be away for a while)
                if store is not None:
                    with contextlib.suppress(Exception):
                        store.close()
                store = None
            self._stop.wait(self.poll_s)
        if store is not None:
            store.close()

    def _check(self, store: Any) -> None:
        verdict = check_sequence_state(read_sequence_state(store))
        self.checks += 1
        if not verdict.exact:
            self.bad.append(f"{time.strftime('%H:%M:%S')}: {verdict}")

    def latest(self, before_s: float | None = None) -> int:
        """The latest committed checkpoint seen (at or before `before_s`); 0 before any."""
        seen = [c for t, c in self.timeline if before_s is None or t <= before_s]
        return seen[-1] if seen else 0

    def committed_after(self, fault: Fault) -> float | None:
        """When a checkpoint newer than the last one committed when the fault ended was
        committed (by a later attempt, for a fault that restarts the tasks; None: not
        yet)."""
        if not fault.restarted():
            return None
        before = self.latest(fault.lifted_s)
        for t, c in self.timeline:
            if t >= max(fault.lifted_s, fault.not_before_s) and c > before:
                return t
        return None

    def wait_recovered(self, fault: Fault, timeout_s: float,
                       alive: Callable[[], bool] = lambda: True) -> bool:
        end = time.time() + timeout_s
        while time.time() < end and alive():
            got = self.committed_after(fault)
            if got is not None:
                fault.recovered_s = got
                return True
            time.sleep(0.1)
        got = self.committed_after(fault)
        fault.recovered_s = got
        return got is not None

    def settle(self, faults: list[Fault]) -> None:
        """Fill in `recovered_s` of faults whose recovery came later (the job finished:
        its final checkpoint counts)."""
        for f in faults:
            if f.recovered_s is None:
                f.recovered_s = self.committed_after(f)


def final_check(url: str, namespace: str, model: dict[str, int], run: RunResult,
                watcher: CommitWatcher) -> None:
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace}
    store = open_store(from_flink_keys(options))
    try:
        run.verdict = check_sequence_state(read_sequence_state(store), model)
    finally:
        store.close()
    run.midrun_checks = watcher.checks
    run.midrun_bad = watcher.bad
    say(f"{run.name}: {run.verdict}; mid-run checks {watcher.checks}, bad {len(watcher.bad)}")


def retry_errors(logs: list[Path]) -> str:
    """What the store's retries met, from pyflink_ndb's WARNING lines in Flink logs
    (`... failed at host:port (attempt n of m, error 1205, ...); retrying`): counts by
    error number, e.g. `1205×3, 2013×12`."""
    counts: dict[str, int] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            if "on a new connection" in line and "retrying in" in line:
                found = re.search(r"attempt \d+ of \d+, (error \d+|no error number), (\w+)",
                                  line)
                what = (found.group(1).replace("error ", "") + " " + found.group(2)
                        if found else "?")
                counts[what] = counts.get(what, 0) + 1
    return ", ".join(f"{k}×{v}" for k, v in sorted(counts.items())) or "none"


def fenced_errors(logs: list[Path]) -> int:
    """Lines of Flink logs that report pyflink_ndb's FencedError (a superseded attempt
    stopped at its next write)."""
    return sum(line.count("FencedError") for log in logs
               for line in log.read_text(errors="replace").splitlines())


def drop_namespace(url: str, namespace: str) -> None:
    store = open_store(from_flink_keys({"state.backend.ndb.url": url,
                                        "state.backend.ndb.namespace": namespace}))
    try:
        store.drop_tables()
    finally:
        store.close()
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {namespace}_faults_scratch")
    finally:
        conn.close()


# -- the job on a MiniCluster, in a subprocess ---------------------------------------------
class MiniJob:
    """`python tests/faults/seqjob.py ARGS` in its own process group (the MiniCluster's
    JVM included), output to `log`; killed with the group when it hangs."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        #: The MiniCluster's own log (Flink's and pyflink_ndb's lines), not the wheel's
        #: shared pyflink/log/.
        self.log_dir = log.with_suffix(".flink-log")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._out = open(log, "w")  # noqa: SIM115 (closed in wait/kill)
        env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep
               + os.environ.get("PATH", ""), "FLINK_LOG_DIR": str(self.log_dir),
               "PYTHONWARNINGS": "ignore:pkg_resources is deprecated:UserWarning"}
        self.proc = subprocess.Popen([sys.executable, str(SEQJOB), *args], cwd=ROOT, env=env,
                                     stdout=self._out, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job did not end in {timeout_s:.0f} s (killed); log "
                                 f"{self.log}:\n{self.tail()}") from None
        finally:
            self._out.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._out.close()

    def logs(self) -> list[Path]:
        return sorted(self.log_dir.glob("*.log"))

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


# -- the database --------------------------------------------------------------------------
def connect(url: str, autocommit: bool = True) -> pymysql.connections.Connection:
    args = parse_mysql_url(url)
    return pymysql.connect(host=args["host"], port=args["port"], user=args["user"],
                           password=args["password"] or "", database=args["database"],
                           charset="utf8mb4", autocommit=autocommit, connect_timeout=5)


class FaultProxy(TcpProxy):
    """The test proxy, plus the local ports of its upstream connections (what the server's
    processlist shows as the job's client ports)."""

    def upstream_ports(self) -> set[int]:
        with self._lock:
            links = list(self._links)
        ports = set()
        for link in links:
            if link.upstream is not None:
                with contextlib.suppress(OSError):
                    ports.add(link.upstream.getsockname()[1])
        return ports

    def url(self, server_url: str) -> str:
        args = parse_mysql_url(server_url)
        return f"mysql://{args['user']}@127.0.0.1:{self.port}/{args['database']}"


def kill_connections(server_url: str, proxy: FaultProxy) -> int:
    """`KILL` every server session of the job (those the proxy forwards); returns how
    many."""
    ports = proxy.upstream_ports()
    conn = connect(server_url)
    killed = 0
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT ID, HOST FROM information_schema.PROCESSLIST")
            for session_id, host in cur.fetchall():
                port = str(host or "").rsplit(":", 1)[-1]
                if port.isdigit() and int(port) in ports:
                    with contextlib.suppress(pymysql.err.MySQLError):
                        cur.execute(f"KILL {int(session_id)}")
                        killed += 1
    finally:
        conn.close()
    return killed


def operators_lock_waiters(cur: Any, namespace: str) -> int:
    cur.execute("SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w JOIN "
                "information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id "
                "WHERE l.lock_table LIKE %s", (f"%{namespace}_operators%",))
    return int(cur.fetchone()[0])


def hold_operator_lock(server_url: str, namespace: str, hold_s: float) -> str:
    """A competing session locks the operator's owner row (`FOR UPDATE`) for `hold_s`:
    every fenced write, completion and claim of the job waits (past the server's
    innodb_lock_wait_timeout: they fail with error 1205 and are retried)."""
    conn = connect(server_url, autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(f"SELECT owners FROM {namespace}_operators WHERE operator = %s "
                        "FOR UPDATE", (OPERATOR_UID,))
            waited = 0
            end = time.monotonic() + hold_s
            while time.monotonic() < end:
                time.sleep(0.5)
                with contextlib.suppress(pymysql.err.MySQLError):
                    waited = max(waited, operators_lock_waiters(cur, namespace))
            conn.rollback()
            return f"held {hold_s:.0f} s, up to {waited} job transactions waited"
    except pymysql.err.OperationalError as err:
        if err.args[0] not in (1205, 1213):
            raise
        return f"the competitor could not take the lock ({err.args[0]})"
    finally:
        conn.close()


def provoke_deadlock(server_url: str, namespace: str, wait_s: float = 15.0) -> str:
    """A deadlock with the job's owner-row transaction: the competitor takes a shared lock
    on the owner row, waits until a job transaction (a completion or claim: INSERT IGNORE,
    then `FOR UPDATE`) queues behind it, then asks for the exclusive lock itself. The
    competitor first inserts rows into a scratch table so that InnoDB picks the job's
    lighter transaction as the victim (error 1213 there, which the job retries)."""
    conn = connect(server_url, autocommit=False)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {namespace}_faults_scratch "
                        "(id INT PRIMARY KEY, pad VARCHAR(100)) ENGINE=InnoDB")
            conn.commit()
            cur.execute("BEGIN")
            cur.executemany(f"REPLACE INTO {namespace}_faults_scratch VALUES (%s, %s)",
                            [(i, "x" * 100) for i in range(200)])
            cur.execute(f"SELECT owners FROM {namespace}_operators WHERE operator = %s "
                        "LOCK IN SHARE MODE", (OPERATOR_UID,))
            end = time.monotonic() + wait_s
            while time.monotonic() < end and not operators_lock_waiters(cur, namespace):
                time.sleep(0.02)
            else:
                if time.monotonic() >= end:
                    conn.rollback()
                    return "no job transaction queued: no deadlock"
            cur.execute(f"UPDATE {namespace}_operators SET updated_ms = updated_ms "
                        "WHERE operator = %s", (OPERATOR_UID,))
            conn.rollback()
            return "deadlock: the job's transaction was the victim"
    except pymysql.err.OperationalError as err:
        if err.args[0] not in (1205, 1213):
            raise
        # The competitor lost (a deadlock or lock wait of its own, at any statement).
        return f"the competitor was the victim ({err.args[0]})"
    finally:
        conn.close()


# -- the standalone cluster ----------------------------------------------------------------
class Cluster:
    """scripts/cluster.sh with its own folder and ports, `taskmanagers` TaskManagers and
    `extra_conf` (e.g. a low heartbeat timeout); `ha`: ZooKeeper high availability
    (FLINK_HA=zookeeper: cluster.sh starts a ZooKeeper server of its own), so that a
    JobManager started after one was killed recovers the running jobs."""

    def __init__(self, directory: Path, rest_port: int, rpc_port: int, taskmanagers: int,
                 slots: int, extra_conf: dict[str, str], ha: bool = False) -> None:
        self.directory = directory
        self.rest = f"http://localhost:{rest_port}"
        self.taskmanagers = taskmanagers
        self.ha = ha
        self.env = {**os.environ,
                    "PATH": str(Path(sys.executable).parent) + os.pathsep
                    + os.environ.get("PATH", ""),
                    "VENV": str(Path(sys.executable).parent.parent),
                    "CLUSTER_DIR": str(directory), "FLINK_REST_PORT": str(rest_port),
                    "FLINK_RPC_PORT": str(rpc_port), "FLINK_TASK_SLOTS": str(slots),
                    "FLINK_TASKMANAGERS": str(taskmanagers), "CLUSTER_TIMEOUT_S": "120",
                    "FLINK_EXTRA_CONF": "\n".join(f"{k}: {v}" for k, v in extra_conf.items()),
                    "FLINK_HA": "zookeeper" if ha else "none",
                    "PYTHONWARNINGS": "ignore:pkg_resources is deprecated:UserWarning"}
        self.stopped: set[int] = set()

    def script(self, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(ROOT / "scripts" / "cluster.sh"), *args],
                              env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)

    @contextlib.contextmanager
    def running(self) -> Iterator[Cluster]:
        self.script("down", timeout=90)
        try:
            up = self.script("up", timeout=180)
            assert up.returncode == 0, f"cluster up failed:\n{up.stdout}{up.stderr}"
            say(up.stdout.strip())
            yield self
        finally:
            for pid in list(self.stopped):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            self.script("down", timeout=90)
            # Any TaskManager, JobManager or ZooKeeper server that stop-cluster.sh missed.
            for pid in self.tm_pids() + self.jm_pids() + self.pids("zookeeper"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.rest + path, timeout=5) as response:
            return json.load(response)

    def tm_pids(self) -> list[int]:
        """Live TaskManager processes of this cluster (from its pid files)."""
        return self.pids("taskexecutor")

    def jm_pids(self) -> list[int]:
        """Live JobManager processes (StandaloneSessionClusterEntrypoint) of this cluster."""
        return self.pids("standalonesession")

    def pids(self, daemon: str) -> list[int]:
        """Live processes of `daemon` (flink-daemon.sh's name) from the pid files."""
        pids = []
        for f in (self.directory / "pid").glob(f"*{daemon}*.pid"):
            for line in f.read_text().split():
                if line.isdigit() and Path(f"/proc/{line}").exists():
                    with contextlib.suppress(OSError):
                        state = Path(f"/proc/{line}/stat").read_text().split()[2]
                        if state != "Z":
                            pids.append(int(line))
        return pids

    def wait_gone(self, pid: int, timeout_s: float = 15) -> None:
        """Wait until the killed process `pid` is gone (not counted as live any more)."""
        end = time.time() + timeout_s
        while pid in self.tm_pids() + self.jm_pids() and time.time() < end:
            time.sleep(0.1)

    def start_jobmanager(self) -> None:
        """A new JobManager (`cluster.sh jobmanager start`, as start-cluster.sh starts
        one): with `ha` it takes the leadership and recovers the jobs from ZooKeeper and
        high-availability.storageDir."""
        done = self.script("jobmanager", "start", timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr

    def registered(self) -> int:
        try:
            return int(self.get("/overview")["taskmanagers"])
        except OSError:
            return 0

    def ensure_taskmanagers(self, timeout_s: float = 120, wait: bool = True) -> None:
        """Start TaskManagers until `taskmanagers` live ones run and (`wait`) are
        registered; one that runs but does not register within 20 s (a zombie woken up
        that did not come back) gets a replacement too."""
        end = time.time() + timeout_s
        started = time.time()
        while True:
            live = [p for p in self.tm_pids() if p not in self.stopped]
            registered = self.registered()
            missing = self.taskmanagers - len(live)
            if wait and missing <= 0 and registered < self.taskmanagers \
                    and time.time() - started > 20:
                missing = 1
            for _ in range(max(0, missing)):
                done = self.script("taskmanager", "start", timeout=60)
                assert done.returncode == 0, done.stdout + done.stderr
                started = time.time()
            if not wait or registered >= self.taskmanagers:
                return
            if time.time() > end:
                raise AssertionError(f"{registered} TaskManagers registered after "
                                     f"{timeout_s:.0f} s, wanted {self.taskmanagers}")
            time.sleep(0.5)

    def flink(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return self.script("flink", *args, timeout=timeout)

    def submit(self, job_args: list[str], savepoint: str | None = None) -> str:
        """`flink run -d` (detached): the job id."""
        extra = ["-s", savepoint] if savepoint else []
        done = self.flink("run", "-d", *extra, "-py", str(SEQJOB), *job_args)
        found = re.search(r"JobID ([0-9a-f]{32})", done.stdout + done.stderr)
        assert found, f"flink run failed:\n{(done.stdout + done.stderr)[-3000:]}"
        return found.group(1)

    def state(self, jid: str) -> str:
        try:
            return str(self.get(f"/jobs/{jid}")["state"])
        except OSError:
            return "UNKNOWN"

    def wait_state(self, jid: str, states: set[str], timeout_s: float) -> str:
        end = time.time() + timeout_s
        state = self.state(jid)
        while state not in states and time.time() < end:
            time.sleep(0.5)
            state = self.state(jid)
        return state

    def stop_with_savepoint(self, jid: str, target: Path) -> str:
        done = self.flink("stop", "--savepointPath", target.as_uri(), jid, timeout=180)
        out = done.stdout + done.stderr
        found = re.search(r"Savepoint completed\. Path: (\S+)", out)
        assert done.returncode == 0 and found, f"flink stop failed:\n{out[-3000:]}"
        return found.group(1)

    def cancel(self, jid: str) -> None:
        self.flink("cancel", jid, timeout=60)


def task_pids(events_path: Path, after_s: float = 0.0) -> tuple[int, set[int]]:
    """The attempt that opened last (after `after_s`) and the processes (the TaskManagers)
    its subtasks run in: the subtasks that opened with its number within 20 s before it
    (attempt numbers start at 0 again when a JobManager recreates the job, see
    :func:`new_attempt`)."""
    opens = sorted((e for e in read_events(events_path)
                    if e["event"] == "open" and e["t"] >= after_s), key=lambda e: e["t"])
    if not opens:
        return -1, set()
    last = opens[-1]
    return last["attempt"], {int(e["pid"]) for e in opens if e["attempt"] == last["attempt"]
                             and e["t"] >= last["t"] - 20}


def wait_new_attempt(events_path: Path, attempt: int, after_s: float, timeout_s: float,
                     exclude_pid: int | None = None) -> bool:
    """Wait until an attempt that started after the fault at `after_s`, which failed
    `attempt`, processed a record (in a process other than `exclude_pid`; see
    :func:`new_attempt`)."""
    end = time.time() + timeout_s
    while time.time() < end:
        for e in read_events(events_path):
            if (e["event"] == "first_record" and e["pid"] != exclude_pid
                    and new_attempt(e, attempt, after_s)):
                return True
        time.sleep(0.2)
    return False
