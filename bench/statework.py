"""Bench part `state-work` (`python -m bench.run --only state-work`, part 9; issue 9 item
4): the Python cost of the user-profile job's state calls, without Flink.

The state calls of part 7's job (:func:`bench.profile.profile_event`: read and rewrite a
profile, put into a MapState with TTL, append to a ListState and trim it) are replayed on
one :class:`pyflink_ndb.testing.LocalSubtask` (half of the key groups, as one subtask of
parallelism 2) for the same Zipf-drawn users as part 7, with a snapshot and a completion
every :data:`CHECKPOINT_EVERY` records (the background writer renders and writes the
epoch meanwhile, as in a job). Measured per record, after :data:`WARMUP_SHARE` of the
records:

* **task thread**: CPU microseconds of the thread that makes the state calls
  (`time.thread_time`): the work Flink's task thread would do in the state API;
* **background**: CPU microseconds of the process's other threads (the writer: rendering
  rows and JSON, SQL statements, garbage collection; on SQLite also the database engine,
  which runs in-process, while MariaDB's work is in its own server process);
* puts into the tiered table, dirty entries written per record (rows), tier-2 writes.

Configurations: the **floor** (plain dicts holding pickled values: the job's own Python
and pickling, no tiers), pyflink-ndb with every key in tier 1 (the ceiling issue 9 names:
cache hits only) and with `cache.max-entries` :data:`bench.profile.CACHE_ENTRIES` (part
7's setting: most users miss tier 1), on SQLite and MariaDB. In thread mode the task
threads and the writer share one interpreter lock, so task + background is the
interpreter time a record costs (less the MariaDB server's part of background, which
holds no lock); Flink's own per-record work comes on top and is not measured here.

A model of nothing: every figure is measured. Medians of `--rounds` rounds, each in a
fresh subtask and namespace.
"""

from __future__ import annotations

import pickle
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from bench.profile import BLOCK, CACHE_ENTRIES, profile_descriptors, profile_event, zipf_block
from bench.run import drop_namespace

#: Records between two checkpoints of the replay (part 7's job: about 3,000 records per
#: subtask and second at 1-second checkpoints).
CHECKPOINT_EVERY = 5_000
#: Share of the records replayed before the measurement starts (fills the tiers).
WARMUP_SHARE = 0.25
#: The key groups of the replayed subtask: the first half of 128.
KEY_GROUPS = (0, 63)
#: Name prefix of the background writer's threads (pyflink_ndb.checkpoint.protocol).
WRITER_THREAD_PREFIX = "pyflink-ndb-writer"


def users_of_subtask(records: int) -> list[tuple[int, int]]:
    """(sequence number, user) of the first `records` records of part 7's input whose user
    falls in :data:`KEY_GROUPS` (key groups as Flink assigns them, from the CRC-based
    oracle of :mod:`pyflink_ndb.testing`)."""
    from pyflink_ndb.testing import local_key_group

    out: list[tuple[int, int]] = []
    block = 0
    while len(out) < records:
        for i, user in enumerate(zipf_block(block)):
            if KEY_GROUPS[0] <= local_key_group(user) <= KEY_GROUPS[1]:
                out.append((block * BLOCK + i, user))
        block += 1
    return out[:records]


class _DictValue:
    def __init__(self) -> None:
        self.data: dict[Any, bytes] = {}
        self.key: Any = None

    def value(self) -> Any:
        found = self.data.get(self.key)
        return None if found is None else pickle.loads(found)

    def update(self, value: Any) -> None:
        self.data[self.key] = pickle.dumps(value, protocol=5)


class _DictMap(_DictValue):
    def put(self, map_key: Any, value: Any) -> None:
        self.data[(self.key, map_key)] = pickle.dumps(value, protocol=5)


class _DictList:
    def __init__(self) -> None:
        self.data: dict[Any, list[bytes]] = {}
        self.key: Any = None

    def add(self, value: Any) -> None:
        self.data.setdefault(self.key, []).append(pickle.dumps(value, protocol=5))

    def get(self) -> list[Any]:
        return [pickle.loads(v) for v in self.data.get(self.key, [])]

    def update(self, values: list[Any]) -> None:
        self.data[self.key] = [pickle.dumps(v, protocol=5) for v in values]


def writer_cpu_s() -> dict[int, float]:
    """CPU seconds of each live background-writer thread (by thread id)."""
    return {t.ident: time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            for t in threading.enumerate()
            if t.name.startswith(WRITER_THREAD_PREFIX) and t.ident is not None}


