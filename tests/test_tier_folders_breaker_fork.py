"""Tier-2 process folders and forked processes (a breaker's find on b3a45e8, fixed in
8e413b8 by `os.register_at_fork`; kept as its test): the sweep deleted the folder of a
live process.

`PROCESS_FOLDER` (`p<pid>-<hex>`) is fixed when `pyflink_ndb.tiers.folders` is imported,
so on b3a45e8 processes forked after the import (`multiprocessing`'s default start method
on Linux before Python 3.14: a harness or a service that imports pyflink-ndb and runs
subtasks in worker processes) all named the same folder under a base, and each one's
first open under that base claimed it again: it locked a new lock file and renamed it
over `.owner.lock`, so the folder's claim was the last claimant's alone. Once that
worker ended (a pool recycles it, it finished its subtasks), `.owner.lock` could be
locked while the first worker still had its subtask open there, and any other process's
open under the base deleted the live worker's RocksDB tier (its next flush failed).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from pyflink_ndb.tiers import folders

ROOT = Path(__file__).parent.parent

#: Imports pyflink-ndb, forks worker A (opens a subtask with tier 2 under argv[2], writes
#: 200 values of 1 KB evicted to tier 2, stays open until its stdin line) and then worker
#: B (opens and closes a subtask under the same base, ends). Prints A's tier folder and
#: waits; then A writes 80,000 values more (RocksDB flushes its memtable), reads its first
#: values back and closes; the script prints what A met and A's exit code.
SCRIPT = textwrap.dedent("""
    import multiprocessing, sys
    sys.path.insert(0, "tests")
    from tier_child import open_filled, overflow_then_check
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores import open_store

    db, base = sys.argv[1], sys.argv[2]

    def worker(name, ready, go, result):
        store = open_store(NdbStateOptions(url=f"sqlite:///{db}-{name}", namespace="fork"))
        t, v = open_filled(store, base)
        ready.put(t.backend.tier_folder)
        if go is not None:
            go.get()
            written, wrong = overflow_then_check(t, v)
            print("A big write:", written, flush=True)
            result.put(wrong)
        t.close()
        store.close()

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("fork")
        ready, go, result = ctx.Queue(), ctx.Queue(), ctx.Queue()
        a = ctx.Process(target=worker, args=("a", ready, go, result))
        a.start()
        folder_a = ready.get(timeout=60)
        b = ctx.Process(target=worker, args=("b", ready, None, None))
        b.start()
        ready.get(timeout=60)
        b.join(60)
        print(folder_a, flush=True)
        sys.stdin.readline()
        go.put(1)
        print("A wrong values:", result.get(timeout=60), flush=True)
        a.join(60)
        print("A exit", a.exitcode, flush=True)
""")


def test_a_worker_forked_after_the_import_that_ends_does_not_expose_a_live_worker_folder(
        tmp_path: Path) -> None:
    base = tmp_path / "base"
    parent = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "db"), str(base)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=str(ROOT))
    try:
        assert parent.stdout is not None and parent.stdin is not None
        folder_a = Path(parent.stdout.readline().strip())
        assert folder_a.parent == base / "pyflink-ndb", parent.stderr.read()[-3000:]
        assert any(folder_a.glob("*/*/CURRENT")), list(folder_a.rglob("*"))
        # another process opens tier 2 under the same base (this one: its first claim
        # there sweeps), while worker A is alive with its subtask open in folder_a
        mine = folders.claim_process_folder(str(base)).path
        assert Path(mine).is_dir()
        alive_after_sweep = folder_a.is_dir()
        parent.stdin.write("\n")
        parent.stdin.flush()
        out, err = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.communicate()
    assert alive_after_sweep, (
        f"the sweep deleted live worker A's folder {folder_a.name}; A then: {out!r} "
        f"{err[-2000:]!r}")
    assert "A big write: ok" in out, (out, err[-3000:])
    assert "A wrong values: []" in out and "A exit 0" in out, (out, err[-3000:])
