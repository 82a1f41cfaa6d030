"""`state.backend.ndb.python.cpu-pin` (pyflink_ndb.cpu_pin): the TaskManager's Python
threads on one CPU.

The option's values; what pinning does to threads and child processes (in a fresh
interpreter each time: pinning is once per interpreter and patches PyFlink's embedded
operations); and on Flink's MiniCluster, that every thread that ran Python for the job
(the source's key selector, the keyed function's task threads, the background writers)
ran on the one CPU while the job's state stayed exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Types
from pyflink.datastream import (
    CheckpointingMode,
    KeyedProcessFunction,
)
from pyflink.datastream.functions import KeySelector
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb
from pyflink_ndb import cpu_pin
from pyflink_ndb.config import NdbStateOptions, from_flink_keys
from pyflink_ndb.cpu_pin import cpu_of_setting
from pyflink_ndb.errors import ConfigurationError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = sorted(os.sched_getaffinity(0))


# -- the option -----------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["off", "auto", "0", "3", "AUTO", "Off", " 1 "])
def test_accepted_values(value: str) -> None:
    options = from_flink_keys({"state.backend.ndb.python.cpu-pin": value})
    assert options.python_cpu_pin == value.strip()
    assert NdbStateOptions().python_cpu_pin == "off"  # the default leaves threads alone


@pytest.mark.parametrize("value", ["on", "-1", "1.5", "", "٣", "+1", "9" * 6, "9" * 5000])
def test_refused_values_name_the_key_and_the_choices(value: str) -> None:
    with pytest.raises(ConfigurationError, match=r"python\.cpu-pin.*`off`, `auto` or a CPU"):
        from_flink_keys({"state.backend.ndb.python.cpu-pin": value})


def test_cpu_of_setting() -> None:
    assert cpu_of_setting("off") is None
    assert cpu_of_setting("auto") in ALLOWED
    assert cpu_of_setting("auto", {5, 7}) == [5, 7][os.getpid() % 2]  # spread by process
    assert cpu_of_setting("7", {5, 7}) == 7
    assert cpu_of_setting("AUTO", {5}) == 5 and cpu_of_setting("Off") is None
    with pytest.raises(ConfigurationError, match=r"CPU this TaskManager may not run on "
                                                  r"\(allowed: 5, 7\)"):
        cpu_of_setting("6", {5, 7})
    with pytest.raises(ConfigurationError, match="python.cpu-pin"):  # not a ValueError
        cpu_of_setting("9" * 5000, {5, 7})


# -- threads and child processes, in a fresh interpreter -------------------------------------
SCRIPT = """
import json, os, subprocess, sys, threading
from pyflink_ndb import cpu_pin
from pyflink_ndb.checkpoint.writer import BackgroundWriter, Job
from pyflink_ndb.cpu_pin import pin_python_threads, release_child, release_inherited


class OneInputOperation:  # PyFlink's embedded operation's shape (it imports only in PEMJA)
    def __init__(self, open_func, close_func, process_element_func):
        self._process_element_func = process_element_func

    def process_element(self, value):
        return self._process_element_func(value)


cpu_pin.EMBEDDED_OPERATIONS = (("__main__", "OneInputOperation", ("process_element",)),)

cpu = int(sys.argv[1])
everything = sorted(os.sched_getaffinity(0))
seen = {}

def affinity():
    return sorted(os.sched_getaffinity(0))

# An operation opened before the pinning (a map's task thread, say).
operation = OneInputOperation(lambda: None, lambda: None, lambda v: (v, affinity()))
def before_and_after(name):
    seen[name + " before its record"] = affinity()
    seen[name + " record"] = operation.process_element(1)[1]
    seen[name + " patched once"] = "process_element" in operation.__dict__
    seen[name + " second record"] = operation.process_element(2)[1]

pinner = threading.Thread(target=lambda: seen.update(
    pinned=pin_python_threads(cpu), pinner=affinity(),
    again=pin_python_threads((cpu + 1) % (max(everything) + 1)), pinner_after=affinity()))
