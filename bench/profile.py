"""Bench part `profile` (`python -m bench.run --only profile`, part 7): issue 9's workload
(b), a "user profile" job.

A sequence source (NumberSequenceSource, parallelism 2) whose every number is mapped to a
user drawn from a Zipf law (s=1.1, numpy, fixed seed, :data:`KEY_SPACE` users), keyed by
user; a KeyedProcessFunction (:class:`UserProfile`) holds per user

* a ValueState `profile`: a dict of fields plus padding (about 400 bytes pickled), read
  and rewritten for every record;
* a MapState `last_seen` with TTL (StateTtlConfig, 1 h, updated on create and write, never
  returns expired): the last-seen time per event type (at most 8 entries);
* a ListState `recent`: every event is appended; once it holds more than
  :data:`LIST_MAX` events it is trimmed to the last :data:`LIST_KEEP` (read and update);

about 1 KB of state per user (:func:`state_bytes`). pyflink-ndb runs with
`cache.max-entries` :data:`CACHE_ENTRIES` per subtask: the users seen in a run are more
than 10× that (counted by the job; each user is 3-20 cache entries).

Each backend runs in a fresh Python process of its own (`python -c "from bench.profile
import child; child()"`), hence a fresh JVM: the peak resident set (VmHWM) of the JVM is
the peak of that backend alone. In a local MiniCluster the JVM that PyFlink starts holds
the JobManager, the TaskManager and, in thread mode (PEMJA), the embedded CPython that
runs the Python operators (and with it pyflink-ndb's LRU, its RocksDB tier and the
database drivers); psutil is not installed, so the figures come from /proc/<pid>/status.
A backend that fails is recorded with its error; the part never fails. CPU figures come
from /proc/<pid>/stat (:class:`CpuMeter`).
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction, KeySelector, RuntimeContext

from bench.functions import CPU_PIN_OPTION, pin_like_the_option, release_inherited

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = "bench-profile"
#: `state.backend.ndb.cache.max-entries` of the pyflink-ndb runs (per subtask).
CACHE_ENTRIES = 2_000
#: Users the Zipf law draws from (ranks 1..KEY_SPACE).
KEY_SPACE = 1_000_000
ZIPF_S = 1.1
SEED = 20130101
#: Sequence numbers per block of Zipf draws: block b is `default_rng([SEED, b])`.
BLOCK = 4096
EVENTS = ("view", "click", "search", "cart", "purchase", "share", "like", "login")
TTL_MS = 3_600_000
#: The ListState is trimmed to the last LIST_KEEP events once it holds more than LIST_MAX.
LIST_MAX = 16
LIST_KEEP = 8
PADDING = "p" * 100

#: (key, label, Flink backend kind as bench.run knows it, restore.mode).
BACKENDS: tuple[tuple[str, str, str, str | None], ...] = (
    ("hashmap", "Flink hashmap", "hashmap", None),
    ("rocksdb-full", "Flink RocksDB, full checkpoints", "rocksdb", None),
    ("rocksdb-incremental", "Flink RocksDB, incremental checkpoints", "rocksdb", None),
    ("ndb-sqlite", "pyflink-ndb SQLite (lazy)", "ndb-sqlite", "lazy"),
    ("ndb-mariadb", "pyflink-ndb MariaDB (lazy; defaults: write.process auto)", "ndb-mariadb",
     "lazy"),
    ("ndb-mariadb-background", "pyflink-ndb MariaDB, restore.mode background",
     "ndb-mariadb", "background"),
    ("ndb-mariadb-render", "pyflink-ndb MariaDB, write.render-process", "ndb-mariadb",
     "lazy"),
    ("ndb-mariadb-thread", "pyflink-ndb MariaDB, write.process false (background thread)",
     "ndb-mariadb", "lazy"),
    ("ndb-mariadb-cache", "pyflink-ndb MariaDB, cache.max-entries 20,000",
     "ndb-mariadb", "lazy"),
    ("ndb-mariadb-nobundle", "pyflink-ndb MariaDB, bundle.records 0 (one call per record)",
     "ndb-mariadb", "lazy"),
    ("ndb-mariadb-nojson", "pyflink-ndb MariaDB, write.value-json false", "ndb-mariadb",
     "lazy"),
    ("rocksdb-unaligned", "Flink RocksDB, incremental, unaligned checkpoints", "rocksdb", None),
    ("ndb-mariadb-unaligned", "pyflink-ndb MariaDB, unaligned checkpoints", "ndb-mariadb",
     "lazy"),
)
_BY_KEY = {b[0]: b for b in BACKENDS}
_SHORT = {"ndb-sqlite": "sq", "ndb-mariadb": "my", "ndb-mariadb-background": "my_bg",
          "ndb-mariadb-render": "my_rp", "ndb-mariadb-thread": "my_th",
          "ndb-mariadb-cache": "my_ca", "ndb-mariadb-nobundle": "my_nb",
          "ndb-mariadb-nojson": "my_nj", "ndb-mariadb-unaligned": "my_un"}
#: More pyflink-ndb options of a backend (`ndb-mariadb` runs the defaults: on 2 CPUs or
#: more, `write.process: auto` turns the write process on).
_EXTRA_OPTIONS = {"ndb-mariadb-render": {"state.backend.ndb.write.render-process": "true",
                                        "state.backend.ndb.write.process": "false"},
                  "ndb-mariadb-thread": {"state.backend.ndb.write.process": "false"},
                  "ndb-mariadb-cache": {"state.backend.ndb.cache.max-entries": "20000"},
                  "ndb-mariadb-nobundle": {"state.backend.ndb.bundle.records": "0"},
                  "ndb-mariadb-nojson": {"state.backend.ndb.write.value-json": "false"}}
#: More Flink configuration of a backend: unaligned checkpoints (Flink's
#: `execution.checkpointing.unaligned.enabled`) take the records in flight into the
#: checkpoint instead of waiting for them, which under back-pressure is RocksDB's shortest
#: checkpoint (2026-12-06: 83 ms end to end against 4.4 s aligned).
_FLINK_CONF = {key: {"execution.checkpointing.unaligned.enabled": "true"}
               for key in ("rocksdb-unaligned", "ndb-mariadb-unaligned")}


# -- the job (runs in the TaskManager's interpreter) --------------------------------------
@functools.lru_cache(maxsize=2)
def zipf_cdf(keys: int, s: float) -> np.ndarray:
    """Cumulative distribution of ranks 1..keys under Zipf(s) (weights rank**-s)."""
    cdf = np.cumsum(np.arange(1, keys + 1, dtype=np.float64) ** -s)
    return cdf / cdf[-1]


def zipf_block(block: int, keys: int = KEY_SPACE, s: float = ZIPF_S) -> list[int]:
    """The users (0 = the hottest) of sequence numbers `block * BLOCK ..` (+ BLOCK - 1):
    a pure function of the block, so every backend sees the same users in the same order."""
    u = np.random.default_rng([SEED, block]).random(BLOCK)
    users = np.minimum(zipf_cdf(keys, s).searchsorted(u, side="right"), keys - 1)
    return [int(x) for x in users]


class ZipfUser(KeySelector):
    """Key of a sequence number: its Zipf-drawn user (an int)."""

    def __init__(self, keys: int = KEY_SPACE, s: float = ZIPF_S) -> None:
        self.keys = keys
        self.s = s
        self.block = -1
        self.users: list[int] = []

    def get_key(self, value: int) -> int:
        block = value // BLOCK
        if block != self.block:
            self.users = zipf_block(block, self.keys, self.s)
            self.block = block
        return self.users[value % BLOCK]


def new_profile(user: int, now_ms: int) -> dict[str, Any]:
    return {"user": user, "name": f"user-{user:07d}", "email": f"user{user}@example.com",
            "country": ("SE", "DE", "US", "JP", "BR")[user % 5], "segment": user % 17,
            "created_ms": now_ms, "events": 0, "last_event": None, "last_seen_ms": now_ms,
            "counts": {}, "recent": 0, "padding": PADDING}


def profile_descriptors() -> tuple[Any, Any, Any]:
    """The job's three state descriptors: ValueState `profile`, MapState `last_seen` with
    TTL (:data:`TTL_MS`, updated on create and write, never returns expired), ListState
    `recent`."""
    from pyflink.common.time import Time
    from pyflink.datastream.state import (
        ListStateDescriptor,
        MapStateDescriptor,
        StateTtlConfig,
        ValueStateDescriptor,
    )

    ttl = (StateTtlConfig.new_builder(Time.milliseconds(TTL_MS))
           .update_ttl_on_create_and_write().never_return_expired().build())
    seen = MapStateDescriptor("last_seen", Types.STRING(), Types.LONG())
    seen.enable_time_to_live(ttl)
    return (ValueStateDescriptor("profile", Types.PICKLED_BYTE_ARRAY()), seen,
            ListStateDescriptor("recent", Types.PICKLED_BYTE_ARRAY()))


def profile_event(profile_state: Any, last_seen: Any, recent: Any, user: int, value: int,
                  now_ms: int) -> bool:
    """The state calls of one record of the job (for the current key `user`): read and
    rewrite the profile, put the event's last-seen time, append the event to the recent
    list and trim it. Shared by :class:`UserProfile` and the replay without Flink
    (bench/statework.py). Returns True when the user was new (no profile)."""
    event = EVENTS[value % len(EVENTS)]
    profile = profile_state.value()
    new = profile is None
    if new:
        profile = new_profile(user, now_ms)
    profile["events"] += 1
    profile["last_event"] = event
    profile["last_seen_ms"] = now_ms
    profile["counts"][event] = profile["counts"].get(event, 0) + 1
    last_seen.put(event, now_ms)
    recent.add((event, now_ms, value))
    profile["recent"] += 1
    if profile["recent"] > LIST_MAX:
        kept = list(recent.get())[-LIST_KEEP:]
        recent.update(kept)
        profile["recent"] = len(kept)
    profile_state.update(profile)
    return new


class UserProfile(KeyedProcessFunction):
    """Per user a ValueState profile, a MapState with TTL (last seen per event type) and a
    ListState of the recent events; emits nothing.

    Counts per wall-clock second the records it processed and the users it saw first
    (their profile was empty) and appends `second records new_users` to
    `<rate_dir>/rate-<subtask>` when a second is over (as bench.functions.RateCounter).
    `cpu_pin` (Flink's own backends; pyflink-ndb reads `state.backend.ndb.python.cpu-pin`
    itself): the TaskManager's Python threads on one CPU.
    """

    def __init__(self, rate_dir: str, cpu_pin: str = "off") -> None:
        self.rate_dir = rate_dir
        self.cpu_pin = cpu_pin

    def open(self, runtime_context: RuntimeContext) -> None:
        if self.cpu_pin != "off":  # Flink's own backends: what `python.cpu-pin` does
            pin_like_the_option(self.cpu_pin)
        profile, last_seen, recent = profile_descriptors()
        self.profile = runtime_context.get_state(profile)
        self.last_seen = runtime_context.get_map_state(last_seen)
        self.recent = runtime_context.get_list_state(recent)
        self.path = Path(self.rate_dir) / f"rate-{runtime_context.get_index_of_this_subtask()}"
        self.second = 0
        self.count = 0
        self.new_users = 0

    def process_element(self, value: int, ctx: KeyedProcessFunction.Context) -> Any:
        now = time.time()
        if profile_event(self.profile, self.last_seen, self.recent, ctx.get_current_key(),
                         value, int(now * 1000)):
            self.new_users += 1
        second = int(now)
        if second != self.second:
            if self.cpu_pin != "off":
                release_inherited()  # Flink's asynchronous checkpoint threads
            if self.count:
                with self.path.open("a") as f:
                    f.write(f"{self.second} {self.count} {self.new_users}\n")
            self.second = second
            self.count = 0
            self.new_users = 0
        self.count += 1
        yield from ()


def state_bytes() -> dict[str, int]:
    """Pickled bytes of one user's state after 100 events (values only, no keys)."""
    now_ms = int(time.time() * 1000)
    profile = new_profile(123_456, now_ms)
    profile.update(events=100, last_event="view", last_seen_ms=now_ms,
                   counts={e: 12 for e in EVENTS}, recent=12)
    event = pickle.dumps(("purchase", now_ms, 2 ** 61 + 123_456_789), protocol=5)
    return {"profile": len(pickle.dumps(profile, protocol=5)),
            "map_entries": len(EVENTS), "map_entry": len("purchase") + 8,
            "list_event": len(event), "list_min": LIST_KEEP, "list_max": LIST_MAX,
            "typical_total": len(pickle.dumps(profile, protocol=5)) + len(EVENTS) * 16
            + (LIST_KEEP + LIST_MAX) // 2 * len(event)}


# -- memory --------------------------------------------------------------------------------
def proc_status_kb(pid: int, field: str) -> int | None:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = stat_fields(int(stat.parent.name))
        if fields is None:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 on: state, ppid,
    ...), or None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def cpu_seconds(pid: int, reaped_children: bool = False) -> float:
    """User + system CPU seconds of process `pid` so far, all its threads (0.0 once it is
    gone); `reaped_children`: plus those of its children it has waited for (cutime,
    cstime)."""
    fields = stat_fields(pid)
    if fields is None:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def database_cpu_seconds() -> tuple[float, int]:
    """CPU seconds so far of this machine's MySQL-protocol servers, and how many run."""
    pids = database_pids()
    return sum(cpu_seconds(p) for p in pids), len(pids)


