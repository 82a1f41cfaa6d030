"""Bench part `key-filter` (`python -m bench.run --only key-filter`, part 10; alone:
`python -m bench.keyfilter [--quick]`): issue 9 item 1, reads after a restore of keys the
restored snapshot never held, with and without `restore.key-filter`.

Without Flink, on one :class:`pyflink_ndb.testing.LocalSubtask` (key groups 0-63 of 128,
as one subtask of parallelism 2; cache 10,000, tier 2 on, lazy restore):

1. **Build** N keys × 1 KB in a ValueState (pickled `(count, 1,000-character payload)`)
   and a MapState entry each, checkpoint, crash (once per store; both variants restore
   that same checkpoint as new jobs would).
2. **Restore** with the filter on or off, then at once a probe of :data:`PROBE` records:
   each reads and rewrites the ValueState of a key and reads a map entry; half the
   records hit random existing keys, half new keys (never stored: first seen after the
   restore, like a new user). Measured: restore → probe end (wall seconds), the store
   round trips the probe made, the filter build's duration (it starts after the first
   1,000 reads of keys the store does not hold), its size and members.
3. **Steady state**: with the filter built (the writer idle), a second probe of
   :data:`PROBE` new keys; measured: its seconds, round trips, and the false-positive rate
   the filter showed (round trips / lookups of new keys).

A model of nothing: every figure is measured, on this machine's MariaDB on loopback (a
round trip of 0.1-1 ms; a remote database adds its own latency to each round trip the
filter spares) and SQLite in-process.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from typing import Any

import click

#: Probe records (after the restore, and again with the filter built).
PROBE = 10_000
#: Checkpoint every this many build records (bounded epochs).
BUILD_EPOCH = 20_000
KEY_GROUPS = (0, 63)
PAYLOAD = "x" * 1000


def _states(sub: Any) -> tuple[Any, Any]:
    from pyflink.common import Types
    from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

    any_type = Types.PICKLED_BYTE_ARRAY()
    return (sub.context.get_state(ValueStateDescriptor("profile", any_type)),
            sub.context.get_map_state(MapStateDescriptor("seen", any_type, any_type)))


def _subtask(store: Any, options: Any, restored: int | None, local_dir: str) -> Any:
    from pyflink_ndb.testing import LocalSubtask

    return LocalSubtask(store, options, operator="bench-keyfilter",
                        key_group_start=KEY_GROUPS[0], key_group_end=KEY_GROUPS[1],
                        restored_checkpoint_id=restored, local_dir=local_dir)


def _keys_of_subtask(start: int, count: int) -> list[int]:
    from pyflink_ndb.testing import local_key_group

    out: list[int] = []
    k = start
    while len(out) < count:
        if KEY_GROUPS[0] <= local_key_group(k) <= KEY_GROUPS[1]:
            out.append(k)
        k += 1
    return out


def _probe(sub: Any, keys: list[int]) -> tuple[float, int]:
    """Read-modify-write each key's value and read its map entry; (seconds, round trips)."""
    value, seen = _states(sub)
    table = sub.backend.table
    reads0, started = table.store_reads, time.perf_counter()
    for k in keys:
        sub.key(k)
        current = value.value()
        value.update((1 if current is None else current[0] + 1, PAYLOAD))
        seen.get("e")
    return time.perf_counter() - started, table.store_reads - reads0