pinner.start(); pinner.join()
seen["main thread"] = affinity()  # never ran an operation: left alone
other = threading.Thread(target=before_and_after, args=("operation thread",))
other.start(); other.join()

# A writer thread started by an unpinned thread pins itself.
writer = BackgroundWriter("w", 1 << 20)
done = threading.Event()
writer.submit(Job(run=lambda: (seen.update(writer=affinity()), done.set()), name="probe"))
done.wait(10)
writer.close()

# A thread that a pinned thread creates inherits the pin (a JVM thread pool filled from the
# task thread, RocksDB's threads); release_inherited gives it every CPU back, not the
# threads pinned on purpose.
def creator():
    pin_python_threads(cpu)
    inherited = threading.Event(); release = threading.Event(); after = threading.Event()
    def plain():
        seen["inherited"] = affinity(); inherited.set()
        release.wait(10); seen["inherited after release"] = affinity(); after.set()
    threading.Thread(target=plain).start()
    inherited.wait(10)
    seen["released"] = release_inherited()
    seen["creator after release"] = affinity()
    release.set(); after.wait(10)
threading.Thread(target=creator).start()
import time; time.sleep(0.5)
while threading.active_count() > 1: time.sleep(0.05)

# A child started by a pinned thread gets every CPU back.
def start_child():
    os.sched_setaffinity(0, {cpu})
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    seen["child before"] = sorted(os.sched_getaffinity(child.pid))
    release_child(child.pid)
    seen["child after"] = sorted(os.sched_getaffinity(child.pid))
    child.kill(); child.wait()
starter = threading.Thread(target=start_child)
starter.start(); starter.join()
print(json.dumps({"everything": everything, **seen}))
"""


@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs a machine with two CPUs or more")
def test_pinning_threads_operations_writers_and_children() -> None:
    cpu = ALLOWED[-1]
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(cpu)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    everything = seen["everything"]
    assert seen["pinned"] is True and seen["pinner"] == [cpu]
    # One interpreter, one CPU: a second call names another CPU, the first one stays.
    assert seen["again"] is False and seen["pinner_after"] == [cpu]
    assert seen["main thread"] == everything
    assert seen["operation thread before its record"] == everything
    assert seen["operation thread record"] == [cpu]  # pinned before its function ran
    assert seen["operation thread patched once"] is True
    assert seen["operation thread second record"] == [cpu]
    assert seen["writer"] == [cpu]
    assert seen["child before"] == [cpu] and seen["child after"] == everything
    assert seen["inherited"] == [cpu] and seen["inherited after release"] == everything
    assert seen["released"] >= 1 and seen["creator after release"] == [cpu]


def test_nothing_is_pinned_by_default() -> None:
    """The writer's own call is a no-op while no one pinned the interpreter."""
    code = ("import os, threading; from pyflink_ndb.cpu_pin import pin_current_thread;"
            "pin_current_thread(); print(sorted(os.sched_getaffinity(0)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ALLOWED


# -- on Flink's MiniCluster ------------------------------------------------------------------
KEYS = 500
PER_KEY = 4


def _affinity_report(path: str, who: str) -> None:
    """Append this thread's name, native id and CPUs to `path` (one JSON line)."""
    with open(path, "a") as out:
        out.write(json.dumps([who, threading.current_thread().name,
                              threading.get_native_id(),
                              sorted(os.sched_getaffinity(0))]) + "\n")


class ReportingKey(KeySelector):
    """The key (`value % KEYS`); reports its thread's CPUs at the first record of each
    thread (the source's Python key-selector operator) and at every 100th. In an
    interpreter that ran a job before, the source's first records may come before the
    keyed subtask's bind decides the pin: its thread pins itself at its next record."""

    def __init__(self, report: str) -> None:
        self.report = report
        self.seen: dict[int, int] = {}

    def get_key(self, value: int) -> int:
        thread = threading.get_native_id()
        n = self.seen[thread] = self.seen.get(thread, 0) + 1
        if n % 100 == 1:
            _affinity_report(self.report, "key selector")
        return value % KEYS


class Counting(KeyedProcessFunction):
    """A count per key; reports its task thread's CPUs at open, at its first record and at
    close, and every 50 records the CPUs of the background writers' threads then alive."""

    def __init__(self, report: str) -> None:
        self.report = report

    def open(self, runtime_context: Any) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))
        self.records = 0
        _affinity_report(self.report, "keyed open")

    def process_element(self, value: int, ctx: Any) -> Any:
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        self.records += 1
        if self.records == 1:
            _affinity_report(self.report, "keyed first record")
        if self.records % 50 == 0:
            self._report_writers()
        time.sleep(0.002)  # 2 s per subtask: checkpoints every 0.3 s, writers at work
        yield ctx.get_current_key(), n

    def _report_writers(self) -> None:
        with open(self.report, "a") as out:
            for thread in threading.enumerate():
                if thread.name.startswith("pyflink-ndb-writer") and thread.native_id:
                    out.write(json.dumps(["writer", thread.name, thread.native_id,
                                          sorted(os.sched_getaffinity(thread.native_id))])
                              + "\n")

    def close(self) -> None:
        _affinity_report(self.report, "keyed close")
        self._report_writers()
        with open(self.report, "a") as out:  # the JVM's own threads, by their names
            for tid in os.listdir("/proc/self/task"):
                try:
                    name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
                    cpus = sorted(os.sched_getaffinity(int(tid)))
                except OSError:
                    continue
                out.write(json.dumps(["jvm thread", name, int(tid), cpus]) + "\n")