def database_pids() -> list[int]:
    """The pids of this machine's MySQL-protocol servers (`mariadbd`, `mysqld`)."""
    out = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip() in ("mariadbd", "mysqld"):
                out.append(int(comm.parent.name))
        except (OSError, ValueError):
            continue
    return out


class CpuMeter:
    """CPU seconds of the JVM, the processes below it (pyflink-ndb's write processes) and
    the database servers of the machine, between :meth:`start` and :meth:`stop`: who the
    job's records cost, on a machine where all of them share the same CPUs.

    Children are read at both ends, plus what the JVM's reaped children used (a write
    process that ends in the window counts there with its whole life: approximate when
    a child restarts in the window). The database figure is the whole server's, whoever
    its clients are."""

    def __init__(self, jvm: int) -> None:
        self.jvm = jvm
        self.before: dict[str, float] = {}
        self.started = 0.0

    def _sample(self) -> dict[str, float]:
        live = sum(cpu_seconds(pid) for pid in descendants(self.jvm))
        jvm_with_reaped = cpu_seconds(self.jvm, reaped_children=True)
        jvm = cpu_seconds(self.jvm)
        return {"jvm": jvm, "children": live + jvm_with_reaped - jvm,
                "database": database_cpu_seconds()[0]}

    def start(self) -> None:
        self.before = self._sample()
        self.started = time.monotonic()

    def stop(self) -> dict[str, float]:
        """CPUs used on average by each group over the window (1.0: one CPU busy); {}
        for a window under a second (nothing to tell)."""
        after = self._sample()
        seconds = time.monotonic() - self.started
        if seconds < 1.0:
            return {}
        return {k: (after[k] - self.before[k]) / seconds for k in after}


