"""Issue 9's targets from one `make bench` run: each target, the run's figures and whether
they meet it, gathered from the parts that measure them (part 1 for workload a, part 7 for
b, part 8 for c, part 6 for the committed-state reads). Reported, never enforced: the
benchmark never fails the build.

The pyflink-ndb figure of each target is its default configuration on MariaDB (the stand-in
for RonDB here: `ndb-mariadb` in every part), against the best RocksDB configuration of the
same run and part: the highest records/s and, separately, the shortest median checkpoint
(full, incremental or, in part 7, unaligned incremental checkpoints).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The pyflink-ndb run each target reads (its defaults, on MariaDB).
NDB = "ndb-mariadb"
#: Reads of part 6 that are not a read of the state (the round trip's floor).
FLOOR_READS = ("floor", "floor_c", "floor_capi")
#: Prefixes of part 6's reads through the documented views (`NS_committed`,
#: `NS_committed_rows`); every other read of the state reads the state table.
VIEW_READS = ("view_", "rows_")
#: Prefix of part 6's models of what a view costs (bench.reads.model_views): reads that no
#: user is told to make, in neither row.
MODEL_READS = "model_"
READS_PER_S = 10_000
READ_P99_MS = 1.0


@dataclass(frozen=True)
class Target:
    """One target of the issue: `met` is None where the run lacks a figure it needs."""

    workload: str
    target: str
    measured: str
    met: bool | None


RECORDS_TARGET = "records/s ≥ 1.0× the best RocksDB"
CHECKPOINT_TARGET = "checkpoint ≤ RocksDB's (median end to end, shortest configuration)"


def _against_rocksdb(workload: str, mine: Mapping[str, Any] | None,
                     rocks: list[Mapping[str, Any]]) -> list[Target]:
    """A workload's records/s and checkpoint targets: `mine` (pyflink-ndb's run; None when
    it did not run) against the RocksDB run with the most records/s and, separately, the
    one with the shortest median checkpoint. A run's `label`, where it has one, names it."""
    rocks = [r for r in rocks if r.get("records_per_s")]
    if not mine or not mine.get("records_per_s") or not rocks:
        return [Target(workload, RECORDS_TARGET, "not measured", None)]

    def named(run: Mapping[str, Any]) -> str:
        return f" ({run['label']})" if run.get("label") else ""
    best = max(rocks, key=lambda r: r["records_per_s"])
    rate = mine["records_per_s"] / best["records_per_s"]
    out = [Target(workload, RECORDS_TARGET,
                  f"{mine['records_per_s']:,.0f} against {best['records_per_s']:,.0f}"
                  f"{named(best)} = {rate:.2f}×", rate >= 1.0)]
    timed = [r for r in rocks if r.get("e2e_median_ms")]
    if mine.get("e2e_median_ms") and timed:
        shortest = min(timed, key=lambda r: r["e2e_median_ms"])
        out.append(Target(workload, CHECKPOINT_TARGET,
                          f"{mine['e2e_median_ms']:,.0f} ms against "
                          f"{shortest['e2e_median_ms']:,.0f} ms{named(shortest)}",
                          mine["e2e_median_ms"] <= shortest["e2e_median_ms"]))
    return out


def _flight_zipf(tp: Mapping[str, Any]) -> list[Target]:
    """Workload (a): part 1's Zipf flight job."""
    runs = tp["runs"]
    return _against_rocksdb("(a) flight job, Zipf keys", runs.get(f"{NDB}/zipf"),
                            [r for k, r in runs.items()
                             if k.startswith("rocksdb") and k.endswith("/zipf")])


def _user_profile(profile: Mapping[str, Any]) -> list[Target]:
    """Workload (b): part 7's user-profile job (a run that failed has an `error`)."""
    runs = profile["runs"]
    return _against_rocksdb("(b) user-profile job", runs.get(NDB),
                            [r for k, r in runs.items()
                             if k.startswith("rocksdb") and "error" not in r])