@pytest.mark.flink
@pytest.mark.skipif(len(ALLOWED) < 2, reason="needs a machine with two CPUs or more")
def test_a_pinned_job_runs_every_python_thread_on_one_cpu(tmp_path, mysql_url) -> None:
    namespace = unique_namespace("pin")
    report = tmp_path / "threads.jsonl"
    cpu = ALLOWED[-1]
    env = thread_mode_env(2)
    env.enable_checkpointing(300, CheckpointingMode.EXACTLY_ONCE)
    numbers = env.from_collection(list(range(KEYS * PER_KEY)), type_info=Types.LONG())
    keyed = numbers.key_by(ReportingKey(str(report)), key_type=Types.LONG())
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.on-fresh-start": "truncate",
               "state.backend.ndb.python.cpu-pin": str(cpu)}
    out = pyflink_ndb.process(keyed, Counting(str(report)),
                              output_type=Types.TUPLE([Types.LONG(), Types.LONG()]),
                              uid="pinned-counts", options=options)
    try:
        with out.execute_and_collect() as results:
            outputs = list(results)
    finally:
        drop_namespace(mysql_url, namespace)

    finals: dict[int, int] = {}
    for key, n in outputs:
        finals[key] = max(finals.get(key, 0), n)
    assert len(outputs) == KEYS * PER_KEY
    assert finals == {k: PER_KEY for k in range(KEYS)}  # the state stayed exact

    lines = [json.loads(line) for line in report.read_text().splitlines()]
    by_role: dict[str, list[list[int]]] = {}
    selector_last: dict[int, list[int]] = {}
    for role, _name, tid, cpus in lines:
        by_role.setdefault(role, []).append(cpus)
        if role == "key selector":
            selector_last[tid] = cpus
    # bind() pinned the keyed task threads before open; the writers when they started;
    # the key selector's thread at its first record after the bind (the patched embedded
    # operation): its last report is pinned.
    for role in ("keyed open", "keyed first record", "keyed close", "writer"):
        assert by_role.get(role), f"no report from {role}: {lines}"
        assert all(cpus == [cpu] for cpus in by_role[role]), (role, lines)
    assert selector_last and all(cpus == [cpu] for cpus in selector_last.values()), lines
    assert len(by_role["keyed open"]) == 2
    # What a pinned thread started and does not run Python got every CPU back: RocksDB's
    # flush and compaction threads (the local tier opened on the task thread: released
    # right after the open) and the threads of Flink's asynchronous checkpoint part
    # (filled lazily from the task thread: released at each completed checkpoint, so one
    # started after a subtask's last completion may still be on the CPU at its close).
    threads = [(name, cpus) for role, name, _tid, cpus in lines if role == "jvm thread"]
    rocksdb = [cpus for name, cpus in threads if name.startswith("rocksdb:")]
    assert rocksdb and all(cpus == ALLOWED for cpus in rocksdb), threads
    asynchronous = [cpus for name, cpus in threads if name.startswith("AsyncOperations")]
    assert sum(cpus == ALLOWED for cpus in asynchronous) >= 1, threads
    assert sum(cpus == [cpu] for cpus in asynchronous) <= 2, threads  # one per subtask