class RssSampler(threading.Thread):
    """VmRSS of a process every `interval_s`: (time.time(), kB) samples."""

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            kb = proc_status_kb(self.pid, "VmRSS")
            if kb is not None:
                self.samples.append((time.time(), kb))
            self.stopped.wait(self.interval_s)

    def peak_kb(self, since: float, until: float) -> int | None:
        return max((kb for t, kb in self.samples if since <= t <= until), default=None)


def java_pid() -> int:
    """Pid of the JVM PyFlink started (the MiniCluster's, TaskManager included)."""
    from pyflink.java_gateway import get_gateway

    name = get_gateway().jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getName()
    return int(str(name).split("@")[0])


# -- one backend (the child process) --------------------------------------------------------
def ndb_metrics(port: int, job_id: str) -> dict[str, float]:
    """pyflink-ndb's counters of the job summed over subtasks (REST; pushed at every
    checkpoint notification)."""
    from bench.run import rest_get

    out: dict[str, float] = {}
    for vertex in rest_get(port, f"/jobs/{job_id}")["vertices"]:
        base = f"/jobs/{job_id}/vertices/{vertex['id']}/metrics"
        ids = [m["id"] for m in rest_get(port, base) if ".pyflink_ndb." in m["id"]]
        if ids:
            for m in rest_get(port, base + "?get=" + ",".join(ids)):
                name = m["id"].rsplit(".", 1)[1]
                try:
                    out[name] = out.get(name, 0.0) + float(m["value"])
                except ValueError:
                    pass
    return out


