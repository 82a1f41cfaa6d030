"""Tier-2 process folders (`pyflink_ndb.tiers.folders`): a process that is killed leaves its
folder, and the next process that opens tier 2 under the same base deletes it; the folders
of live processes, and folders nobody claimed, stay.

Before the sweep, a killed process's folder stayed for good, and so did a local MiniCluster's
whose job failed for good (the JVM's exit hook did not delete it in a breaker's run: the
README's known leak, 2026-12-07).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores import open_store
from pyflink_ndb.testing import LocalSubtask
from pyflink_ndb.tiers import folders

ROOT = Path(__file__).parent.parent

#: Opens a subtask with tier 2 under argv[2] holding 200 values evicted to tier 2
#: (tests/tier_child.py), prints its process folder, then kills itself (no atexit, no exit hook) or
#: waits for its stdin to close and closes the subtask.
SCRIPT = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, "tests")
    from tier_child import open_filled
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores import open_store

    url, local_dir, how = sys.argv[1], sys.argv[2], sys.argv[3]
    store = open_store(NdbStateOptions(url=url, namespace="folders"))
    t, v = open_filled(store, local_dir, job_id="f" * 32)
    t.checkpoint(1)
    print(t.backend.tier_folder, flush=True)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.read()
    t.close()
    store.close()
""")


def start(tmp_path: Path, local_dir: Path, how: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        # a database of its own: each is a fresh start
        [sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / uuid.uuid4().hex}.sqlite",
         str(local_dir), how], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=str(ROOT))


def killed_process_folder(tmp_path: Path, local_dir: Path) -> Path:
    child = start(tmp_path, local_dir, "kill")
    out, err = child.communicate(timeout=300)
    assert child.returncode == -9, err[-3000:]
    folder = Path(out.strip())
    assert folder.parent == local_dir / "pyflink-ndb", folder
    assert sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) > 0
    return folder


def test_the_next_process_deletes_a_killed_process_tier_folder(tmp_path: Path) -> None:
    local_dir = tmp_path / "local"
    root = local_dir / "pyflink-ndb"
    first = killed_process_folder(tmp_path, local_dir)
    second = killed_process_folder(tmp_path, local_dir)
    # the second process's open took the first's folder (renamed at once, deleted in a
    # thread that its kill may have cut short); its own is left by its kill
    assert not first.exists()
    assert second.exists()
    assert (second / folders.OWNER_LOCK).exists()
    # a sweep deletes what is left of both, .deleting- folders included
    assert folders.sweep_orphans(str(root)) == [second.name]
    assert list(root.iterdir()) == []


def test_a_subtask_open_does_not_wait_for_the_deletion(tmp_path: Path, monkeypatch) -> None:
    """A killed TaskManager's tiers can hold gigabytes: the open renames them and returns;
    a daemon thread deletes them."""
    local_dir = tmp_path / "local"
    dead = killed_process_folder(tmp_path, local_dir)
    started, release = threading.Event(), threading.Event()
    deleted: list[Path] = []
    real_delete = folders._delete

    def slow_delete(paths: list[Path]) -> None:
        started.set()
        release.wait(30)
        real_delete(paths)
        deleted.extend(paths)

    monkeypatch.setattr(folders, "_delete", slow_delete)
    hold = folders.claim_process_folder(str(local_dir))
    mine = Path(hold.path)
    assert started.wait(10)
    assert not dead.exists() and mine.is_dir()
    doomed = local_dir / "pyflink-ndb" / (folders.DELETING + dead.name)
    assert doomed.is_dir()  # still being deleted after the open returned
    release.set()
    for _ in range(100):
        if deleted:
            break
        time.sleep(0.1)
    assert deleted == [doomed] and not doomed.exists()
    hold.release()
    assert not mine.exists()


def test_a_live_process_folder_and_an_unclaimed_folder_stay(tmp_path: Path) -> None:
    local_dir = tmp_path / "local"
    root = local_dir / "pyflink-ndb"
    dead = killed_process_folder(tmp_path, local_dir)
    unclaimed = root / "p1-0123abcd"  # being claimed, or from a version before the claim
    (unclaimed / "job").mkdir(parents=True)
    other = root / "not-a-process-folder"
    other.mkdir()
    live = start(tmp_path, local_dir, "wait")
    try:
        assert live.stdout is not None
        live_folder = Path(live.stdout.readline().strip())
        assert live_folder.is_dir(), live.stderr.read() if live.stderr else ""
        assert not dead.exists()  # swept by the live process's open
        assert folders.sweep_orphans(str(root)) == []
        assert live_folder.is_dir() and unclaimed.is_dir() and other.is_dir()
    finally:
        live.communicate(timeout=60)
    assert live.returncode == 0
    # it closed its subtask: the last tier in its folder went, and the folder with it
    assert not live_folder.exists(), list(live_folder.rglob("*"))
    assert folders.sweep_orphans(str(root)) == []
    assert unclaimed.is_dir() and other.is_dir()


def test_this_process_claims_its_folder_once_and_never_sweeps_it(tmp_path: Path) -> None:
    base = str(tmp_path / "base")
    first = folders.claim_process_folder(base)
    folder = first.path
    assert folder == str(tmp_path / "base" / "pyflink-ndb" / folders.PROCESS_FOLDER)
    second = folders.claim_process_folder(base)
    assert second.path == folder
    assert (Path(folder) / folders.OWNER_LOCK).exists()
    assert folders.sweep_orphans(str(Path(folder).parent)) == []
    assert Path(folder).is_dir()
    first.release()
    first.release()  # idempotent: the second hold keeps the folder
    assert Path(folder).is_dir()
    second.release()
    assert not Path(folder).exists()


def test_the_last_tier_destroyed_releases_the_folder_and_its_lock(tmp_path: Path) -> None:
    """One open lock file per base in use: a test suite makes thousands of temporary bases
    (a process holding over a thousand made the render process's `select` fail)."""
    store = open_store(NdbStateOptions(url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                                       namespace="hold"))
    subtasks = [LocalSubtask(store, NdbStateOptions(cache_max_entries=1),
                             local_dir=str(tmp_path / "base"), subtask_index=i,
                             key_group_start=64 * i, key_group_end=64 * i + 63)
                for i in range(2)]
    folder = Path(subtasks[0].backend.tier_folder or "")
    identity = folders._identity(folder.stat())
    assert folders._claims[identity].users == 2
    for i, subtask in enumerate(subtasks):
        v = subtask.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
        for k in range(20):
            subtask.key(k)
            v.update(b"x" * 100)
        subtask.close()
        if i == 0:
            assert folder.is_dir() and folders._claims[identity].users == 1
    for _ in range(100):  # the last tier is deleted in a thread of its own
        if identity not in folders._claims:
            break
        time.sleep(0.05)
    assert identity not in folders._claims and not folder.exists()
    store.close()
