"""Tier-2 process folders reached under two spellings of one base (a breaker's find, on
the code after 21f64c0; fixed since by keying the claims by the folder's device and
inode and telling a deleted folder by its link count): before the fix, a live process
lost its claim, and another process's sweep deleted its open RocksDB tier.

`_claimed` was keyed by the folder's path string. A process whose subtasks name the same
base folder two ways (`state.backend.ndb.local.dir` through a symbolic link in one job
and the real path in another, or a relative and an absolute path) claims the one folder
twice: the second claim locked a new file and renamed it over `.owner.lock`, so the
folder's claim was the second lock alone. `_forget_deleted` (21f64c0) closed the lock of
every claimed path that `os.path.isdir` no longer finds when any base is first opened:
once the second spelling stops resolving (the link is removed, the working directory of
a relative path changes), the lock that guards `.owner.lock` is closed while the folder
is in use under the first spelling, and the next process under the base takes it
(`.deleting-`) and deletes the live tier.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from pyflink_ndb.tiers import folders

ROOT = Path(__file__).parent.parent

#: argv: db file, base, link to base, another base. A subtask under the base (evicts 200
#: values to tier 2), a second job's subtask under the link (opened and closed), the link
#: removed, a third subtask under another base (opened and closed). Prints the first
#: subtask's tier folder and waits for a line; then the first subtask writes 80,000 values
#: more (RocksDB flushes), reads its first values back and closes.
SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, "tests")
    from tier_child import open_filled, overflow_then_check
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores import open_store
    from pyflink_ndb.testing import LocalSubtask

    db, base, link, other = sys.argv[1:5]
    store = open_store(NdbStateOptions(url=f"sqlite:///{db}", namespace="alias"))
    options = NdbStateOptions(cache_max_entries=1)
    first, v = open_filled(store, base)
    LocalSubtask(store, options, local_dir=link).close()
    os.unlink(link)
    LocalSubtask(store, options, local_dir=other).close()
    print(first.backend.tier_folder, flush=True)
    sys.stdin.readline()
    written, wrong = overflow_then_check(first, v)
    print("big write:", written, flush=True)
    print("wrong values:", wrong, flush=True)
    first.close()
    store.close()
    print("closed", flush=True)
""")


def test_a_second_spelling_of_the_base_that_goes_away_does_not_expose_a_live_folder(
        tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    link = tmp_path / "link"
    link.symlink_to(base, target_is_directory=True)
    other = tmp_path / "other"
    live = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "db.sqlite"), str(base), str(link),
         str(other)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=str(ROOT))
    try:
        assert live.stdout is not None and live.stdin is not None
        folder = Path(live.stdout.readline().strip())
        assert folder.parent == base / "pyflink-ndb", live.stderr.read()[-3000:]
        # another process under the same base, while the first subtask is open there
        swept = folders.sweep_orphans(str(base / "pyflink-ndb"))
        alive_after_sweep = folder.is_dir()
        live.stdin.write("\n")
        live.stdin.flush()
        out, err = live.communicate(timeout=60)
    finally:
        if live.poll() is None:
            live.kill()
            live.communicate()
    assert alive_after_sweep and swept == [], (
        f"another process's sweep took the live folder {folder.name} ({swept}); the live "
        f"subtask then: {out!r} {err[-2000:]!r}")
    assert "big write: ok" in out and "wrong values: []" in out and "closed" in out, (
        out, err[-3000:])
    assert live.returncode == 0, err[-3000:]