def run_backend(key: str, mysql_url: str, prefix: str, duration_s: float, warmup_s: float,
                parallelism: int, work: str,
                flink_conf: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the job on one backend for `duration_s` after every subtask's first record;
    Flink's checkpoint statistics over REST, the JVM's memory, then cancel. `flink_conf`:
    more Flink configuration (a variant; the part itself passes none)."""

    from bench.run import (
        _DURABLE,
        CHECKPOINT_MS,
        checkpoint_durations,
        checkpoint_stats,
        drop_namespace,
        flink_extra,
        flink_log_events,
        free_port,
        make_environment,
        ndb_options,
        rest_get,
        start_sequence_job,
        store_url,
    )

    _, label, kind, restore_mode = _BY_KEY[key]
    folder = Path(work)
    rates = folder / "rates"
    rates.mkdir(parents=True)
    options: dict[str, str] = {}
    if restore_mode is not None:
        namespace = f"{prefix}_prof_{_SHORT[key]}"
        url = store_url(kind, mysql_url, namespace)
        options = ndb_options(url, namespace)
        options.update({"state.backend.ndb.cache.max-entries": str(CACHE_ENTRIES),
                        "state.backend.ndb.restore.mode": restore_mode})
        options.update(_EXTRA_OPTIONS.get(key, {}))
        drop_namespace(url, namespace)
    extra = flink_extra(kind, folder / "checkpoints")
    if kind == "rocksdb":
        extra["state.backend.incremental"] = "false" if key == "rocksdb-full" else "true"
    extra.update(_FLINK_CONF.get(key, {}))
    extra.update(flink_conf or {})
    port = free_port()
    extra.update({"rest.port": str(port), "rest.bind-port": str(port),
                  "web.checkpoints.history": "1000", "metrics.fetcher.update-interval": "1000"})
    # The job sets its checkpoint interval itself (make_environment); a variant's
    # `execution.checkpointing.interval` replaces it (a long one: the records/s ceiling of
    # the record path without checkpoints).
    interval = extra.pop("execution.checkpointing.interval", None)
    interval_ms = CHECKPOINT_MS if interval is None else duration_ms(interval)
    env = make_environment(parallelism, interval_ms, extra=extra)
    jvm = java_pid()
    sampler = RssSampler(jvm)
    sampler.start()
    rss_before_kb = proc_status_kb(jvm, "VmRSS")
    client, job_id, submitted, first = start_sequence_job(
        env, kind, ZipfUser(),
        UserProfile(str(rates), "off" if options else extra.get(CPU_PIN_OPTION, "off")),
        OPERATOR, options,
        f"bench-profile-{key}", rates, parallelism, "profile job")
    meter = CpuMeter(jvm)
    time.sleep(min(warmup_s, duration_s))
    meter.start()
    time.sleep(max(0.0, duration_s - warmup_s))
    cpus = meter.stop()
    metrics: dict[str, float] = {}
    try:
        stats = checkpoint_stats(port, job_id)
        failures = [{"id": h["id"], "trigger_ms": h["trigger_timestamp"],
                     "message": (h.get("failure_message") or "")[:300]}
                    for h in rest_get(port, f"/jobs/{job_id}/checkpoints")["history"]
                    if h["status"] == "FAILED"]
        if restore_mode is not None:
            try:
                metrics = ndb_metrics(port, job_id)
            except Exception as err:  # metrics are a nice-to-have
                metrics = {"error": str(err)[:200]}  # type: ignore[dict-item]
    finally:
        until = time.time()
        hwm_kb = proc_status_kb(jvm, "VmHWM")
        try:
            client.cancel().result()
        except Exception as err:  # it failed or ended already
            print(f"cancel: {str(err).splitlines()[0][:160]}", file=sys.stderr)
        sampler.stopped.set()
    per_second: dict[int, int] = {}
    users = 0
    for path in rates.glob("rate-*"):
        for line in path.read_text().split("\n"):
            if line:
                second, count, new = (int(x) for x in line.split())
                per_second[second] = per_second.get(second, 0) + count
                users += new
    start = min(per_second)
    timeline = [[s - start, per_second.get(s, 0)]
                for s in range(start, int(until)) if s + 1 <= until]
    steady = [c for s, c in timeline if s >= warmup_s]
    checkpoints = [c for c in stats["checkpoints"] if c["trigger_ms"] / 1000 >= start]
    out: dict[str, Any] = {
        "key": key, "label": label, "duration_s": until - first,
        "submit_to_first_s": first - submitted, "per_second": timeline,
        "records": sum(c for _, c in timeline), "users_seen": users,
        "records_per_s": statistics.mean(steady) if steady else None,
        "min_second": min(steady) if steady else None,
        "max_second": max(steady) if steady else None,
        "counts": stats["counts"], "checkpoints": checkpoints,
        "unfinished": stats["unfinished"], "vertex": stats["vertex"],
        # Failed in the measured window (earlier ones: triggered before every task ran).
        "failed": [f for f in failures if f["trigger_ms"] / 1000 >= start],
        "failed_before_first_record": len([f for f in failures
                                           if f["trigger_ms"] / 1000 < start]),
        "java_pid": jvm, "rss_before_submit_kb": rss_before_kb, "java_hwm_kb": hwm_kb,
        "java_peak_sampled_kb": sampler.peak_kb(submitted, until),
        "java_rss_samples": [[round(t - submitted, 2), kb] for t, kb in sampler.samples],
        "client_hwm_kb": proc_status_kb(os.getpid(), "VmHWM"),
        "other_processes": {str(p): proc_status_kb(p, "VmHWM")
                            for p in descendants(os.getpid()) if p != jvm},
        "embedded_python": any("libpython" in line for line in
                               Path(f"/proc/{jvm}/maps").read_text().splitlines())
        if Path(f"/proc/{jvm}/maps").exists() else None,
        "metrics": metrics, "restore_mode": restore_mode, "cpus": cpus,
        "options": {k: v for k, v in {**options, **extra}.items() if "password" not in k},
        "checkpoint_interval_ms": interval_ms,
    }
    durations = checkpoint_durations(checkpoints)
    if durations:
        out.update(durations,
                   start_delay_median_ms=statistics.median(
                       s["start_delay_ms"] or 0 for c in checkpoints for s in c["subtasks"]),
                   alignment_median_ms=statistics.median(
                       s.get("alignment_ms") or 0 for c in checkpoints for s in c["subtasks"]),
                   subtask_e2e_median_ms=statistics.median(
                       s["end_to_end_ms"] for c in checkpoints for s in c["subtasks"]),
                   checkpointed_size_median=statistics.median(
                       c["checkpointed_size"] for c in checkpoints),
                   state_size_max=max(c["state_size"] for c in checkpoints))
    if restore_mode is not None:
        durable = []
        for t, line in flink_log_events(submitted):
            m = _DURABLE.search(line)
            if m and m.group(1) == OPERATOR and start <= t <= until:
                durable.append({"subtask": int(m.group(2)), "checkpoint": int(m.group(3)),
                                "entries": int(m.group(4)), "write_ms": int(m.group(7))})
        out["durable"] = durable
        if durable:
            out.update(dirty_median=statistics.median(d["entries"] for d in durable),
                       dirty_max=max(d["entries"] for d in durable),
                       write_median_ms=statistics.median(d["write_ms"] for d in durable))
    return out


def duration_ms(text: str) -> int:
    """A Flink duration of milliseconds, seconds or minutes (`1000`, `500 ms`, `30 s`,
    `10min`) in milliseconds.

    :raises ValueError: any other text.
    """
    m = re.fullmatch(r"\s*(\d+)\s*(ms|s|min)?\s*", text)
    if m is None:
        raise ValueError(f"not a duration of ms, s or min: {text!r} (e.g. 1000, 30 s, 10min)")
    return int(m.group(1)) * {None: 1, "ms": 1, "s": 1_000, "min": 60_000}[m.group(2)]


def _interval_text(r: Mapping[str, Any]) -> str:
    """"checkpoints every …" of a part's runs (`flink_conf`'s interval replaces the job's
    own 1 s, :func:`run_backend`)."""
    interval = (r.get("flink_conf") or {}).get("execution.checkpointing.interval")
    if interval is None:
        return "checkpoints every second"
    return f"checkpoints every {duration_ms(interval):,} ms (a variant's interval)"


def child() -> None:
    """Entry point of a backend's own process: `python -c "from bench.profile import child;
    child()" '<json arguments>'`; writes the result to the arguments' `result` file."""
    args = json.loads(sys.argv[1])
    result_path = Path(args.pop("result"))
    result = run_backend(**args)
    result_path.write_text(json.dumps(result))


