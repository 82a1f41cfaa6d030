"""A stop-with-savepoint whose savepoint completed, but whose job did NOT finish (from a
breaker, 2026-12-07: the version that let later jobs subsume a stopped job's retained
checkpoints lost them here).

The keyed subtasks hear that the stop's savepoint completed and close normally, so they
record "ended" in their branch rows (`StateStore.record_end`). But a task downstream fails
while the job is finishing (a Java sink that raises in `close()`, compiled here with
`javac`: a Python UDF's close is not called on a stop without drain in thread mode): the
job does not reach FINISHED. With no restarts (or restarts exhausted) it ends FAILED, and with
RETAIN_ON_CANCELLATION Flink KEEPS its retained checkpoints on disk (checked here). The
store must not treat that run as finished: a later job that restores the newest retained
checkpoint and runs past its retention must leave the older retained checkpoint
restorable.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, unique_namespace
from pyflink.datastream.functions import SinkFunction
from test_restores_across_jobs_flink import (
    cancel,
    check,
    job_checkpoints,
    lines,
    run_until_checkpoint,
)
from test_restores_across_jobs_flink import start as start_job

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 2600


JAVA_SINK = r"""
package breaker;

import java.io.File;
import org.apache.flink.streaming.api.functions.sink.RichSinkFunction;

/** Discards records; its close() fails once the marker file exists (after a pause). */
public class FailOnCloseSink<T> extends RichSinkFunction<T> {
    private final String marker;
    private final long pauseMs;

    public FailOnCloseSink(String marker, long pauseMs) {
        this.marker = marker;
        this.pauseMs = pauseMs;
    }

    @Override
    public void invoke(T value, Context context) {}

    @Override
    public void close() throws Exception {
        super.close();
        if (new File(marker).delete()) {
            Thread.sleep(pauseMs);
            throw new RuntimeException("breaker: failure while the job finishes");
        }
    }
}
"""


@pytest.fixture(scope="module")
def sink_jar(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A jar with breaker.FailOnCloseSink, compiled against Flink's jars."""
    import glob
    import os
    import subprocess

    import pyflink

    work = tmp_path_factory.mktemp("sinkjar")
    src = work / "breaker" / "FailOnCloseSink.java"
    src.parent.mkdir()
    src.write_text(JAVA_SINK)
    lib = os.path.join(os.path.dirname(pyflink.__file__), "lib")
    cp = ":".join(glob.glob(os.path.join(lib, "*.jar")))
    subprocess.run(["javac", "--release", "11", "-cp", cp, "-d", str(work / "classes"),
                    str(src)], check=True)
    jar = work / "breaker-sink.jar"
    subprocess.run(["jar", "cf", str(jar), "-C", str(work / "classes"), "."], check=True)
    return jar.as_uri()


def start(mode: str, p: int, ns: str, url: str, path: Path, *, ckpt_dir: Path, jar: str,
          throttle_ms: float, restore: str | None = None, marker: str | None = None,
          extra: dict[str, str] | None = None) -> Any:
    """test_restores_across_jobs_flink's job, whose sink is a task of its own (parallelism
    1) that fails in close() once `marker` exists: after the keyed subtasks closed."""
    def failing_sink(out: Any) -> None:
        from pyflink.java_gateway import get_gateway

        sink = get_gateway().jvm.breaker.FailOnCloseSink(marker or str(path) + ".never", 4000)
        out.add_sink(SinkFunction(sink)).uid("fail-on-close").set_parallelism(1)

    return start_job(mode, p, ns, url, path, records=RECORDS, throttle_ms=throttle_ms,
                     ckpt_dir=ckpt_dir, restore=restore, extra=extra, jars=[jar],
                     sink=failing_sink, name="breaker-end")


def _ended_branches(url: str, ns: str) -> dict[str, Any]:
    """Per operator: each branch's recorded end, the runs the store lists as stopped, and
    the snapshots."""
    from pyflink_ndb.config import NdbStateOptions
    from pyflink_ndb.stores.base import stopped_runs
    from pyflink_ndb.stores.factory import open_store

    store = open_store(NdbStateOptions(url=url, namespace=ns))
    try:
        out = {}
        for op in store.operators():
            origins = store.branch_origins(op.operator)
            out[op.operator] = ({b: o.ended for b, o in origins.items()},
                                stopped_runs(origins),
                                sorted((r.branch, r.epoch, r.kind[:2], r.status)
                                       for r in store.list_snapshots(op.operator)))
        return out
    finally:
        store.close()


def _root_cause(err: BaseException) -> str:
    """The innermost 'Caused by' line of a Py4J error (the Python exception's text)."""
    text = str(err)
    causes = [x.strip() for x in text.splitlines() if x.strip().startswith("Caused by")]
    return causes[-1][:600] if causes else text[:600]


