"""The two variants of the fault runs and the results file.

`quick` (tests/test_faults.py, in `make test`): about 30 faults of every kind in three
jobs; `long` (`make faults`): 200+. The database run sleeps through most of its faults
(outages, held locks), so it runs in a thread beside the crash runs and the cluster run.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .harness import RunResult, say, table
from .scenarios import (
    DB_OPTIONS,
    EXTRA_SETS,
    ClusterPlan,
    DbPlan,
    Stage,
    cluster_run,
    crash_run,
    db_run,
)


@dataclass
class Variant:
    name: str
    #: (crashes, seed) per crash run; each run also meets the two bad records.
    crash_runs: list[tuple[int, int]]
    db: DbPlan
    cluster: ClusterPlan
    crash_keys: int = 200
    crash_per_key: tuple[int, int] = (100, 200)
    notes: list[str] = field(default_factory=list)


QUICK = Variant(
    "quick", crash_runs=[(14, 11)],
    db=DbPlan(kills=5, outages_10s=1, outages_60s=1, lock_waits=1, lock_timeouts=1,
              deadlocks=3),
    cluster=ClusterPlan([Stage(2, kills=2, zombies=1, jm_kills=1), Stage(3, crash=True),
                         Stage(1)]))

LONG = Variant(
    "long", crash_runs=[(30, 101), (30, 102), (30, 103), (30, 104)],
    crash_per_key=(200, 400),
    db=DbPlan(kills=30, outages_10s=4, outages_60s=2, lock_waits=6, lock_timeouts=2,
              deadlocks=8),
    cluster=ClusterPlan([Stage(2, kills=8, zombies=4, jm_kills=2),
                         Stage(3, crash=True, kills=2), Stage(1, kills=2, jm_kills=1),
                         Stage(2, kills=5, zombies=2, jm_kills=2), Stage(3, crash=True),
                         Stage(1, jm_kills=1)]))

VARIANTS = {v.name: v for v in (QUICK, LONG)}


def run_variant(variant: Variant, url: str, work: Path) -> list[RunResult]:
    """Every run of `variant`; the database run in a thread beside the others. A run that
    raises keeps the faults it injected, has no verdict and says why in its notes."""
    results: list[RunResult] = []

    def guarded(name: str, fn: Callable[[RunResult], RunResult]) -> None:
        run = RunResult(name)
        try:
            fn(run)
        except Exception as err:  # noqa: BLE001 (recorded: the run has no verdict)
            run.notes.append(f"{name}: THE RUN FAILED: {type(err).__name__}: "
                             f"{str(err)[:1500]}")
            say(f"{name} failed: {err}")
        results.append(run)

    db = threading.Thread(target=guarded, name="db-faults", args=(
        f"{variant.name}-db",
        lambda run: db_run(url, work, run.name, variant.db, seed=7, run=run)))
    db.start()
    for i, (crashes, seed) in enumerate(variant.crash_runs):
        guarded(f"{variant.name}-crash{i}", lambda run, c=crashes, s=seed: crash_run(
            url, work, run.name, c, s, ("unpicklable", "oversized"),
            keys=variant.crash_keys, per_key=variant.crash_per_key, run=run))
    guarded(f"{variant.name}-cluster", lambda run: cluster_run(
        url, work, run.name, variant.cluster, seed=13, run=run))
    db.join()
    return sorted(results, key=lambda r: r.name)


def write_results(results: list[RunResult], path: Path, variant: Variant,
                  seconds: float) -> str:
    faults = sum(len(r.faults) for r in results)
    db_options = ", ".join(f"`{k}={v}`" for k, v in DB_OPTIONS.items())
    lines = [
        f"# Fault-injection results ({variant.name} variant)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, "
        f"{os.cpu_count()} cores, {faults} faults in {len(results)} job runs, "
        f"{seconds / 60:.1f} minutes (`make faults`; tests/faults/)"
        + (f"; every job with {', '.join(f'`{kv}`' for kv in EXTRA_SETS)}."
           if EXTRA_SETS else "."),
        "",
        table(results),
        "",
        "* **records checked**: the records of the runs the kind was injected in (a run "
        "batches several kinds); the final committed state of every key is compared with "
        "the model (`count == last == N_k`): **lost** = records the state misses, "
        "**doubled** = records it counts twice. **mid-run checks**: committed checkpoints "
        "read while the job ran (`count == last` for every key), in parentheses those that "
        "were not exact.",
        "* **time to recover**: from the end of the fault (an outage: when the database "
        "answers again; a lock: when it is released; a crash, kill or SIGSTOP: the "
        "moment it happened; a rescale: when the savepoint completed) until the job "
        "committed a checkpoint newer than the last one committed then (polled every "
        "0.25 s).",
        *(["* **JobManager kill -9**: the cluster run's cluster has ZooKeeper high "
            "availability (`scripts/cluster.sh` with `FLINK_HA=zookeeper`: the ZooKeeper "
            "server that the apache-flink wheel bundles, on a port and data dir of its own; "
            "`high-availability.storageDir` and the checkpoints on local disk; ZooKeeper "
            "session timeout 10 s, suspended connections tolerated). The driver kills the "
            "JobManager (StandaloneSessionClusterEntrypoint) with SIGKILL and at once starts a "
            "new one "
            "(`cluster.sh jobmanager start`, as a supervisor would): it takes the leadership "
            "once the killed one's session expired, recovers the job from ZooKeeper and its "
            "latest completed checkpoint, and the TaskManagers register with it; recovered = "
            "a checkpoint committed by an attempt that opened after the kill."]
          if variant.cluster.ha else []),
        f"* Database options of the database run: {db_options}"
        " (the retry deadline exceeds a 60 s outage: the checkpoint waits, the job does "
        "not restart); the job's URL points at a TcpProxy in front of the shared MariaDB.",
        "",
        "## Runs",
        "",
        "| run | faults | records | lost | doubled | minutes |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        v = r.verdict
        lines.append(f"| {r.name} | {len(r.faults)} | {v.records if v else '-'} | "
                     f"{v.lost if v else '-'} | {v.doubled if v else '-'} | "
                     f"{r.seconds / 60:.1f} |")
    lines += ["", "## Notes", ""]
    lines += [f"* {n}" for r in results for n in r.notes]
    lines += ["", "## Every fault", "", "| run | kind | detail | recovery (s) |",
              "|---|---|---|---:|"]
    for r in results:
        for f in r.faults:
            rec = "not recovered" if f.recovery_s is None else f"{f.recovery_s:.1f}"
            detail = f.detail.replace("|", "/")[:200]
            lines.append(f"| {r.name} | {f.kind} | {detail} | {rec} |")
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    say(f"wrote {path}")
    return text