# -- the part (the bench process) ------------------------------------------------------------
def other_jobs() -> list[str]:
    """`pgrep -fa "pytest|bench.run"` without this process, its ancestors and children."""
    mine = {os.getpid(), *descendants(os.getpid())}
    pid = os.getpid()
    while pid > 1:
        fields = stat_fields(pid)
        if fields is None:
            break
        pid = int(fields[1])
        mine.add(pid)
    try:
        lines = subprocess.run(["pgrep", "-fa", "pytest|bench.run"], capture_output=True,
                               text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[:200] for line in lines if int(line.split()[0]) not in mine]


def run_child(module: str, args: Mapping[str, Any], folder: Path, deadline_s: float,
              poll_s: float = 5.0,
              jobs_every_s: float = 0.0) -> tuple[int, list[float], set[str]]:
    """Run `module`'s `child()` in a Python process of its own (`python -c "from <module>
    import child; child()" '<json of args>'`, in ROOT) in a session of its own, with
    FLINK_LOG_DIR `<folder>/log` (created) and its stdout and stderr in
    `<folder>/child.log`; wait for it to end.

    While it runs, the load average is sampled every `poll_s` seconds and :func:`other_jobs`
    at the first poll and then at the first poll more than `jobs_every_s` seconds after
    the last sample (0: every poll). `deadline_s` seconds after the start its process
    group (the child and its JVM) is killed (SIGKILL).

    Returns the return code (int; negative: the signal that ended it), the 1-minute load
    averages sampled (floats) and the other jobs seen (set of `pgrep -fa` lines).
    """
    (folder / "log").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, FLINK_LOG_DIR=str(folder / "log"))
    loads: list[float] = []
    seen: set[str] = set()
    with (folder / "child.log").open("w") as child_log:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"from {module} import child; child()", json.dumps(args)],
            cwd=ROOT, env=env, stdout=child_log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + deadline_s
        last_jobs = 0.0
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(poll_s)
            loads.append(os.getloadavg()[0])
            if time.monotonic() - last_jobs > jobs_every_s:
                last_jobs = time.monotonic()
                seen.update(other_jobs())
        if proc.poll() is None:  # the child and its JVM (its own session)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, loads, seen