def run_store(url: str, namespace: str, keys: int, log: Callable[[str], None]
              ) -> dict[str, Any]:
    """Build `keys` keys in `url`/`namespace` (truncated first), then restore it with the
    filter off and on; returns the two variants' figures."""
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores.factory import open_store

    base = NdbStateOptions(url=url, namespace=namespace, on_fresh_start="truncate")
    store = open_store(base)
    local_dir = tempfile.mkdtemp(prefix="keyfilter-")
    existing = _keys_of_subtask(0, keys)
    started = time.perf_counter()
    sub = _subtask(store, base, None, local_dir)
    value, seen = _states(sub)
    for i, k in enumerate(existing, 1):
        sub.key(k)
        value.update((1, PAYLOAD))
        seen.put("e", i)
        if i % BUILD_EPOCH == 0:
            sub.checkpoint(i // BUILD_EPOCH)
    last = keys // BUILD_EPOCH + 1
    sub.checkpoint(last)
    sub.crash()
    build_s = time.perf_counter() - started
    log(f"key-filter: built {keys:,} keys in {build_s:.1f} s ({url.split(':')[0]})")
    rng = random.Random(keys)
    new_keys = _keys_of_subtask(10 * keys + 1, PROBE * 3 // 2)
    mixed = [rng.choice(existing) if i % 2 else new_keys[i // 2] for i in range(PROBE)]
    later = new_keys[PROBE // 2:] + _keys_of_subtask(20 * keys + 1, PROBE - len(
        new_keys[PROBE // 2:]))
    out: dict[str, Any] = {"keys": keys, "build_s": build_s}
    for variant, on in (("off", False), ("on", True)):
        options = NdbStateOptions(url=url, namespace=namespace, restore_key_filter=on)
        opened = time.perf_counter()
        sub = _subtask(store, options, last, local_dir)
        restore_s = time.perf_counter() - opened
        probe_s, probe_reads = _probe(sub, mixed)
        sub.backend.protocol.writer.wait_idle(600)
        build = sub.backend.key_filter_build
        steady_s, steady_reads = _probe(sub, later)
        row: dict[str, Any] = {
            "restore_s": restore_s, "probe_s": probe_s, "probe_reads": probe_reads,
            "steady_s": steady_s, "steady_reads": steady_reads,
            "steady_fp_rate": steady_reads / (2 * len(later))}
        if build is not None:
            f = build.filter
            row.update(filter_bytes=f.size_bytes, filter_members=f.members,
                       filter_key_groups=f.key_groups, filter_ready_s=build.seconds,
                       bytes_per_entry=f.size_bytes / max(1, 2 * keys))
        out[variant] = row
        log(f"key-filter {variant}: probe {probe_s:.2f} s, {probe_reads} round trips; "
            f"new keys with the writer idle {steady_s:.2f} s, {steady_reads} round trips")
        sub.crash()
    store.close()
    return out


def bench_keyfilter(mysql_url: str, namespace_prefix: str, keys: int,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Both stores; returns their figures and the run's facts."""
    folder = tempfile.mkdtemp(prefix="keyfilter-db-")
    runs = {"mariadb": run_store(mysql_url, f"{namespace_prefix}_kf", keys, log),
            "sqlite": run_store(f"sqlite:///{folder}/kf.sqlite", "kf", keys, log)}
    return {"when": time.strftime("%Y-%m-%d %H:%M"), "keys": keys, "probe": PROBE,
            "runs": runs}


def markdown(r: dict[str, Any]) -> list[str]:
    """The part's section of summary.md."""
    lines = ["## 10. Misses after a restore: the key filter (issue 9, item 1)", "",
             f"{r['when']}. One LocalSubtask (key groups {KEY_GROUPS[0]}-{KEY_GROUPS[1]}), "
             f"{r['keys']:,} keys × 1 KB (a ValueState and a MapState entry each) built, "
             "checkpointed, crashed; restored lazily with `restore.key-filter` off and on. "
             f"Probe: {r['probe']:,} records from the restore on, half random existing "
             "keys, half new keys (each: read and rewrite the value, read a map entry). "
             f"Then {r['probe']:,} more new keys with the filter built. Round trips = "
             "store reads on the task thread.", "",
             "| store | key filter | restore → probe end s | round trips | build s | "
             "new keys after s | round trips | false positives | filter bytes | bytes per "
             "entry |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for store, run in r["runs"].items():
        for variant in ("off", "on"):
            v = run[variant]
            lines.append(
                f"| {store} | {variant} | {v['probe_s']:.2f} | {v['probe_reads']:,} | "
                f"{v.get('filter_ready_s', float('nan')):.1f} | {v['steady_s']:.2f} | "
                f"{v['steady_reads']:,} | {v['steady_fp_rate']:.2%} | "
                f"{v.get('filter_bytes', 0):,} | {v.get('bytes_per_entry', 0):.2f} |")
    lines += ["", "(build s: from the build's start, after the probe's first 1,000 reads of "
              "keys the store does not hold, to its last page; false positives: round trips "
              "/ lookups of new keys, two per key: the value and the map entry; bytes per "
              "entry: filter bytes / stored entries.)", ""]
    return lines


@click.command()
@click.option("--mysql-url", default="mysql://root@127.0.0.1:3306/test", show_default=True)
@click.option("--keys", default=100_000, show_default=True)
@click.option("--quick", is_flag=True, help="20,000 keys.")
def main(mysql_url: str, keys: int, quick: bool) -> None:
    """Measure the key filter after a restore and print the part's table."""
    result = bench_keyfilter(mysql_url, "bench", 20_000 if quick else keys)
    click.echo("\n".join(markdown(result)))


if __name__ == "__main__":
    main()