def _recovery(rr: Mapping[str, Any]) -> list[Target]:
    """Workload (c): part 8's targets, computed there (`bench.recovery.derive`)."""
    t = (rr.get("targets") or {}).get(NDB)
    if not t:
        return [Target("(c) recovery", "failure → first record", "not measured", None)]
    sizes = rr["sizes"]
    out = []
    fr = t.get("first_record")
    if fr:
        vs = "–" if fr["vs_rocksdb"] is None else f"{fr['vs_rocksdb']:.2f}×"
        out.append(Target("(c) recovery", f"failure → first record at {sizes[-1]:,} keys "
                          f"≤ 1.2× the {sizes[0]:,}-key case and ≤ RocksDB's",
                          f"{fr['growth']:.2f}× the {sizes[0]:,}-key case; {vs} RocksDB",
                          fr["met"]))

    ratios = {str(n): (rr["runs"].get(f"{NDB}/{n}") or {}).get("ratios") or {}
              for n in sizes}

    def listed(metric: str) -> str:
        return ", ".join(f"{n:,} keys " + ("–" if ratios[str(n)].get(metric) is None
                                           else f"{ratios[str(n)][metric]:.2f}×")
                         for n in sizes)
    out.append(Target("(c) recovery", "failure → probe end ≤ 1.5× RocksDB's",
                      listed("failure_to_probe_end_s"), t["probe_end"]["met"]))
    out.append(Target("(c) recovery", "rescale via savepoint ≤ RocksDB's at every size",
                      listed("rescale_s"), t["rescale"]["met"]))
    return out


def _reads(reads: Mapping[str, Any]) -> list[Target]:
    """Committed-state reads (issue 9, item 5: "by primary key and through the documented
    view"): a row for the reads by primary key (on the state table, any client) and one for
    the reads through the views (`NS_committed`, `NS_committed_rows`), each from part 6's
    reads that answered every read correctly; both again for the same reads while part 6
    held a CPU latency request of 0 µs (bench/cpu_latency.py), where it could. A row is met
    when one of its reads meets both limits (else the fastest is shown)."""
    from bench.reads import LABELS

    def meets(q: Mapping[str, Any]) -> bool:
        return q["reads_per_s"] >= READS_PER_S and q["p99_ms"] <= READ_P99_MS

    held = reads.get("cpu_latency_us")
    settings = [("" if held is None else f" (CPU latency request {held} µs: the whole run)",
                 reads["queries"])]
    if reads.get("low_latency"):
        settings.append((" (CPU latency request 0 µs)", reads["low_latency"]["queries"]))
    out = []
    for setting, measured in settings:
        correct = {k: q for k, q in measured.items()
                   if k not in FLOOR_READS and not k.startswith(MODEL_READS)
                   and q.get("correct") == q["reads"]}
        floor = measured.get("floor")
        for how, of_kind in (("by primary key", lambda k: not k.startswith(VIEW_READS)),
                             ("through the documented views",
                              lambda k: k.startswith(VIEW_READS))):
            target = (f"≥ {READS_PER_S:,} point reads/s from one client, p99 ≤ "
                      f"{READ_P99_MS:g} ms, {how}{setting}")
            queries = {k: q for k, q in correct.items() if of_kind(k)}
            if not queries:
                out.append(Target("reads", target, "not measured", None))
                continue
            label, best = max(queries.items(),
                              key=lambda kv: (meets(kv[1]), kv[1]["reads_per_s"]))
            out.append(Target("reads", target,
                              f"{best['reads_per_s']:,.0f}/s, p99 {best['p99_ms']:.3f} ms "
                              f"({LABELS.get(label, label)})"
                              + ("" if not floor else
                                 f"; `SELECT 1` {floor['reads_per_s']:,.0f}/s"),
                              meets(best)))
    return out


def targets(results: Mapping[str, Any]) -> list[Target]:
    """Every target the parts of `results` (bench.run's `results` of results.json) measure;
    a part that did not run contributes nothing."""
    out: list[Target] = []
    if results.get("throughput"):
        out += _flight_zipf(results["throughput"])
    if results.get("profile"):
        out += _user_profile(results["profile"])
    if results.get("recovery_rescale"):
        out += _recovery(results["recovery_rescale"])
    if results.get("reads"):
        out += _reads(results["reads"])
    return out


def markdown(results: Mapping[str, Any]) -> list[str]:
    """The summary's section of the targets; empty when no part measures one."""
    rows = targets(results)
    if not rows:
        return []
    lines = ["## Issue 9's targets in this run", "",
             f"pyflink-ndb's defaults on MariaDB (`{NDB}`) against the best RocksDB "
             "configuration of the same part; reported, never enforced.", "",
             "| workload | target | measured | met |", "|---|---|---|---|"]
    for t in rows:
        met = "–" if t.met is None else "yes" if t.met else "**no**"
        lines.append(f"| {t.workload} | {t.target} | {t.measured} | {met} |")
    return lines + [""]