def _measure(run: Callable[[list[tuple[int, int]]], None], users: list[tuple[int, int]],
             settle: Callable[[], None]) -> dict[str, float]:
    """Replay the warm-up share of `users`, then the rest measured: CPU microseconds per
    record of this thread (task), of the background writer's threads (writer: the Python
    work that shares the interpreter lock) and of the process's other threads (other:
    RocksDB's flushes and compactions, on SQLite the database engine: no lock).
    `settle()` runs after each share (the writer finishes what it was given). A writer
    thread that ends during the measurement (idle for 5 s) would go uncounted; the replay
    keeps it busy."""
    warm = int(len(users) * WARMUP_SHARE)
    run(users[:warm])
    settle()
    thread0, process0, writers0 = time.thread_time(), time.process_time(), writer_cpu_s()
    run(users[warm:])
    settle()
    thread1, process1, writers1 = time.thread_time(), time.process_time(), writer_cpu_s()
    n = len(users) - warm
    task = thread1 - thread0
    writer = sum(cpu - writers0.get(ident, 0.0) for ident, cpu in writers1.items())
    return {"task_us": task / n * 1e6, "writer_us": writer / n * 1e6,
            "other_us": ((process1 - process0) - task - writer) / n * 1e6,
            "measured_records": n}


def replay_floor(users: list[tuple[int, int]]) -> dict[str, float]:
    """The job's state calls on plain dicts of pickled values (no tiers, no writer)."""
    value, seen, recent = _DictValue(), _DictMap(), _DictList()

    def run(part: list[tuple[int, int]]) -> None:
        now_ms = int(time.time() * 1000)
        for seq, user in part:
            value.key = seen.key = recent.key = user
            profile_event(value, seen, recent, user, seq, now_ms)
    return _measure(run, users, lambda: None)


def replay_tiered(url: str, namespace: str, cache_entries: int,
                  users: list[tuple[int, int]], render_process: bool = False
                  ) -> dict[str, float]:
    """The job's state calls on a LocalSubtask of pyflink-ndb (`url`, `namespace`, which
    is truncated first), checkpointed every :data:`CHECKPOINT_EVERY` records;
    `render_process`: with `write.render-process` (its child's CPU is not counted: it
    holds no lock of this interpreter)."""
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores.factory import open_store
    from pyflink_ndb.testing import LocalSubtask

    options = NdbStateOptions(url=url, namespace=namespace, cache_max_entries=cache_entries,
                              on_fresh_start="truncate", write_render_process=render_process)
    store = open_store(options)
    sub = LocalSubtask(store, options, operator="bench-statework",
                       key_group_start=KEY_GROUPS[0], key_group_end=KEY_GROUPS[1],
                       local_dir=tempfile.mkdtemp(prefix="statework-"))
    profile_d, last_seen_d, recent_d = profile_descriptors()
    profile = sub.context.get_state(profile_d)
    last_seen = sub.context.get_map_state(last_seen_d)
    recent = sub.context.get_list_state(recent_d)
    table = sub.backend.table
    counts = {"puts": 0, "rows": 0}
    put, freeze = table.put, table.freeze

    def counted_put(*args: Any, **kwargs: Any) -> None:
        counts["puts"] += 1
        put(*args, **kwargs)

    def counted_freeze() -> Any:
        counts["rows"] += table.dirty_count
        return freeze()
    table.put = counted_put  # type: ignore[method-assign]
    table.freeze = counted_freeze  # type: ignore[method-assign]
    checkpoint = [0]

    def run(part: list[tuple[int, int]]) -> None:
        now_ms = int(time.time() * 1000)
        for i, (seq, user) in enumerate(part, 1):
            sub.key(user)
            profile_event(profile, last_seen, recent, user, seq, now_ms)
            if i % CHECKPOINT_EVERY == 0:
                checkpoint[0] += 1
                sub.snapshot(checkpoint[0], durable=False)
                sub.complete(checkpoint[0], wait=False)
    measured: dict[str, float] = {}

    def settle() -> None:
        sub.backend.drain()
        if not measured:  # after the warm-up: count the measured records only
            measured["tier2_writes0"] = table.tier2_writes
            counts.update(puts=0, rows=0)
    try:
        result = _measure(run, users, settle)
    finally:
        sub.close()
        store.close()
    n = result["measured_records"]
    return {**result, "puts": counts["puts"] / n, "rows": counts["rows"] / n,
            "tier2_writes": (table.tier2_writes - measured["tier2_writes0"]) / n}


#: (key, label, store kind or None for the floor, cache.max-entries or None: every key,
#: `write.render-process`).
CONFIGS: tuple[tuple[str, str, str | None, int | None, bool], ...] = (
    ("floor", "floor: plain dicts of pickled values", None, None, False),
    ("sqlite-cached", "pyflink-ndb SQLite, every key in tier 1", "sqlite", None, False),
    ("sqlite", f"pyflink-ndb SQLite, cache {CACHE_ENTRIES:,}", "sqlite", CACHE_ENTRIES,
     False),
    ("mariadb-cached", "pyflink-ndb MariaDB, every key in tier 1", "mariadb", None, False),
    ("mariadb", f"pyflink-ndb MariaDB, cache {CACHE_ENTRIES:,}", "mariadb", CACHE_ENTRIES,
     False),
    ("mariadb-render", f"pyflink-ndb MariaDB, cache {CACHE_ENTRIES:,}, "
     "write.render-process", "mariadb", CACHE_ENTRIES, True),
)


