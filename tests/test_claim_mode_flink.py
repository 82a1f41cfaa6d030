"""Flink's claim mode of a restore at job submission reaches the state's retention (real
MiniCluster jobs on MariaDB). Flink 1.20 restores a retained checkpoint in NO_CLAIM mode by
default (`execution.state-recovery.claim-mode`, FLIP-193): the snapshot stays the user's,
so pyflink-ndb keeps it until `pyflink-ndb release`. In CLAIM mode the new job owns it and
Flink deletes it once subsumed: so does pyflink-ndb's retention. The bridge reads the mode
from the job's configuration (`StateBackendHooks.jobOverCluster`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, thread_mode_env, unique_namespace
from pyflink.common import Types, WatermarkStrategy
from pyflink.datastream import KeyedProcessFunction, MapFunction
from pyflink.datastream.connectors.number_seq import NumberSequenceSource
from pyflink.datastream.functions import SinkFunction
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores.factory import open_store

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Slow(MapFunction):
    def map(self, i: Any) -> Any:
        time.sleep(0.002)
        return (f"k{i % 7}", i)


class Count(KeyedProcessFunction):
    def open(self, runtime_context: Any) -> None:
        self.n = runtime_context.get_state(ValueStateDescriptor("n", Types.LONG()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.n.update((self.n.value() or 0) + 1)
        yield value[0]


def start(url: str, namespace: str, ckpt_dir: Path, settings: dict[str, str]) -> Any:
    env = thread_mode_env(1, {
        "execution.checkpointing.interval": "200 ms",
        "execution.checkpointing.num-retained": "1",
        "state.checkpoints.dir": ckpt_dir.as_uri(),
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
        **settings})
    keyed = env.from_source(NumberSequenceSource(0, 10**9), WatermarkStrategy.no_watermarks(),
                            "seq").uid("seq").map(Slow(), output_type=Types.TUPLE(
                                [Types.STRING(), Types.LONG()])).uid("slow") \
        .key_by(lambda r: r[0], key_type=Types.STRING())
    pyflink_ndb.process(keyed, Count(), output_type=Types.STRING(), uid="count", options={
        "state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace}) \
        .add_sink(SinkFunction("org.apache.flink.streaming.api.functions.sink.DiscardingSink"))
    return env.execute_async("claim-mode")


def checkpoints_of(ckpt_dir: Path, client: Any) -> list[Path]:
    job = ckpt_dir / str(client.get_job_id())
    return sorted((m.parent for m in job.glob("chk-*/_metadata")),
                  key=lambda p: int(p.name.split("-")[1]))


def completed_snapshots_of(url: str, namespace: str, client: Any) -> int:
    """Completed checkpoints of the job `client` runs that the store keeps (retention keeps
    the retained ones plus one for readers)."""
    store = open_store(NdbStateOptions(url=url, namespace=namespace))
    try:
        job = str(client.get_job_id())
        return len({r.epoch for r in store.list_snapshots("count")
                    if r.job_id == job and r.status == "completed"})
    finally:
        store.close()


def run_then_cancel(client: Any, until: Any, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        while not until():
            assert time.monotonic() < deadline, "the job did not get that far"
            time.sleep(0.1)
    finally:
        client.cancel().result()
        try:
            client.get_job_execution_result().result()
        except Exception:
            pass


@pytest.mark.parametrize("claim_mode", ["CLAIM", None])
def test_the_claim_mode_decides_whether_the_restored_checkpoint_stays(mysql_url, tmp_path,
                                                                     claim_mode):
    namespace = unique_namespace("claim")
    url, ckpt_dir = mysql_url, tmp_path / "checkpoints"
    try:
        a = start(url, namespace, ckpt_dir, {})
        run_then_cancel(a, lambda: len(checkpoints_of(ckpt_dir, a)) >= 1
                        and completed_snapshots_of(url, namespace, a) >= 2)
        restored = checkpoints_of(ckpt_dir, a)[-1]
        a_job = str(a.get_job_id())
        settings = {"execution.savepoint.path": restored.as_uri()}
        if claim_mode is not None:
            settings["execution.state-recovery.claim-mode"] = claim_mode
        b = start(url, namespace, ckpt_dir, settings)
        # Four checkpoints more than retained (1, plus one for readers, in the store): what
        # b's retention may subsume, it has subsumed by then.
        restored_id = int(restored.name.split("-")[1])
        run_then_cancel(b, lambda: completed_snapshots_of(url, namespace, b) >= 2 and int(
            (checkpoints_of(ckpt_dir, b) or [Path("chk-0")])[-1].name.split("-")[1])
            >= restored_id + 6)
        store = open_store(NdbStateOptions(url=url, namespace=namespace))
        try:
            a_left = {r.epoch for r in store.list_snapshots("count") if r.job_id == a_job}
        finally:
            store.close()
        if claim_mode == "CLAIM":
            assert restored_id not in a_left
        else:  # NO_CLAIM, Flink's default: the user's until released
            assert restored_id in a_left
    finally:
        drop_namespace(url, namespace)
