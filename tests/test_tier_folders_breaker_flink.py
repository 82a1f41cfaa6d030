"""Tier-2 process folders with a real local Flink job (a breaker's attack that found the
sweep sound here): a job in a process (and MiniCluster JVM) of its own, with
`state.backend.ndb.local.dir`, fails, restarts once (its failed attempts park their tiers
for task-local recovery) and then fails for good. Another process sweeps the same base
over and over while the job runs: nothing of the live JVM may go. Once the job's JVM has
ended, the next process's open takes the folder it left (the known leak of the JVM exit
hook in a local run that failed for good, README `local.recovery`), and the sweep after
it leaves nothing of the job (the probe's own folder included: its process ended too).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import drop_namespace, unique_namespace

from pyflink_ndb.tiers import folders

pytestmark = pytest.mark.flink

ROOT = Path(__file__).parent.parent

#: A keyed job with tier 2 under argv[3] that fails after 3,000 records in each attempt:
#: one restart (2 s later), then it fails for good. Prints FAILED when `execute` raised.
JOB = textwrap.dedent("""
    import sys, time
    from typing import Any
    import cloudpickle
    from pyflink.common import Configuration, Types, WatermarkStrategy
    from pyflink.datastream import KeyedProcessFunction, StreamExecutionEnvironment
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.datastream.functions import SinkFunction
    from pyflink.datastream.state import ValueStateDescriptor
    import pyflink_ndb

    url, namespace, base = sys.argv[1:4]

    class FailLate(KeyedProcessFunction):
        def open(self, ctx: Any) -> None:
            self.v = ctx.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
            self.n = 0

        def process_element(self, value: Any, ctx: Any) -> Any:
            self.v.update(b"x" * 1000)
            self.n += 1
            if self.n % 100 == 0:
                time.sleep(0.02)
            if self.n >= 3000:
                raise RuntimeError("breaker: this attempt fails")
            yield value

    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    config.set_string("restart-strategy.type", "fixed-delay")
    config.set_string("restart-strategy.fixed-delay.attempts", "1")
    config.set_string("restart-strategy.fixed-delay.delay", "2 s")
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(2)
    env.enable_checkpointing(200)
    stream = env.from_source(NumberSequenceSource(0, 10**9),
                             WatermarkStrategy.no_watermarks(), "seq")
    out = pyflink_ndb.process(
        stream.key_by(lambda r: r % 50000, key_type=Types.LONG()), FailLate(),
        output_type=Types.LONG(), uid="fail",
        options={"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
                 "state.backend.ndb.cache.max-entries": "100",
                 "state.backend.ndb.local.dir": base})
    out.add_sink(SinkFunction(
        "org.apache.flink.streaming.api.functions.sink.DiscardingSink"))
    try:
        env.execute("breaker-tier-folders")
    except Exception as err:
        print("FAILED", type(err).__name__, flush=True)
""")


def pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_a_job_that_fails_for_good_leaves_nothing_after_the_next_process_and_nothing_live_is_swept(  # noqa: E501
        tmp_path: Path, mysql_url: str) -> None:
    base = tmp_path / "base"
    root = base / "pyflink-ndb"
    namespace = unique_namespace("brkf")
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, mysql_url, namespace, str(base)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
    swept_while_running: list[str] = []
    seen: set[str] = set()
    attempts: set[str] = set()
    mine: str | None = None
    try:
        deadline = time.time() + 150
        while job.poll() is None:
            assert time.time() < deadline, "the job did not end"
            if mine is None and root.is_dir():
                # another process opens tier 2 under the same base: claim and sweep
                mine = folders.claim_process_folder(str(base)).path
            swept_while_running += folders.sweep_orphans(str(root))
            for folder in root.glob("p*-*") if root.is_dir() else []:
                if folder.name != folders.PROCESS_FOLDER:
                    seen.add(folder.name)
                    attempts.update(p.name for p in folder.glob("*/*"))
            time.sleep(0.05)
        out, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
        drop_namespace(mysql_url, namespace)
    assert "FAILED" in out, err[-3000:]
    assert mine is not None and seen, (out, err[-3000:])
    # nothing was swept while the job's JVM lived (its tiers and parked tiers stayed)
    assert swept_while_running == [], (swept_while_running, sorted(attempts))
    # both subtasks had a tier in each of the two attempts
    assert {a.rsplit("-", 2)[0] for a in attempts} >= {"fail-0", "fail-1"}, attempts
    assert any(a.split("-")[2] == "1" for a in attempts), attempts

    # the job's JVM ends (the embedded interpreter's pid names its folder)
    pids = {int(name[1:].split("-")[0]) for name in seen}
    deadline = time.time() + 30
    while any(pid_alive(p) for p in pids):
        assert time.time() < deadline, f"the job's JVM {pids} did not end"
        time.sleep(0.2)
    # the next process under the same base (a fresh interpreter): its open takes what
    # the ended JVM left (renamed to .deleting-<name>, deleted in the background)
    probe = subprocess.run(
        [sys.executable, "-c",
         "import sys; from pyflink_ndb.tiers import folders; "
         "print(folders.claim_process_folder(sys.argv[1]).path)", str(base)],
        capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert probe.returncode == 0, probe.stderr[-3000:]
    probe_folder = Path(probe.stdout.strip()).name
    left = sorted(p.name for p in root.iterdir() if not p.name.startswith(folders.DELETING))
    assert left == sorted([folders.PROCESS_FOLDER, probe_folder]), (left, sorted(seen))
    # a deletion the probe's end cut short is finished by the next sweep
    folders.sweep_orphans(str(root))
    left = sorted(p.name for p in root.iterdir())
    assert left == sorted([folders.PROCESS_FOLDER]), (left, sorted(seen))
    assert os.path.isdir(mine)
