"""The fault runs: each starts the checkable job (pyflink_ndb.faults) on a fresh namespace,
injects its faults at random points, lets the job finish and compares the committed
state with the model. One run batches many faults.

* :func:`crash_run` — a MiniCluster job (subprocess) whose function crashes at random
  points of its first attempts (pyflink_ndb.faults.RandomCrashes: at open after the
  restore's claim, after N records, while the background writer writes an epoch, right
  after a completion while garbage collection runs), plus bad records mid-stream (an
  unpicklable value, a value over `value.max-bytes`) that the driver fixes in the input
  file once the job failed on them; the job's restart recovers.
* :func:`db_run` — a MiniCluster job whose database URL is a TcpProxy in front of the
  shared server: server-side KILL of its sessions, outages of 10 s and 60 s (proxy
  stopped: refused; black-holed: a partition), a competing session holding the owner row
  (lock waits, lock-wait timeouts past innodb_lock_wait_timeout) and deadlocks.
* :func:`cluster_run` — the standalone cluster with two TaskManagers: kill -9 of a
  TaskManager that runs the job's tasks, zombies (SIGSTOP past the heartbeat timeout,
  SIGCONT while the replacement runs), rescale by stop-with-savepoint 2→3→1 with a crash
  in the middle job; with ZooKeeper high availability (scripts/cluster.sh FLINK_HA), kill
  -9 of the JobManager, after which the driver starts a new one (as a supervisor would)
  that recovers the job from ZooKeeper and its latest completed checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pyflink_ndb.faults import (
    fix_bad_record,
    mark_bad_record,
    read_events,
    write_sequence_input,
)
from pyflink_ndb.stores.mysql import parse_mysql_url

from .harness import (
    Cluster,
    CommitWatcher,
    Fault,
    FaultProxy,
    MiniJob,
    RunResult,
    drop_namespace,
    fenced_errors,
    final_check,
    hold_operator_lock,
    kill_connections,
    provoke_deadlock,
    retry_errors,
    say,
    task_pids,
    wait_new_attempt,
)

#: `KEY=VALUE` options every job of the fault runs gets on top of its own
#: (`python -m tests.faults --set KEY=VALUE`, e.g. a run with `write.render-process`).
EXTRA_SETS: list[str] = []


def with_extra_sets(args: list[str]) -> list[str]:
    """`args` of the fault job with :data:`EXTRA_SETS` appended as `--set` options."""
    return args + [a for kv in EXTRA_SETS for a in ("--set", kv)]

CRASH_KINDS = {"open": "crash: at open, after the restore's claim",
               "records": "crash: after a random number of records",
               "writing": "crash: while the writer writes an epoch",
               "completed": "crash: right after a completion (GC running)"}
BAD_KINDS = {"unpicklable": "bad record: unpicklable value (SerializationError)",
             "oversized": "bad record: value over value.max-bytes (ValueTooLargeError)"}


def new_namespace(tag: str) -> str:
    return f"faults_{tag}_{uuid.uuid4().hex[:8]}"


# -- crashes inside the protocol, bad records ----------------------------------------------
def crash_run(url: str, work: Path, name: str, crashes: int, seed: int,
              bad_records: tuple[str, ...] = (), keys: int = 200,
              per_key: tuple[int, int] = (100, 200), throttle_ms: float = 0.5,
              max_records: int = 800, timeout_s: float = 900,
              run: RunResult | None = None) -> RunResult:
    """One MiniCluster job that crashes `crashes` times and meets `bad_records`; `run`
    collects its faults (also when it raises)."""
    run = run if run is not None else RunResult(name)
    started = time.time()
    ns = new_namespace("crash")
    work.mkdir(parents=True, exist_ok=True)
    data, events, control = work / f"{name}.in", work / f"{name}.events", work / f"{name}.ctl"
    model = write_sequence_input(data, keys, *per_key, seed=seed)
    total = sum(model.values())
    bad_lines: dict[int, str] = {}
    for i, flag in enumerate(bad_records):
        line = int(total * (0.5 + 0.35 * i / max(1, len(bad_records))))
        mark_bad_record(data, line, flag)
        bad_lines[line] = flag
    control.write_text(str(throttle_ms))
    events.unlink(missing_ok=True)
    say(f"{name}: {total} records, {keys} keys, {crashes} crashes, bad records "
        f"{list(bad_records)}, namespace {ns}")
    args = ["--input", str(data), "--url", url, "--namespace", ns, "--parallelism", "2",
            "--checkpoint-ms", "400", "--events", str(events), "--control", str(control),
            "--crashes", str(crashes), "--seed", str(seed), "--max-records", str(max_records),
            "--restart-attempts", str(crashes + 8 * len(bad_records) + 10),
            "--restart-delay-ms", "500", "--oversize-bytes", str(1 << 16),
            "--set", "state.backend.ndb.value.max-bytes=8192",
            "--set", "state.backend.ndb.cache.max-entries=100"]
    try:
        with CommitWatcher(url, ns) as watcher:
            job = MiniJob(with_extra_sets(args), work / f"{name}.log")
            seen_crashes = 0
            fixed: dict[str, Fault] = {}
            try:
                while job.alive() and time.time() - started < timeout_s:
                    evs = read_events(events)
                    for e in [e for e in evs if e["event"] == "crash"][seen_crashes:]:
                        run.faults.append(Fault(CRASH_KINDS[e["mode"]], e["t"], e["t"],
                                                detail=f"attempt {e['attempt']}, "
                                                f"{e['records']} records",
                                                failed_attempt=e["attempt"], events=events))
                        seen_crashes += 1
                    for e in evs:
                        if e["event"] == "error" and e["flag"] not in fixed:
                            line = next(n for n, f in bad_lines.items() if f == e["flag"])
                            fix_bad_record(data, line)
                            fault = Fault(BAD_KINDS[e["flag"]], e["t"], time.time(),
                                          detail=f"{e['error']}: {e['message']}")
                            fixed[e["flag"]] = fault
                            run.faults.append(fault)
                            say(f"{name}: bad record failed the job with {e['error']}: "
                                f"{e['message'][:160]}; input fixed")
                    time.sleep(0.1)
                rc = job.wait(max(10.0, timeout_s - (time.time() - started)))
            finally:
                job.kill()
            assert rc == 0, f"{name}: the job failed ({rc}):\n{job.tail()}"
            run.notes.append(f"{name}: store retries by error: {retry_errors(job.logs())}; "
                             f"FencedError lines: {fenced_errors(job.logs())}")
            failures = sum(1 for e in read_events(events) if e["event"] == "error")
            if bad_records:
                run.notes.append(f"{name}: the bad records failed {failures} attempts "
                                 "before their fix was read")
            time.sleep(0.5)
        watcher.settle(run.faults)
        final_check(url, ns, model, run, watcher)
    finally:
        drop_namespace(url, ns)
    run.seconds = time.time() - started
    return run


# -- the database ---------------------------------------------------------------------------
@dataclass
class DbPlan:
    kills: int = 3
    outages_10s: int = 1
    outages_60s: int = 1
    lock_waits: int = 1
    lock_timeouts: int = 1
    deadlocks: int = 2
    #: The first 60 s outage refuses connections (else it is a partition).
    refused_60s_first: bool = False

    def steps(self, rng: random.Random) -> list[str]:
        steps = (["kill"] * self.kills + ["outage10"] * self.outages_10s
                 + ["outage60"] * self.outages_60s + ["lockwait"] * self.lock_waits
                 + ["locktimeout"] * self.lock_timeouts + ["deadlock"] * self.deadlocks)
        rng.shuffle(steps)
        return steps

    def seconds(self) -> float:
        return (self.kills * 4 + self.outages_10s * 16 + self.outages_60s * 75
                + self.lock_waits * 10 + self.lock_timeouts * 62 + self.deadlocks * 8)


#: Retries long enough for a 60 s outage: the checkpoint waits instead of failing. The
#: socket timeout exceeds the server's innodb_lock_wait_timeout (50 s), so that a lock held
#: longer fails the job's waiting statement with error 1205 (a shorter socket timeout gives
#: up first, with error 2013, while the server session keeps waiting).
DB_OPTIONS = {"state.backend.ndb.db.retry.deadline-ms": "150000",
              "state.backend.ndb.db.retry.max-attempts": "500",
              "state.backend.ndb.db.retry.max-backoff-ms": "2000",
              "state.backend.ndb.db.socket-timeout-ms": "55000"}


def db_run(server_url: str, work: Path, name: str, plan: DbPlan, seed: int,
           keys: int = 200, throttle_ms: float = 8.0,
           options: dict[str, str] | None = None, run: RunResult | None = None
           ) -> RunResult:
    """One MiniCluster job behind a proxy, meeting the database faults of `plan` in random
    order; `options`: its `state.backend.ndb.db.*` keys (default :data:`DB_OPTIONS`)."""
    run = run if run is not None else RunResult(name)
    started = time.time()
    rng = random.Random(seed)
    ns = new_namespace("db")
    work.mkdir(parents=True, exist_ok=True)
    data, events, control = work / f"{name}.in", work / f"{name}.events", work / f"{name}.ctl"
    rate = 1000 / throttle_ms
    per_key = max(10, int(rate * (plan.seconds() + 40) * 1.6 / keys))
    model = write_sequence_input(data, keys, per_key // 2, per_key * 3 // 2, seed=seed)
    control.write_text(str(throttle_ms))
    events.unlink(missing_ok=True)
    server = parse_mysql_url(server_url)
    with FaultProxy(server["host"], server["port"]) as proxy:
        url = proxy.url(server_url)
        say(f"{name}: {sum(model.values())} records, plan {plan}, job url {url}, "
            f"namespace {ns}")
        args = ["--input", str(data), "--url", url, "--namespace", ns, "--parallelism", "2",
                "--checkpoint-ms", "500", "--events", str(events), "--control", str(control),
                "--restart-attempts", "30", "--restart-delay-ms", "1000"]
        for key, value in (DB_OPTIONS if options is None else options).items():
            args += ["--set", f"{key}={value}"]
        try:
            with CommitWatcher(server_url, ns) as watcher:
                job = MiniJob(with_extra_sets(args), work / f"{name}.log")
                try:
                    _db_faults(server_url, ns, proxy, watcher, job, plan, rng, run)
                    control.write_text("0")
                    rc = job.wait(600)
                finally:
                    job.kill()
                assert rc == 0, f"{name}: the job failed ({rc}):\n{job.tail()}"
                time.sleep(0.5)
            watcher.settle(run.faults)
            restarts = max((e["attempt"] for e in read_events(events) if e["event"] == "open"),
                           default=0)
            retries = sum(max((e["retries"] for e in read_events(events)
                               if e["event"] == "progress" and e["subtask"] == s
                               and e["attempt"] == restarts), default=0) for s in (0, 1))
            run.notes.append(f"{name}: the job restarted {restarts} times; its store "
                             f"connections retried {retries} transactions (last attempt); "
                             f"retries by error (number, class): {retry_errors(job.logs())}")
            final_check(server_url, ns, model, run, watcher)
        finally:
            drop_namespace(server_url, ns)
    run.seconds = time.time() - started
    return run


def _db_faults(server_url: str, ns: str, proxy: FaultProxy, watcher: CommitWatcher,
               job: MiniJob, plan: DbPlan, rng: random.Random, run: RunResult) -> None:
    deadline = time.time() + 120
    while watcher.latest() == 0:  # the first checkpoint: the owner row exists
        assert job.alive() and time.time() < deadline, f"no checkpoint:\n{job.tail()}"
        time.sleep(0.2)
    outages = {"outage10": 0, "outage60": 0}  # 10 s: refused, partition, ...; 60 s: the other way
    for step in plan.steps(rng):
        if not job.alive():
            run.notes.append(f"{run.name}: the job ended before step {step}")
            break
        time.sleep(rng.uniform(0.3, 2.0))
        t0 = time.time()
        if step == "kill":
            n = kill_connections(server_url, proxy)
            fault = Fault("db: server-side KILL of the job's sessions", t0, time.time(),
                          detail=f"{n} sessions")
        elif step in ("outage10", "outage60"):
            seconds = 10 if step == "outage10" else 60
            n = outages[step] + (1 if step == "outage60" and plan.refused_60s_first else 0)
            outages[step] += 1
            mode = "refused" if (step == "outage10") == (n % 2 == 0) else "partition"
            if mode == "refused":
                proxy.stop()
            else:
                proxy.set_black_hole(True)
            time.sleep(seconds)
            if mode == "refused":
                proxy.start()
            else:
                proxy.set_black_hole(False)
            fault = Fault(f"db: outage {seconds} s", t0, time.time(), detail=mode)
        elif step == "lockwait":
            hold = rng.uniform(3, 8)
            detail = hold_operator_lock(server_url, ns, hold)
            fault = Fault("db: owner row locked by another session (lock wait)", t0,
                          time.time(), detail=detail)
        elif step == "locktimeout":
            detail = hold_operator_lock(server_url, ns, 56)
            fault = Fault("db: lock-wait timeout (owner row locked 56 s)", t0, time.time(),
                          detail=detail)
        else:
            outcomes = []
            for _ in range(3):
                outcomes.append(provoke_deadlock(server_url, ns, wait_s=5))
                if "job's transaction" in outcomes[-1]:
                    break
            kind = ("db: deadlock with a competing session" if "job's transaction"
                    in outcomes[-1] else "db: owner row locked by another session (lock wait)")
            fault = Fault(kind, t0, time.time(), detail="; ".join(outcomes))
        run.faults.append(fault)
        recovered = watcher.wait_recovered(fault, 180, job.alive)
        say(f"{run.name}: {fault.kind} ({fault.detail}): "
            + (f"recovered in {fault.recovery_s:.1f} s" if recovered else "NOT recovered"))


# -- the standalone cluster ------------------------------------------------------------------
@dataclass
class Stage:
    """One job of the cluster run: its parallelism, a crash of its first attempt, and the
    faults injected while it runs, in random order: TaskManager kill -9, zombie, and
    JobManager kill -9 (`jm_kills`; the cluster runs with ZooKeeper HA then). Not both
    `crash` and `jm_kills`: the job a new JobManager recovers counts attempts from 0
    again, so its first attempt would crash once more."""

    parallelism: int
    crash: bool = False
    kills: int = 0
    zombies: int = 0
    jm_kills: int = 0

    def __post_init__(self) -> None:
        assert not (self.crash and self.jm_kills), "a crash stage has no JobManager kill"


@dataclass
class ClusterPlan:
    stages: list[Stage] = field(default_factory=lambda: [
        Stage(2, kills=2, zombies=1), Stage(3, crash=True), Stage(1)])

    def seconds(self) -> float:
        """Seconds of processing the faults need (the input is sized from it): a
        JobManager kill takes the job down while it recovers, so it needs few records."""
        return sum(25 + s.kills * 20 + s.zombies * 30 + s.jm_kills * 10
                   + (25 if s.crash else 0) for s in self.stages)

    @property
    def ha(self) -> bool:
        """ZooKeeper HA: the plan kills the JobManager."""
        return any(s.jm_kills for s in self.stages)


CLUSTER_CONF = {"heartbeat.timeout": "5000", "heartbeat.interval": "1000",
                "cluster.evenly-spread-out-slots": "true",
                "jobmanager.execution.failover-strategy": "region",
                "taskmanager.memory.process.size": "1400m",
                "jobmanager.memory.process.size": "1200m"}


def cluster_run(url: str, work: Path, name: str, plan: ClusterPlan, seed: int,
                keys: int = 200, throttle_ms: float = 4.0,
                run: RunResult | None = None) -> RunResult:
    run = run if run is not None else RunResult(name)
    started = time.time()
    rng = random.Random(seed)
    ns = new_namespace("cluster")
    work.mkdir(parents=True, exist_ok=True)
    data, control = work / f"{name}.in", work / f"{name}.ctl"
    rate = 1000 / throttle_ms
    per_key = max(10, int(rate * plan.seconds() * 2.0 / keys))
    model = write_sequence_input(data, keys, per_key // 2, per_key * 3 // 2, seed=seed)
    cluster = Cluster(Path(__file__).resolve().parent.parent.parent / "var" / "cluster-faults",
                      28081, 26123, taskmanagers=2, slots=2, extra_conf=CLUSTER_CONF,
                      ha=plan.ha)
    say(f"{name}: {sum(model.values())} records, stages {plan.stages}, namespace {ns}")
    try:
        with cluster.running(), CommitWatcher(url, ns) as watcher:
            savepoint: str | None = None
            stop_fault: Fault | None = None
            for i, stage in enumerate(plan.stages):
                final = i == len(plan.stages) - 1
                events = work / f"{name}.stage{i}.events"
                events.unlink(missing_ok=True)
                control.write_text("0" if final and not (stage.kills or stage.zombies
                                                         or stage.jm_kills or stage.crash)
                                   else str(throttle_ms))
                cluster.ensure_taskmanagers()
                args = ["--input", str(data), "--url", url, "--namespace", ns,
                        "--parallelism", str(stage.parallelism), "--checkpoint-ms", "500",
                        "--events", str(events), "--control", str(control),
                        "--crashes", "1" if stage.crash else "0", "--seed", str(seed + i),
                        "--max-records", "400", "--modes", "records,writing,completed",
                        "--restart-attempts", "100", "--restart-delay-ms", "1000",
                        "--set", "state.backend.ndb.on-fresh-start=fail"]
                if savepoint:
                    # Works around pyflink_ndb/api/stream.py's client check, which looks for
                    # the deprecated key only: `flink run -s` sets
                    # execution.state-recovery.path (Flink 1.20), so the check would refuse
                    # the restore with NamespaceInUseError under on-fresh-start=fail.
                    args += ["--set", f"execution.savepoint.path={savepoint}"]
                jid = cluster.submit(with_extra_sets(args), savepoint)
                say(f"{name}: stage {i} (parallelism {stage.parallelism}) job {jid}"
                    + (f" from {savepoint}" if savepoint else ""))
                if stop_fault is not None:
                    watcher.wait_recovered(stop_fault, 120)
                    stop_fault = None
                _wait_commit(watcher, cluster, jid)
                if stage.crash:
                    _stage_crash(cluster, jid, events, watcher, run, stage)
                steps = (["kill"] * stage.kills + ["zombie"] * stage.zombies
                         + ["jmkill"] * stage.jm_kills)
                rng.shuffle(steps)
                for step in steps:
                    if cluster.state(jid) != "RUNNING":
                        run.notes.append(f"{name}: job {jid} was {cluster.state(jid)} "
                                         f"before a {step}")
                        break
                    time.sleep(rng.uniform(1.0, 3.0))
                    if step == "jmkill":
                        _jm_fault(cluster, jid, events, watcher, run)
                    else:
                        _tm_fault(step, cluster, events, watcher, run, rng)
                    cluster.ensure_taskmanagers()
                if final:
                    control.write_text("0")
                    state = cluster.wait_state(jid, {"FINISHED", "FAILED", "CANCELED"}, 900)
                    assert state == "FINISHED", f"{name}: the last job ended {state}"
                else:
                    nxt = plan.stages[i + 1].parallelism
                    t0 = time.time()
                    savepoint = cluster.stop_with_savepoint(jid, work / "savepoints")
                    stop_fault = Fault("rescale: stop-with-savepoint, restore at another "
                                       "parallelism", t0, time.time(),
                                       detail=f"{stage.parallelism} → {nxt}")
                    run.faults.append(stop_fault)
            time.sleep(1.0)
            watcher.settle(run.faults)
            tm_logs = sorted((cluster.directory / "log").glob("*taskexecutor*.log"))
            run.notes.append(f"{name}: FencedError lines in the TaskManager logs: "
                             f"{fenced_errors(tm_logs)}; store retries by error: "
                             f"{retry_errors(tm_logs)}")
        final_check(url, ns, model, run, watcher)
    finally:
        drop_namespace(url, ns)
    run.seconds = time.time() - started
    return run


def _wait_commit(watcher: CommitWatcher, cluster: Cluster, jid: str) -> None:
    before = watcher.latest()
    end = time.time() + 180
    while watcher.latest() <= before:
        state = cluster.state(jid)
        assert state in ("RUNNING", "CREATED", "INITIALIZING", "RESTARTING", "UNKNOWN"), (
            f"job {jid} is {state}")
        assert time.time() < end, f"job {jid}: no checkpoint committed in 180 s"
        time.sleep(0.3)


def _stage_crash(cluster: Cluster, jid: str, events: Path, watcher: CommitWatcher,
                 run: RunResult, stage: Stage) -> None:
    end = time.time() + 180
    while time.time() < end:
        crashes = [e for e in read_events(events) if e["event"] == "crash"]
        if crashes:
            e = crashes[0]
            fault = Fault("rescale: crash of the rescaled job between savepoints", e["t"],
                          e["t"], detail=f"{e['mode']} at parallelism {stage.parallelism}",
                          failed_attempt=e["attempt"], events=events)
            run.faults.append(fault)
            watcher.wait_recovered(fault, 120)
            return
        time.sleep(0.3)
    raise AssertionError(f"job {jid}: the planned crash did not happen in 180 s")


JM_KILL = "JobManager kill -9 (ZooKeeper HA)"


def _jm_fault(cluster: Cluster, jid: str, events: Path, watcher: CommitWatcher,
              run: RunResult) -> None:
    """kill -9 of the JobManager (at a random point: the caller sleeps 1-3 s), then a new one
    (`jobmanager.sh start`, at once, as a supervisor restarts a process): it becomes the
    leader once the killed one's ZooKeeper session expired (10 s), recovers the job graph
    and the latest completed checkpoint from ZooKeeper and high-availability.storageDir,
    and the TaskManagers register with it. The recovery is the first checkpoint committed
    by an attempt that opened after the kill."""
    live = cluster.jm_pids()
    assert len(live) == 1, f"JobManagers running: {live}"
    attempt, _ = task_pids(events)
    t0 = time.time()
    os.kill(live[0], signal.SIGKILL)
    cluster.wait_gone(live[0])
    fault = Fault(JM_KILL, t0, t0, detail=f"pid {live[0]}, attempt {attempt}",
                  failed_attempt=-1, events=events)
    run.faults.append(fault)
    cluster.start_jobmanager()
    rest_s = running_s = None
    end = time.time() + 180
    while time.time() < end and running_s is None:
        state = cluster.state(jid)
        if state != "UNKNOWN" and rest_s is None:
            rest_s = time.time() - t0
        if state == "RUNNING":
            running_s = time.time() - t0
        elif state in ("FAILED", "CANCELED", "FINISHED"):
            raise AssertionError(f"job {jid} is {state} after the JobManager kill")
        time.sleep(0.2)
    fault.detail += (f"; new JobManager's REST API: job listed after "
                     f"{rest_s or float('nan'):.1f} s, RUNNING after "
                     f"{running_s or float('nan'):.1f} s")
    recovered = watcher.wait_recovered(fault, 180)
    say(f"{run.name}: {fault.kind} ({fault.detail}): "
        + (f"recovered in {fault.recovery_s:.1f} s" if recovered else "NOT recovered"))


def _tm_fault(step: str, cluster: Cluster, events: Path, watcher: CommitWatcher,
              run: RunResult, rng: random.Random) -> None:
    attempt, pids = task_pids(events)
    live = [p for p in pids if p in cluster.tm_pids()]
    assert live, f"no live TaskManager runs the job's tasks (events {events})"
    victim = rng.choice(sorted(live))
    t0 = time.time()
    if step == "kill":
        os.kill(victim, signal.SIGKILL)
        cluster.wait_gone(victim)
        fault = Fault("TaskManager kill -9 (2 TaskManagers)", t0, t0,
                      detail=f"pid {victim}, attempt {attempt}", failed_attempt=attempt,
                      events=events)
        run.faults.append(fault)
        # A supervisor starts a replacement at once; a job that no longer fits on the
        # survivor (3 subtasks, 2 slots) waits for it.
        cluster.ensure_taskmanagers(wait=False)
        recovered = watcher.wait_recovered(fault, 180)
    else:
        os.kill(victim, signal.SIGSTOP)
        cluster.stopped.add(victim)
        fault = Fault("zombie TaskManager (SIGSTOP past heartbeat timeout, SIGCONT)", t0,
                      t0, detail=f"pid {victim}, attempt {attempt}", failed_attempt=attempt,
                      events=events)
        run.faults.append(fault)
        try:
            replaced = wait_new_attempt(events, attempt, t0, 90, exclude_pid=victim)
            recovered = replaced and watcher.wait_recovered(fault, 90)
            time.sleep(rng.uniform(1.0, 3.0))  # the replacement runs; the zombie wakes up
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
            cluster.stopped.discard(victim)
        fault.detail += ("; replacement committed before SIGCONT" if recovered
                         else "; no replacement commit before SIGCONT")
        if not recovered:
            recovered = watcher.wait_recovered(fault, 120)
    say(f"{run.name}: {fault.kind} ({fault.detail}): "
        + (f"recovered in {fault.recovery_s:.1f} s" if recovered else "NOT recovered"))