def bench_profile(mysql_url: str, prefix: str, work: Path, duration_s: float,
                  warmup_s: float, keys: Sequence[str], parallelism: int = 2,
                  log: Callable[[str], None] = print,
                  flink_conf: dict[str, str] | None = None) -> dict[str, Any]:
    """Part 7: the user-profile job on each backend of `keys` (see :data:`BACKENDS`), each
    in a process of its own, one after the other. While one runs, the load average and
    other developers' jobs (`pgrep -fa "pytest|bench.run"`) are sampled every 5 s.
    `flink_conf`: more Flink configuration for every backend (a variant)."""
    started = time.monotonic()
    out: dict[str, Any] = {
        "cache_entries": CACHE_ENTRIES, "key_space": KEY_SPACE, "zipf_s": ZIPF_S,
        "ttl_ms": TTL_MS, "list_keep": LIST_KEEP, "list_max": LIST_MAX,
        "duration_s": duration_s, "warmup_s": warmup_s, "parallelism": parallelism,
        "state_bytes": state_bytes(), "when": time.strftime("%Y-%m-%d %H:%M"),
        "flink_conf": flink_conf or {}, "runs": {}}
    for key in keys:
        folder = work / "profile" / key
        shutil.rmtree(folder, ignore_errors=True)
        result = folder / "result.json"
        args = {"key": key, "mysql_url": mysql_url, "prefix": prefix,
                "duration_s": duration_s, "warmup_s": warmup_s, "parallelism": parallelism,
                "work": str(folder / "job"), "result": str(result),
                "flink_conf": flink_conf or {}}
        others = other_jobs()
        load_before = os.getloadavg()
        log(f"profile: {_BY_KEY[key][1]}, {duration_s:.0f} s (load {load_before[0]:.2f}"
            + (f"; other jobs: {len(others)}" if others else "") + ")")
        t0 = time.monotonic()
        returncode, loads, seen = run_child("bench.profile", args, folder, duration_s + 300,
                                            poll_s=5)
        if returncode != 0 or not result.exists():
            tail = (folder / "child.log").read_text(errors="replace").strip().splitlines()[-5:]
            run: dict[str, Any] = {"key": key, "label": _BY_KEY[key][1],
                                   "error": f"exit {returncode}: " + " | ".join(tail)}
        else:
            run = json.loads(result.read_text())
        run.update(loadavg_before=load_before, loadavg_after=os.getloadavg(),
                   loadavg_max=max([load_before[0], *loads]),
                   other_jobs=sorted(seen.union(others)), process_s=time.monotonic() - t0)
        out["runs"][key] = run
        if "error" in run:
            log(f"  failed: {run['error'][:300]}")
        else:
            log(f"  {run['records_per_s'] or 0:,.0f} records/s, {run['users_seen']:,} users, "
                f"{len(run['checkpoints'])} checkpoints, e2e median "
                f"{run.get('e2e_median_ms', float('nan')):,.0f} ms, sync median "
                f"{run.get('sync_median_ms', float('nan')):,.0f} ms, JVM peak RSS "
                f"{(run['java_hwm_kb'] or 0) / 1024:,.0f} MiB")
    rocks = [r for k, r in out["runs"].items()
             if k.startswith("rocksdb") and r.get("records_per_s")]
    best = max(rocks, key=lambda r: r["records_per_s"], default=None)
    out["best_rocksdb"] = best["key"] if best else None
    for r in out["runs"].values():
        if best and r.get("records_per_s"):
            r["ratio_to_best_rocksdb"] = r["records_per_s"] / best["records_per_s"]
    out["elapsed_s"] = time.monotonic() - started
    return out


