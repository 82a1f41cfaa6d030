"""The process folders of tier 2: `<base>/pyflink-ndb/<PROCESS_FOLDER>/`, one per process
and base folder, and the sweep of those whose process is gone.

Tier 2 never outlives its process (a restore starts from tier 3, or from a tier the same
process parked: `pyflink_ndb.tiers.handover`). A process that ends normally deletes its
folder (the interpreter's `atexit` for parked tiers; the bridge's JVM exit hook,
`TierFolders.java`, for the embedded interpreter of a TaskManager or a local MiniCluster).
A process that is killed (SIGKILL, an out-of-memory kill, a lost container) or whose exit
hooks did not run (a breaker's local MiniCluster run that failed for good left its parked
tiers) leaves its folder behind. Flink likewise deletes its own local-state folders of
allocations that no slot holds any more
(`TaskExecutorLocalStateStoresManager.retainLocalStateForAllocations`).

**The claim.** A process holds an exclusive `flock` on `<folder>/.owner.lock` while it
uses the folder: the kernel releases it when the process ends, however it ends, so a lock
that can be taken belongs to nobody. The lock file is locked under a temporary name and only
then renamed to `.owner.lock`, so a folder whose `.owner.lock` exists is claimed unless
its process is gone.

**Held while used.** A process holds its claim on a folder while tier 2s live in it
(:class:`FolderClaim`, one per `LocalTier`, parked ones included): when the last is
destroyed, the lock is closed and the folder deleted. A process keeps one open file per
base folder in use, not per base ever used (a test suite makes thousands).

**The sweep.** Whenever a process takes a hold on its folder under a base (each subtask
attempt's open), it takes every sibling
`p<pid>-<hex>` folder whose `.owner.lock` it can lock: it renames it, lock held, to
`.deleting-<name>` (at once), and deletes the renamed folders in a daemon thread. Only
real folders with a regular `.owner.lock` are taken (never through a symbolic link; a
lock opened without blocking, so a FIFO put there cannot hang an open). A
subtask's open, which claims, does not wait for the gigabytes a killed TaskManager's tiers
may hold, and a deletion cut short by the interpreter's end leaves a `.deleting-` folder,
which the next sweep deletes. A folder without `.owner.lock` (one being claimed this
instant, or one of a version before this sweep) is left alone. Without `fcntl` (not
POSIX) nothing is claimed nor swept.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


def _new_name() -> str:
    return f"p{os.getpid()}-{uuid.uuid4().hex[:8]}"


#: This process's folder under a tier-2 base folder (`<base>/pyflink-ndb/<PROCESS_FOLDER>/
#: <job id>/<attempt's folder>`); a forked child gets a name of its own (`_after_fork`).
PROCESS_FOLDER = _new_name()
#: The file whose `flock` claims a process folder.
OWNER_LOCK = ".owner.lock"
#: The folders the sweep considers: the names :data:`PROCESS_FOLDER` takes.
PROCESS_FOLDER_NAME = re.compile(r"p\d+-[0-9a-f]{8}")
#: What a swept folder is renamed to, followed by its name, before it is deleted.
DELETING = ".deleting-"

_lock = threading.Lock()


@dataclass
class _Claim:
    """This process's claim on one process folder."""

    path: str
    #: The open, locked lock file (None: it could not be locked).
    lock: IO[bytes] | None
    #: The :class:`FolderClaim`s not yet released.
    users: int = 0


#: Claimed process folders of this process, by (device, inode): one process may reach a
#: base by several paths (a symbolic link, a relative path), and a second claim of one
#: folder would replace the lock file that guards it (a breaker's find).
_claims: dict[tuple[int, int], _Claim] = {}


class FolderClaim:
    """One tier 2's hold on this process's folder under a base
    (:func:`claim_process_folder`); :meth:`release` when the tier is destroyed."""

    def __init__(self, path: str, identity: tuple[int, int]) -> None:
        #: `<base>/pyflink-ndb/<PROCESS_FOLDER>`, as the first claim spelled it.
        self.path = path
        self._identity = identity
        self._released = False

    def release(self) -> None:
        """Let go (idempotent); the last hold on the folder closes its lock and deletes
        it (a folder that cannot be deleted is left to the next process's sweep)."""
        with _lock:
            if self._released:
                return
            self._released = True
            claim = _claims.get(self._identity)
            if claim is None:
                return
            claim.users -= 1
            if claim.users > 0:
                return
            del _claims[self._identity]
            shutil.rmtree(claim.path, ignore_errors=True)
            if claim.lock is not None:
                claim.lock.close()


