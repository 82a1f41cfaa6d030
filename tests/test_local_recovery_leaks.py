"""What task-local recovery (`local.recovery`) must not keep (from a breaker, 2026-12-07;
both failed before their fixes).

* A parked tier 2 lives in the interpreter's registry; it is deleted when taken over,
  after 60 s, beyond 64 parked, and when a Python process ends (`atexit`). Before, a
  process that ended sooner left the folder on disk. (A MiniCluster's JVM can still leave
  it, as a killed process does: the next process under the same base deletes it,
  tests/test_tier_folders.py.)
* The epochs tracked for the take-over keep their keys only once durable, and at most
  16 of them: before, the frozen dicts themselves were kept, values included, until a
  checkpoint was heard completed, so checkpoints that Flink aborts, or savepoints only,
  pinned every value written since.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.testing import LocalSubtask

ANY = Types.PICKLED_BYTE_ARRAY()

SCRIPT = textwrap.dedent("""
    import sys
    from pyflink.common.typeinfo import Types
    from pyflink.datastream.state import ValueStateDescriptor
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores import open_store
    from pyflink_ndb.testing import LocalSubtask

    url, local_dir, recovery = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    store = open_store(NdbStateOptions(url=url, namespace="breakerlr"))
    t = LocalSubtask(store, NdbStateOptions(cache_max_entries=1, local_recovery=recovery),
                     local_dir=local_dir, job_id="f" * 32)
    v = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    for k in range(200):
        t.key(k)
        v.update(b"x" * 1000)
    t.checkpoint(1)
    t.key(0)
    v.update(b"y")
    t.crash()  # the job fails for good (or is cancelled) ...
    store.close()
    # ... and the interpreter ends (TaskManager / MiniCluster stopped)
""")


def tier_folders(local_dir: Path) -> list[Path]:
    """The attempts' tier-2 folders left: `pyflink-ndb/<process>/<job>/<attempt>`."""
    base = local_dir / "pyflink-ndb"
    if not base.exists():
        return []
    return [p for proc in base.iterdir() if proc.is_dir()
            for job in proc.iterdir() if job.is_dir() for p in job.iterdir()]


@pytest.mark.parametrize("recovery", [False, True], ids=["no-local-recovery",
                                                          "local-recovery"])
def test_a_parked_tier_is_not_left_on_disk_when_the_interpreter_ends(tmp_path: Path,
                                                                      recovery: bool) -> None:
    local_dir = tmp_path / "local"
    local_dir.mkdir()
    url = f"sqlite:///{tmp_path / 'state.sqlite'}"
    done = subprocess.run([sys.executable, "-c", SCRIPT, url, str(local_dir),
                           "1" if recovery else "0"], capture_output=True, text=True,
                          timeout=300, cwd=str(Path(__file__).parent.parent))
    assert done.returncode == 0, done.stderr[-3000:]
    left = tier_folders(local_dir)
    sizes = {str(p.relative_to(local_dir)): sum(f.stat().st_size for f in p.rglob("*")
                                                if f.is_file()) for p in left}
    assert not left, f"tier-2 folders left behind after the interpreter ended: {sizes}"


@pytest.mark.parametrize("snapshots", ["aborted-checkpoints", "savepoints-only"])
def test_snapshots_that_complete_no_checkpoint_do_not_pin_every_epochs_values(
        store_factory: Any, local_dir: str, snapshots: str) -> None:
    """40 checkpoints that Flink aborts (or 40 completed savepoints, checkpointing off),
    40 values of 20 KB rewritten before each: the tiers hold 40 current values (0.8 MB);
    the epochs tracked for `local.recovery` pin all 1,600 (32 MB) until a checkpoint is
    heard completed."""
    store = store_factory("sqlite")
    t = LocalSubtask(store, NdbStateOptions(cache_max_entries=1000), local_dir=local_dir)
    v = t.context.get_state(ValueStateDescriptor("v", ANY))
    for k in range(40):
        t.key(k)
        v.update(b"0")
    t.checkpoint(1)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for cid in range(2, 42):
            for k in range(40):
                t.key(k)
                v.update(os.urandom(20_000))
            if snapshots == "aborted-checkpoints":
                t.snapshot(cid)  # durable ...
                t.abort(cid)  # ... but declined by another subtask: Flink aborts it
            else:
                t.snapshot(cid, is_savepoint=True)
                t.complete(cid)
        t.backend.drain()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    tracked = len(t.backend.table._epoch_entries)
    t.close()
    assert grown < 8_000_000, (f"{grown / 1e6:.1f} MB more held after 40 {snapshots} "
                               f"({tracked} epochs tracked)")
