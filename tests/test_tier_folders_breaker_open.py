"""A subtask's open under an unusual tier-2 base always returns, and the sweep only logs
(a breaker's finds on b3a45e8, fixed in b0ea736 and 8e413b8; kept as their test).

* **No flock.** Some file systems refuse `flock`: Lustre mounted without `-o flock` or
  `-o localflock` answers ENOSYS, NFS without a lock manager ENOLCK, some SMB/FUSE mounts
  EOPNOTSUPP. Tier 2 worked there before the claim; on b3a45e8 the claim's OSError came
  out of `process_folder` and failed every subtask's open: the job could not start.
* **Odd entries under `<base>/pyflink-ndb`.** On b3a45e8 the sweep opened each
  `.owner.lock` with a plain `open`, which blocks on a FIFO until a writer comes: the
  first subtask's open under that base never returned (anyone who can write into a
  shared base, `/tmp` by default, stops every later job there with one `mkfifo`). A
  `.owner.lock` that is a directory, a file named like a process folder, and a symbolic
  link to a folder elsewhere with an unlocked `.owner.lock` (whose content must stay)
  were handled already; they stay in the test.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores import open_store
from pyflink_ndb.testing import LocalSubtask
from pyflink_ndb.tiers import folders

ROOT = Path(__file__).parent.parent

#: What file systems without flock answer (see the module docstring).
CODES = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP)


def test_the_open_neither_fails_without_flock_nor_hangs_on_odd_entries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for code in CODES:
        with monkeypatch.context() as patch:
            without_flock(tmp_path / errno.errorcode[code], code, patch)
    odd_entries(tmp_path / "odd")


def without_flock(tmp_path: Path, code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def flock(fd: int, operation: int) -> None:
        raise OSError(code, f"flock: {errno.errorcode[code]} on this file system")

    # as the file system answers: only this module's flock calls, the process keeps its own
    monkeypatch.setattr(folders, "fcntl", types.SimpleNamespace(
        LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB, LOCK_UN=fcntl.LOCK_UN, flock=flock))
    tmp_path.mkdir()
    base = tmp_path / "no-flock"  # a base this process never claimed
    store = open_store(NdbStateOptions(url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                                       namespace="brkflock"))
    try:
        subtask = LocalSubtask(store, NdbStateOptions(cache_max_entries=1),
                               local_dir=str(base))
        try:
            v = subtask.context.get_state(
                ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
            for k in range(20):
                subtask.key(k)
                v.update(b"%d" % k)
            for k in range(20):
                subtask.key(k)
                assert v.value() == b"%d" % k
            subtask.checkpoint(1)
            assert subtask.backend.tier_folder is not None
            assert Path(subtask.backend.tier_folder).parent == base / "pyflink-ndb"
        finally:
            subtask.close()
    finally:
        store.close()


def odd_entries(tmp_path: Path) -> None:
    base = tmp_path / "base"
    root = base / "pyflink-ndb"
    # an ended process's folder: an unlocked lock file and content
    dead = root / "p1-0000dead"
    (dead / "job" / "op-0-0-x").mkdir(parents=True)
    (dead / folders.OWNER_LOCK).write_bytes(b"")
    (dead / "job" / "op-0-0-x" / "000001.sst").write_bytes(b"x" * 1000)
    lock_dir = root / "p2-000000d1"  # its lock "file" is a directory
    (lock_dir / folders.OWNER_LOCK / "inside").mkdir(parents=True)
    a_file = root / "p3-000000f1"  # a file named like a process folder
    a_file.write_text("not a folder")
    elsewhere = tmp_path / "elsewhere"  # a folder outside, through a symbolic link
    elsewhere.mkdir()
    (elsewhere / folders.OWNER_LOCK).write_bytes(b"")
    (elsewhere / "precious").write_text("keep")
    link = root / "p4-0000001c"
    link.symlink_to(elsewhere, target_is_directory=True)
    fifo = root / "p9-000000ff"  # last in the sweep's order: the others are done first
    fifo.mkdir()
    os.mkfifo(fifo / folders.OWNER_LOCK)

    # the first open under the base, in a process of its own (a hang is killed)
    probe = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pyflink_ndb.tiers import folders; "
         "print(folders.claim_process_folder(sys.argv[1]).path, flush=True); "
         "folders.sweep_orphans(folders.os.path.dirname(folders.claim_process_folder(sys.argv[1]).path))",
         str(base)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        out, err = probe.communicate(timeout=20)
        hung = False
    except subprocess.TimeoutExpired:
        probe.kill()
        out, err = probe.communicate()
        hung = True
    deadline = time.time() + 10  # the deletion may run in the background
    while dead.exists() and time.time() < deadline:
        time.sleep(0.1)
    handled = {"dead deleted": not dead.exists()
               and not (root / f".deleting-{dead.name}").exists(),
               "lock dir kept": lock_dir.is_dir(), "file kept": a_file.is_file(),
               "link kept": link.is_symlink(),
               "link target kept": (elsewhere / "precious").is_file()}
    assert not hung, (
        f"the first open under the base did not return in 20 s (the sweep blocks in "
        f"open() on the FIFO {fifo / folders.OWNER_LOCK}); before it: {handled}")
    assert probe.returncode == 0, err[-3000:]
    assert Path(out.splitlines()[0]).parent == root
    assert all(handled.values()), handled