def bench_statework(mysql_url: str, namespace_prefix: str, records: int, rounds: int,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every configuration of :data:`CONFIGS`, `rounds` times in turn; returns the medians
    per configuration (keys as :func:`replay_tiered` returns them) and the run's facts."""
    users = users_of_subtask(records)
    folder = tempfile.mkdtemp(prefix="statework-db-")
    samples: dict[str, list[dict[str, float]]] = {c[0]: [] for c in CONFIGS}
    for round_ in range(rounds):
        for key, label, store, cache, render_process in CONFIGS:
            if store is None:
                got = replay_floor(users)
            else:
                url = (mysql_url if store == "mariadb"
                       else f"sqlite:///{folder}/{key}-{round_}.sqlite")
                namespace = f"{namespace_prefix}_sw"
                if store == "mariadb":
                    # Dropped, not only truncated: a truncate leaves the earlier runs' rows
                    # to the background cleanup, and nine runs' rows outgrow MariaDB's 128
                    # MB buffer pool (its CPU per written row went from 25 to 119 us here).
                    # Each SQLite run has a file of its own.
                    drop_namespace(url, namespace)
                got = replay_tiered(url, namespace, cache or 10 * records, users,
                                    render_process)
            samples[key].append(got)
            log(f"state-work round {round_ + 1}/{rounds}, {label}: task "
                f"{got['task_us']:.1f} us, writer {got['writer_us']:.1f} us, other "
                f"{got['other_us']:.1f} us per record")
    runs = {}
    for key, label, *_ in CONFIGS:
        fields = samples[key][0].keys()
        runs[key] = {"label": label,
                     **{f: statistics.median(s[f] for s in samples[key]) for f in fields}}
    return {"when": time.strftime("%Y-%m-%d %H:%M"), "records": records, "rounds": rounds,
            "checkpoint_every": CHECKPOINT_EVERY, "warmup_share": WARMUP_SHARE,
            "cache_entries": CACHE_ENTRIES, "runs": runs}


def markdown(r: dict[str, Any]) -> list[str]:
    """The part's section of summary.md."""
    floor = r["runs"]["floor"]["task_us"]
    lines = ["## 9. State work without Flink (issue 9, item 4)", "",
             f"{r['when']}. Part 7's state calls (bench.profile.profile_event) replayed on one "
             f"LocalSubtask (key groups {KEY_GROUPS[0]}-{KEY_GROUPS[1]} of 128) for "
             f"{r['records']:,} records of part 7's Zipf users, the first "
             f"{r['warmup_share']:.0%} unmeasured; a checkpoint every "
             f"{r['checkpoint_every']:,} records; medians of {r['rounds']} rounds. CPU "
             "microseconds per record: task = the thread making the state calls; writer = "
             "the background writer's thread; task + writer is the interpreter time a "
             "record costs in thread mode, before Flink's own work (both hold the one "
             "interpreter lock). Other = the process's other threads, which hold no lock "
             "(RocksDB's flushes and compactions of tier 2; on SQLite the database engine "
             "runs in the writer's thread); not counted: the MariaDB server and the render "
             "process.", "",
             "| configuration | task us | × floor | writer us | task + writer us | other us | "
             "puts | rows written | tier-2 writes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in r["runs"].values():
        extra = (f"{run['puts']:.2f} | {run['rows']:.2f} | {run['tier2_writes']:.2f}"
                 if "puts" in run else "– | – | –")
        lines.append(f"| {run['label']} | {run['task_us']:.1f} | "
                     f"{run['task_us'] / floor:.1f}× | {run['writer_us']:.1f} | "
                     f"{run['task_us'] + run['writer_us']:.1f} | {run['other_us']:.1f} | "
                     f"{extra} |")
    lines += ["", "(puts, rows written and tier-2 writes per record; rows: the dirty entries "
              "of the checkpoints taken.)", ""]
    return lines


@click.command()
@click.option("--mysql-url", default="mysql://root@127.0.0.1:3306/test", show_default=True)
@click.option("--records", default=60_000, show_default=True)
@click.option("--rounds", default=3, show_default=True)
@click.option("--quick", is_flag=True, help="20,000 records, 1 round.")
def main(mysql_url: str, records: int, rounds: int, quick: bool) -> None:
    """Replay part 7's state calls without Flink and print the part's table."""
    result = bench_statework(mysql_url, "bench", 20_000 if quick else records,
                             1 if quick else rounds)
    click.echo("\n".join(markdown(result)))


if __name__ == "__main__":
    main()