def _after_fork() -> None:
    """In a forked child: a folder name and claims of its own. The parent's locks stay
    held by the parent (the child's copies of their descriptors are closed); the child
    must not claim the parent's folder, whose lock would then be the child's alone."""
    global PROCESS_FOLDER, _lock, _claims
    PROCESS_FOLDER = _new_name()
    _lock = threading.Lock()
    for claim in _claims.values():
        if claim.lock is not None:
            claim.lock.close()
    _claims = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def claim_process_folder(base: str) -> FolderClaim:
    """This process's tier-2 folder under `base`, created and claimed (locked) by the first
    hold; every hold also sweeps the folders of processes that are gone (module
    docstring): each subtask attempt's open, a listing and a non-blocking lock try per
    other process's folder.

    :param base: the tier-2 base folder (`state.backend.ndb.local.dir`, Flink's local
        folder or `$TMPDIR`).
    :returns: a hold on `<base>/pyflink-ndb/<PROCESS_FOLDER>` (its `path`), to
        :meth:`~FolderClaim.release` when the tier 2 made in it is destroyed.
    :raises OSError: the folder cannot be created (a failed lock or sweep is only logged).
    """
    root = os.path.join(base, "pyflink-ndb")
    folder = os.path.join(root, PROCESS_FOLDER)
    with _lock:
        os.makedirs(folder, exist_ok=True)
        identity = _identity(os.stat(folder))
        claim = _claims.get(identity)
        if claim is not None:
            claim.users += 1
        else:
            lock = None
            if fcntl is not None:
                try:
                    lock = _claim(folder)
                except OSError as err:
                    # e.g. a file system without flock: unclaimed, so never swept
                    log.warning("pyflink-ndb: cannot lock the tier-2 folder %s (%s): if "
                                "this process is killed, its folder is not deleted by the "
                                "next one", folder, err)
            claim = _claims[identity] = _Claim(folder, lock, 1)
        hold = FolderClaim(claim.path, identity)
        if claim.lock is None:
            return hold
    # Every hold sweeps, not only the first: a TaskManager that outlives another one on
    # the same base takes the failed-over subtasks and would otherwise never sweep while
    # it holds its own folder (a breaker's find: a killed TaskManager's gigabytes stayed
    # for the whole life of the job restarted on the survivor).
    try:
        swept = sweep_orphans(root, wait=False)
    except Exception:  # noqa: BLE001 - a sweep never fails the subtask's open
        log.warning("pyflink-ndb: the sweep of ended processes' tier-2 folders under %s "
                    "failed", root, exc_info=True)
        return hold
    if swept:
        log.info("pyflink-ndb: deleting %d tier-2 folder(s) of ended processes under %s: %s",
                 len(swept), root, ", ".join(swept))
    return hold


def _claim(folder: str) -> IO[bytes]:
    """Lock a temporary file in `folder`, then rename it to :data:`OWNER_LOCK`."""
    temporary = os.path.join(folder, f"{OWNER_LOCK}.{uuid.uuid4().hex[:8]}")
    handle = open(temporary, "wb")  # noqa: SIM115 - held open for the process's life
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(temporary, os.path.join(folder, OWNER_LOCK))
    except BaseException:
        handle.close()
        raise
    return handle


def sweep_orphans(root: str, wait: bool = True) -> list[str]:
    """Take the process folders under `root` (`<base>/pyflink-ndb`) whose owner lock can
    be taken (their process has ended), and delete them and every `.deleting-` folder
    left there. This process's own and unclaimed folders stay.

    :param wait: False: delete in a daemon thread (the folders are renamed to
        `.deleting-<name>` before this returns).
    :returns: the names of the folders taken (empty without `fcntl`).
    """
    if fcntl is None:
        return []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    swept = []
    for name in names:
        path = Path(root, name)
        if name == PROCESS_FOLDER or not PROCESS_FOLDER_NAME.fullmatch(name) \
                or path.is_symlink() or not path.is_dir():
            continue
        try:
            if _identity(path.stat()) in _claims:
                continue  # this process's, under another name (a link to the base)
        except OSError:
            continue  # gone meanwhile (another sweep)
        try:
            # never blocks (a FIFO put there), never follows a link
            fd = os.open(path / OWNER_LOCK,
                         os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # being claimed, or of a version before the claim
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue  # not a lock file of ours
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(path, Path(root, DELETING + name))
        except OSError:
            continue  # its process is alive (or another sweep took it)
        finally:
            os.close(fd)
        swept.append(name)
    doomed = [Path(root, n) for n in os.listdir(root) if n.startswith(DELETING)
              and not Path(root, n).is_symlink() and Path(root, n).is_dir()]
    if doomed:
        if wait:
            _delete(doomed)
        else:
            threading.Thread(target=_delete, args=(doomed,), daemon=True,
                             name="pyflink-ndb-tier2-sweep").start()
    return swept


def _delete(folders: list[Path]) -> None:
    for path in folders:
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            log.warning("pyflink-ndb: could not delete the tier-2 folder %s of an ended "
                        "process", path)