def _mib(kb: float | None) -> str:
    return "–" if kb is None else f"{kb / 1024:,.0f}"


def _cpus(run: dict[str, Any]) -> str:
    """`JVM + children + database (µs per record)` of a run's :class:`CpuMeter` figures;
    a Flink backend's per-record sum leaves the database out (the job does not use it)."""
    cpus, rate = run.get("cpus"), run.get("records_per_s")
    if not cpus:
        return "–"
    total = cpus["jvm"] + cpus["children"] + (
        cpus["database"] if run.get("restore_mode") is not None else 0.0)
    per_record = f" ({total / rate * 1e6:,.0f})" if rate else ""
    return (f"{cpus['jvm']:.2f} + {cpus['children']:.2f} + {cpus['database']:.2f}"
            + per_record)


def markdown(r: dict[str, Any]) -> list[str]:
    """The part's section of summary.md."""
    sb = r["state_bytes"]
    best = r["runs"].get(r.get("best_rocksdb") or "", {}).get("label", "none")
    lines = ["## 7. User-profile job (issue 9, workload b)", "",
             f"{r['when']}. A sequence source keyed by a Zipf(s={r['zipf_s']}) user of "
             f"{r['key_space']:,} (numpy, fixed seed); per user a ValueState profile "
             f"({sb['profile']} bytes pickled), a MapState with TTL ({r['ttl_ms'] // 60000} "
             f"min; ≤ {sb['map_entries']} entries) and a ListState of the last "
             f"{r['list_keep']}-{r['list_max']} events ({sb['list_event']} bytes each): about "
             f"{sb['typical_total']:,} bytes per user. Parallelism {r['parallelism']}, "
             + _interval_text(r) +
             f", {r['duration_s']:.0f} s per backend after every "
             f"subtask's first record; records/s: mean of the whole seconds after the first "
             f"{r['warmup_s']:.0f}. pyflink-ndb `cache.max-entries` {r['cache_entries']:,} "
             "per subtask. Each backend in a fresh process (fresh JVM); peak RSS: VmHWM of "
             "the JVM (JobManager + TaskManager + the embedded CPython of thread mode, "
             "RocksDB's native memory, pyflink-ndb's tiers), from /proc. Ratio: to the "
             f"faster RocksDB configuration ({best}). Durations from Flink's REST API, per "
             "subtask of the keyed vertex (start delay, sync, async) and per checkpoint "
             "(end to end); start delay: trigger until the subtask had the barrier (aligned "
             "checkpoints: the records in flight ahead of it, under back-pressure); "
             "alignment: its first barrier until its last; a subtask's end to end: trigger "
             "until its acknowledgement (the checkpoint's is the latest subtask's). Failed: "
             "checkpoints triggered after the first record that failed."
             + ("" if not r.get("flink_conf") else " Variant: Flink configuration "
                + ", ".join(f"`{k}: {v}`" for k, v in r["flink_conf"].items()) + "."), "",
             "| backend | records/s | × best RocksDB | worst / best second | users seen "
             "| checkpoints completed (failed) | end-to-end ms median / max | barrier start "
             "delay ms median | alignment ms median | sync ms median / max | async ms median "
             "| subtask end to end ms median | checkpointed size "
             "median | JVM peak RSS MiB | RSS before submit MiB | CPUs: JVM + write processes + "
             "database server (CPU µs per record; Flink's backends: without the database) "
             "| load avg before / after |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
             "|---:|"]
    for run in r["runs"].values():
        load = ("–" if "loadavg_before" not in run else
                f"{run['loadavg_before'][0]:.2f} / {run['loadavg_after'][0]:.2f}"
                + (f" (max {run['loadavg_max']:.2f})" if "loadavg_max" in run else ""))
        if "error" in run:
            lines.append(f"| {run['label']} | failed: {run['error'][:120]} | | | | | | | | "
                         f"| | | | | | | {load} |")
            continue

        def f(name: str, fmt: str = "{:,.0f}", run: dict = run) -> str:
            return "–" if run.get(name) is None else fmt.format(run[name])
        size = ("–" if run.get("checkpointed_size_median") is None
                else f"{run['checkpointed_size_median'] / 1e6:,.2f} MB")
        lines.append(
            f"| {run['label']} | {f('records_per_s')} | {f('ratio_to_best_rocksdb', '{:.2f}×')} "
            f"| {f('min_second')} / {f('max_second')} | {run['users_seen']:,} "
            f"| {len(run['checkpoints'])} ({len(run['failed'])}) "
            f"| {f('e2e_median_ms')} / {f('e2e_max_ms')} | {f('start_delay_median_ms')} "
            f"| {f('alignment_median_ms')} "
            f"| {f('sync_median_ms', '{:,.1f}')} / {f('sync_max_ms')} "
            f"| {f('async_median_ms')} | {f('subtask_e2e_median_ms')} "
            f"| {size} "
            f"| {_mib(run['java_hwm_kb'])} | {_mib(run['rss_before_submit_kb'])} "
            f"| {_cpus(run)} | {load} |")
    notes = []
    for run in r["runs"].values():
        m = run.get("metrics") or {}
        if "dirty_median" in run or "tier1Hits" in m:
            reads = sum(m.get(k, 0) for k in ("tier1Hits", "tier2Hits", "storeReads"))
            notes.append(
                f"{run['label']}: dirty entries per subtask and checkpoint median "
                f"{run.get('dirty_median', 0):,.0f} (max {run.get('dirty_max', 0):,}), "
                f"background write median {run.get('write_median_ms', 0):,.0f} ms"
                + (f"; reads: tier 1 {m.get('tier1Hits', 0) / reads:.1%}, tier 2 "
                   f"{m.get('tier2Hits', 0) / reads:.1%}, store {m.get('storeReads', 0):,.0f} "
                   f"(saved {m.get('storeReadsSaved', 0):,.0f})" if reads else ""))
        if run.get("failed"):
            notes.append(f"{run['label']}: failed checkpoints: " + "; ".join(
                sorted({f["message"][:100] for f in run["failed"]})))
        if run.get("other_jobs"):
            commands = sorted({line.split(None, 1)[1][:90] for line in run["other_jobs"]})
            notes.append(f"{run['label']}: other jobs on the machine during the run: "
                         + "; ".join(f"`{c}`" for c in commands))
    if notes:
        lines += [""] + [f"* {n}" for n in notes]
    lines += checkpoint_comparison(r)
    lines += ["", f"Part took {r.get('elapsed_s', 0) / 60:.1f} min.", ""]
    return lines


