"""The TaskManager's Python threads on one CPU: `state.backend.ndb.python.cpu-pin`.

Every thread that runs Python in a TaskManager in thread mode (each Python operator's task
thread, the background writers) takes the interpreter's one GIL, so together they never
use more than one CPU. Left to the scheduler they run on different CPUs, and every hand-over
of the GIL then wakes a thread on another CPU: PyFlink's embedded operators take and
release the GIL for every record (PEMJA, java-bridge/README.md), so the hand-overs are
many. Measured on part 3's checkpoint job (README, "Thread mode"; 2 CPUs, 2026-12-05):
Flink's RocksDB backend ran 15,300–16,200 records/s as it was and 39,700 with the Python
threads on one CPU; pyflink-ndb on MariaDB 9,800 and 21,500–23,600. The JVM's other
threads (network, Flink's asynchronous checkpoint part, RocksDB's compactions, the garbage
collector), the render process and the database keep every CPU.

Linux's `sched_setaffinity` with pid 0 sets the calling thread's CPUs, not the process's
(sched_setaffinity(2)), and a thread or process inherits its creator's. So whatever a
pinned thread creates starts on the one CPU too: RocksDB's flush and compaction threads
(rocksdict opens the local tier on the task thread), the thread pools that Java fills
lazily from the task thread (Flink's `AsyncOperations` of the asynchronous checkpoint
part, the processing-time timer threads) and the render process. A child process is given
the process's CPUs back when it starts (:func:`release_child`); every other thread of the
process that is on the one CPU without having been pinned on purpose is given them back
right after the backend opens and at every completed checkpoint
(:func:`release_inherited`).

One interpreter, one CPU: the first job of a TaskManager that pins decides, and its pin
stays for the interpreter's life (a later job that says `off` or names another CPU is
pinned as well, with a warning in the log: restart the TaskManager to change it).

This module sits below the layers that use it (the backend pins, the writer's thread and
the render process ask it); it imports nothing of the package at import time.
"""

from __future__ import annotations

import logging
import os
import threading
import types
from typing import Any

log = logging.getLogger(__name__)

#: PyFlink's embedded operations, whose per-record methods pin a task thread that the
#: backend did not open (a key selector's or a map's): (module, class, methods).
EMBEDDED_OPERATIONS = (
    ("pyflink.fn_execution.datastream.embedded.operations", "OneInputOperation",
     ("process_element", "on_timer")),
    ("pyflink.fn_execution.datastream.embedded.operations", "TwoInputOperation",
     ("process_element1", "process_element2", "on_timer")),
)