@pytest.mark.parametrize(("files", "expected"), [
    ({}, None),  # no cgroup files: the affinity mask alone
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "50000 100000\n"}, 0.5),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1.0),
])
def test_usable_cpus_is_the_affinity_mask_lowered_to_the_cgroup_quota(
        tmp_path: Path, files: dict[str, str], expected: float | None) -> None:
    """`write.process: auto` counts the CPUs a TaskManager may use: a container given a
    CPU quota sees every host CPU in its affinity mask."""
    _assert_usable_cpus(tmp_path, files, None, expected)


@pytest.mark.parametrize(("proc", "files", "expected"), [
    # v2, a systemd unit's CPUQuota seen from the host: the quota of the unit's folder
    ("0::/system.slice/tm.service\n", {"system.slice/tm.service/cpu.max": "50000 100000"},
     0.5),
    # v2: the smallest quota of the cgroup and its ancestors
    ("0::/a/b\n", {"a/cpu.max": "50000 100000", "a/b/cpu.max": "300000 100000"}, 0.5),
    # v1: the cpu controller's path, under the cpu mount
    ("4:memory:/x\n3:cpu,cpuacct:/yarn/c1\n",
     {"cpu/yarn/c1/cpu.cfs_quota_us": "100000", "cpu/yarn/c1/cpu.cfs_period_us": "100000"},
     1.0),
    # `/` (a container with a cgroup namespace): the mount root's files
    ("0::/\n", {"cpu.max": "150000 100000"}, 1.5),
    ("0::/a\n", {"a/cpu.max": "max 100000"}, None),
])
def test_usable_cpus_reads_the_quota_of_the_process_cgroup_and_its_ancestors(
        tmp_path: Path, proc: str, files: dict[str, str], expected: float | None) -> None:
    """A quota on a nested cgroup (the breaker's probe: systemd's `CPUQuota`, YARN) was
    not read: only the mount root's files were."""
    _assert_usable_cpus(tmp_path, files, proc, expected)


def _assert_usable_cpus(root: Path, files: dict[str, str], proc: str | None,
                        expected: float | None) -> None:
    """`usable_cpus` on a fake cgroup tree at `root` (`files`: path → text) and a fake
    `/proc/self/cgroup` (`proc`; None: none) is the affinity mask lowered to `expected`."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    if proc is not None:
        (root / "proc-cgroup").write_text(proc)
    mask = float(len(os.sched_getaffinity(0)))
    wanted = mask if expected is None else min(mask, expected)
    assert cpu_pin.usable_cpus(str(root), str(root / "proc-cgroup")) == wanted


def test_usable_cpus_counts_the_process_cpus_after_the_thread_is_pinned() -> None:
    """Found by a breaker: `python.cpu-pin` pins the task thread before the backend opens,
    and `usable_cpus()` then counted the pinned thread's one CPU, so `write.process: auto`
    turned the write process off on 2 CPUs whenever pinning was on."""
    script = (
        "import os\n"
        "from pyflink_ndb import cpu_pin\n"
        "before = cpu_pin.usable_cpus()\n"
        "cpu_pin.pin_python_threads(min(os.sched_getaffinity(0)))\n"
        "print(before, len(os.sched_getaffinity(0)), cpu_pin.usable_cpus())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    before, thread_cpus, after = float(out[0]), int(out[1]), float(out[2])
    assert thread_cpus == 1  # the thread is pinned
    assert after == before == float(len(os.sched_getaffinity(0)))