def checkpoint_comparison(r: dict[str, Any]) -> list[str]:
    """Issue 9's checkpoint target, (b): each pyflink-ndb run's end-to-end checkpoint
    median against the shortest of the RocksDB runs, whatever their configuration
    (aligned or unaligned: RocksDB's best); empty without both."""
    rocks = [run for key, run in r["runs"].items()
             if key.startswith("rocksdb") and run.get("e2e_median_ms")]
    if not rocks:
        return []
    shortest = min(rocks, key=lambda run: run["e2e_median_ms"])
    out = [f"* {run['label']}: checkpoints {run['e2e_median_ms']:,.0f} ms end to end "
           f"(median), {run['e2e_median_ms'] / shortest['e2e_median_ms']:.2f}× RocksDB's "
           f"shortest ({shortest['label']}: {shortest['e2e_median_ms']:,.0f} ms)"
           for key, run in r["runs"].items()
           if key.startswith("ndb") and run.get("e2e_median_ms")]
    return ["", "Checkpoint duration against RocksDB's best configuration:", "", *out] \
        if out else []


if __name__ == "__main__":
    # `python -m bench.profile [KEY ...] [--quick]`: the part alone, printed as markdown.
    import click

    @click.command()
    @click.argument("keys", nargs=-1, type=click.Choice([b[0] for b in BACKENDS]))
    @click.option("--quick", is_flag=True)
    @click.option("--mysql-url", default=os.environ.get("PYFLINK_NDB_TEST_MYSQL_URL",
                                                        "mysql://root@127.0.0.1:3306/test"))
    @click.option("--duration", type=float, default=None)
    @click.option("--flink-conf", multiple=True, metavar="KEY=VALUE",
                  help="More Flink configuration for every backend (a variant).")
    @click.option("--work", type=click.Path(file_okay=False, path_type=Path),
                  default=ROOT / "var" / "bench-profile", show_default=True)
    def _main(keys: tuple[str, ...], quick: bool, mysql_url: str, duration: float | None,
              flink_conf: tuple[str, ...], work: Path) -> None:
        conf = dict(item.split("=", 1) for item in flink_conf)
        r = bench_profile(mysql_url, "bench", work,
                          duration or (10 if quick else 60), 3 if quick else 5,
                          keys or [b[0] for b in BACKENDS if b[0] != "ndb-mariadb-background"],
                          flink_conf=conf)
        (work / "profile" / "results.json").write_text(json.dumps(r, indent=2))
        click.echo("\n".join(markdown(r)))

    _main()