_pin_lock = threading.Lock()
_pinned_cpu: int | None = None
_all_cpus: frozenset[int] | None = None
#: Native ids of the threads pinned on purpose (:func:`pin_current_thread`), which
#: :func:`release_inherited` leaves alone.
_on_purpose: set[int] = set()
#: Characters of a CPU number at most (the option's check).
MAX_CPU_DIGITS = 5


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup",
                proc_cgroup: str = "/proc/self/cgroup") -> float:
    """CPUs this process may use: the CPUs of its affinity mask, lowered to the smallest
    CPU quota of its cgroup and the cgroup's ancestors (cgroup v2 `cpu.max`, else v1
    `cpu.cfs_quota_us` / `cpu.cfs_period_us`): a container given "2 CPUs" by quota sees
    every host CPU in its mask. `state.backend.ndb.write.process: auto` asks it.

    :param cgroup_root: where the cgroup file system is mounted (tests point it elsewhere).
    :param proc_cgroup: the file naming this process's cgroups (`/proc/self/cgroup`; its
        paths are relative to `cgroup_root`: `/` in a container with a cgroup namespace,
        the unit's path for a systemd `CPUQuota` seen from the host).
    :returns: a count of CPUs, fractional under a fractional quota; at least a small
        positive number; the affinity count where no quota can be read.
    """
    try:
        # The process's CPUs, not the calling thread's: `python.cpu-pin` pins the task
        # thread before it opens the backend that asks (found by a breaker: with both
        # options `auto` resolved to off on 2 CPUs), and the child gets every CPU back.
        cpus = float(len(_all_cpus if _all_cpus is not None else os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        cpus = float(os.cpu_count() or 1)
    quotas = [q for q in (_cgroup_quota(folder) for folder in
                          _cgroup_folders(cgroup_root, proc_cgroup)) if q is not None]
    return min([cpus, *quotas])


def _cgroup_folders(root: str, proc_cgroup: str) -> list[str]:
    """The folders that may hold this process's CPU quota: its cgroup's and each
    ancestor's, for v2 (`0::/path`) and for v1's `cpu` controller (`N:cpu,cpuacct:/path`,
    mounted at `root/cpu`); the mount roots when `proc_cgroup` cannot be read."""
    paths: dict[str, str] = {}
    try:
        for line in open(proc_cgroup).read().splitlines():  # noqa: SIM115
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                paths["v2"] = path
            elif "cpu" in controllers.split(","):
                paths["v1"] = path
    except (OSError, ValueError):
        pass
    folders = []
    for kind, base in (("v2", root), ("v1", os.path.join(root, "cpu"))):
        parts = [p for p in paths.get(kind, "/").split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):
            folders.append(os.path.join(base, *parts[:depth]))
    return folders


def _cgroup_quota(folder: str) -> float | None:
    """The CPU quota set in one cgroup folder, in CPUs, or None (no quota, or unreadable)."""
    try:
        text = open(os.path.join(folder, "cpu.max")).read().split()  # noqa: SIM115
        if len(text) == 2 and text[0] != "max":
            return max(int(text[0]) / int(text[1]), 0.01)
        return None
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        quota = int(open(os.path.join(folder, "cpu.cfs_quota_us")).read())  # noqa: SIM115
        period = int(open(os.path.join(folder, "cpu.cfs_period_us")).read())  # noqa: SIM115
    except (OSError, ValueError):
        return None
    return max(quota / period, 0.01) if quota > 0 and period > 0 else None


def parse_setting(setting: str) -> str | int | None:
    """`state.backend.ndb.python.cpu-pin` read: `"off"`, `"auto"` (any case) or a CPU
    number (ASCII digits, at most :data:`MAX_CPU_DIGITS`); None when it is none of these
    (Flink's keys arrive stripped of blanks). The option's check and :func:`cpu_of_setting`
    both use it."""
    text = setting.lower()
    if text in ("off", "auto"):
        return text
    if text.isdigit() and text.isascii() and len(text) <= MAX_CPU_DIGITS:
        return int(text)
    return None


def cpu_of_setting(setting: str, allowed: set[int] | None = None) -> int | None:
    """The CPU that `state.backend.ndb.python.cpu-pin` names on this machine.

    :param setting: `off` (None), `auto` (one of the process's allowed CPUs, chosen by the
        process id so that TaskManagers on one host spread out) or a CPU number.
    :param allowed: the CPUs the process may run on; None: :func:`os.sched_getaffinity`.
    :returns: the CPU, or None for `off` and where threads cannot be pinned (not Linux).
    :raises ConfigurationError: a CPU number outside `allowed`.
    """
    from pyflink_ndb.errors import ConfigurationError

    parsed = parse_setting(setting)
    if parsed == "off" or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    if parsed == "auto":
        return cpus[os.getpid() % len(cpus)]
    if parsed not in cpus:
        raise ConfigurationError(
            f"state.backend.ndb.python.cpu-pin={setting} names a CPU this TaskManager "
            f"may not run on (allowed: {', '.join(map(str, cpus))}): name one of them, or "
            "`auto`.")
    assert isinstance(parsed, int)
    return parsed


def pin_python_threads(cpu: int) -> bool:
    """Run every thread of this interpreter that runs Python on `cpu`: the calling thread
    now, the background writers when they start (:func:`pin_current_thread`) and the task
    thread of every other PyFlink Python operator at its next record or timer (the methods
    of :data:`EMBEDDED_OPERATIONS`, patched once per interpreter; each operation then calls
    its own method again directly).

    :returns: True; False when an earlier call pinned to another CPU (that one stays: one
        interpreter, one CPU; the calling thread is pinned to it).
    """
    global _pinned_cpu, _all_cpus
    with _pin_lock:
        if _pinned_cpu is None:
            _all_cpus = frozenset(os.sched_getaffinity(0))
            _pinned_cpu = cpu
            _patch_embedded_operations()
            log.info("pyflink-ndb: the interpreter's Python threads run on CPU %d "
                     "(state.backend.ndb.python.cpu-pin)", cpu)
        same = _pinned_cpu == cpu
    pin_current_thread()
    return same


def pinned_cpu() -> int | None:
    """The CPU this interpreter's Python threads are pinned to; None: not pinned."""
    return _pinned_cpu


def pin_current_thread() -> None:
    """Pin the calling thread to the CPU of :func:`pin_python_threads`; nothing when no
    call pinned the interpreter (the default)."""
    if _pinned_cpu is not None:
        _on_purpose.add(threading.get_native_id())
        os.sched_setaffinity(0, {_pinned_cpu})


def forget_current_thread() -> None:
    """The calling thread pinned itself and ends (a writer going idle): its native id may
    be reused by a thread that :func:`release_inherited` must release."""
    _on_purpose.discard(threading.get_native_id())


def release_inherited() -> int:
    """Give every CPU back to each thread of this process that runs on the pinned CPU only
    without having been pinned on purpose (it inherited the pin from the thread that
    created it: module docstring). Nothing when not pinned or where `/proc` has no task
    list. Cost: two system calls per thread of the process (a JVM has a few hundred).

    :returns: how many threads were released.
    """
    cpu, everything = _pinned_cpu, _all_cpus
    if cpu is None or everything is None:
        return 0
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return 0
    released = 0
    for tid in tids:
        if tid in _on_purpose:
            continue
        try:
            if os.sched_getaffinity(tid) == {cpu}:
                os.sched_setaffinity(tid, everything)
                released += 1
        except OSError:  # the thread ended meanwhile
            continue
    if released:
        log.debug("pyflink-ndb: %d threads that inherited the Python threads' CPU given "
                  "every CPU back", released)
    return released


def release_child(pid: int) -> None:
    """Give a child process started by a pinned thread (which inherits the thread's one
    CPU) every CPU the TaskManager had; nothing when threads are not pinned.

    :raises OSError: the process is gone (the caller's own checks see it too)."""
    if _pinned_cpu is not None and _all_cpus is not None:
        os.sched_setaffinity(pid, _all_cpus)


def _patch_embedded_operations() -> None:
    import importlib

    for module_name, class_name, methods in EMBEDDED_OPERATIONS:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):  # another apache-flink: nothing to patch
            log.warning("pyflink-ndb: %s.%s not found: only the backend's own threads run "
                        "on the pinned CPU", module_name, class_name)
            continue
        for name in methods:
            original = cls.__dict__.get(name)
            if original is not None and not getattr(original, "_pins_thread", False):
                setattr(cls, name, _pinning(name, original))


def _pinning(name: str, original: Any) -> Any:
    def first_call(self: Any, *args: Any) -> Any:
        pin_current_thread()
        # This operation's later calls skip the patch (an instance attribute shadows it).
        setattr(self, name, types.MethodType(original, self))
        return original(self, *args)

    first_call._pins_thread = True  # type: ignore[attr-defined]
    first_call.__name__ = name
    return first_call