@pytest.mark.parametrize(("mode", "restarts"), [("process", "none"),
                                              ("switch", "fixed_delay")])
def test_a_stop_whose_job_then_failed_keeps_its_retained_checkpoints_restorable(
        mode, restarts, tmp_path, mysql_url, sink_jar):
    """Job A (p 2, RETAIN_ON_CANCELLATION, num-retained 2) is stopped with a savepoint
    (no drain); the savepoint completes and the keyed subtasks close normally (they record
    "ended"), but the sink task then fails in close(): the stop fails with Flink's
    StopWithSavepointStoppingException ("A savepoint has been created at ..., but the
    corresponding job failed during stopping"), which Flink 1.20 treats as NOT
    recoverable: the job ends FAILED whatever the restart strategy (`none`, and
    `fixed_delay` with 3 attempts: no failover, no new branches). It never reached
    FINISHED, and with RETAIN_ON_CANCELLATION Flink keeps chk-(m-1) and chk-m on disk
    (asserted). Job B starts from chk-m and runs past its retention; job C
    then starts from chk-(m-1), which Flink still has, and must see its exact state.
    Failed with the bug: the store counted A's run as finished (every branch recorded an
    end) and B's retention subsumed chk-(m-1): C failed with CheckpointError. (The
    breaker ran all four combinations of mode and restarts; two are kept.)"""
    ns = unique_namespace("brke")
    ckpt = tmp_path / "ckpt"
    marker = tmp_path / "fail-on-close"
    extra = ({"restart-strategy.type": "fixed-delay",
              "restart-strategy.fixed-delay.attempts": "3",
              "restart-strategy.fixed-delay.delay": "1 s"}
             if restarts == "fixed_delay" else None)
    try:
        a = start(mode, 2, ns, mysql_url, tmp_path / "a.txt", ckpt_dir=ckpt, jar=sink_jar,
                  throttle_ms=4.0, marker=str(marker), extra=extra)
        try:
            run_until_checkpoint(a, ckpt, 5, tmp_path / "a.txt")
            marker.write_text("x")
            stop_error = None
            try:
                a.stop_with_savepoint(False, str(tmp_path / "sp")).result()
            except Exception as err:  # the stop fails: the job did not finish
                stop_error = err
        except BaseException:
            cancel(a)
            raise
        status = None
        try:
            a.get_job_execution_result().result()
            status = "FINISHED"
        except Exception as err:
            status = f"not finished: {_root_cause(err)[:200]}"
            assert "StopWithSavepointStoppingException" in str(err), str(err)[-3000:]
        time.sleep(3)  # let Flink's CheckpointsCleaner act, if it deletes anything
        print("stop:", None if stop_error is None else _root_cause(stop_error))
        print("status:", status)
        print("savepoints on disk:", sorted(p.name for p in (tmp_path / "sp").glob("*")))
        retained = job_checkpoints(ckpt, a)
        print("A's chk on disk:", sorted(retained))
        print("store (branch -> ended, stopped runs):", _ended_branches(mysql_url, ns))
        assert stop_error is not None and status != "FINISHED", \
            "the failure in close() did not keep the job from finishing"
        assert len(retained) == 2, f"Flink keeps a failed job's checkpoints: {retained}"
        older, newest = sorted(retained)
        check(lines(tmp_path / "a.txt"), RECORDS, to_end=False)

        b = start(mode, 2, ns, mysql_url, tmp_path / "b.txt", ckpt_dir=ckpt, jar=sink_jar,
                  throttle_ms=2.0, restore=str(retained[newest]))
        run_until_checkpoint(b, ckpt, newest + 5, tmp_path / "b.txt")
        b.get_job_execution_result().result()
        check(lines(tmp_path / "b.txt"), RECORDS)
        print("store after B:", _ended_branches(mysql_url, ns))
        assert retained[older].exists(), "Flink still has A's older retained checkpoint"

        c = start(mode, 2, ns, mysql_url, tmp_path / "c.txt", ckpt_dir=ckpt, jar=sink_jar,
                  throttle_ms=0.0, restore=str(retained[older]))
        try:
            c.get_job_execution_result().result()
        except Exception as err:
            pytest.fail(f"restoring A's retained chk-{older}, which Flink keeps on disk, "
                        f"failed: {_root_cause(err)}", pytrace=False)
        first_c = check(lines(tmp_path / "c.txt"), RECORDS)
        first_b = min(o[1] for o in lines(tmp_path / "b.txt"))
        assert first_c < first_b  # C restored the older checkpoint
    finally:
        drop_namespace(mysql_url, ns)
