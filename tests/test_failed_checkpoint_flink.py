"""A background write that fails fails its checkpoint as Flink defines it (issue 7, item 2).

The database goes away (a TcpProxy in front of MariaDB, stopped) while the job runs, for
longer than the retry deadline: the epoch's write fails, the bridge's future for the
asynchronous part fails, and Flink declines the checkpoint and counts it against
`execution.checkpointing.tolerable-failed-checkpoints` (Flink's CheckpointFailureManager:
an exception of the asynchronous phase is CHECKPOINT_ASYNC_EXCEPTION, a counted reason).
With the failures tolerated, the job goes on, a later checkpoint completes once the
database is back (the failed epoch's entries go into it) and the final committed state is
exact; with none tolerated, the first failed checkpoint fails the job (no restart here).
A fresh start (`on-fresh-start: truncate`) and tier 2 keep the task thread's reads off the
database, so only the background writes meet the outage.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, free_port, thread_mode_env, unique_namespace
from pyflink.common import Types, WatermarkStrategy
from pyflink.datastream import CheckpointingMode
from pyflink.datastream.connectors.file_system import FileSource, StreamFormat
from tcp_proxy import TcpProxy, proxied_mysql_url

import pyflink_ndb
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.faults import (
    OPERATOR_UID,
    RECORD_TYPE,
    ParseSequence,
    SequenceCheck,
    check_sequence_state,
    read_sequence_state,
    write_sequence_input,
)
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.stores.mysql import parse_mysql_url

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Database options: an outage longer than the deadline fails the write within about 1 s.
DB_OPTIONS = {"state.backend.ndb.db.retry.deadline-ms": "800",
              "state.backend.ndb.db.retry.max-backoff-ms": "200",
              "state.backend.ndb.db.socket-timeout-ms": "2000",
              "state.backend.ndb.on-fresh-start": "truncate"}
OUTAGE_S = 3.0


def counts(port: int, job_id: str) -> dict[str, int]:
    """Flink's checkpoint counts of the job (REST `/jobs/:id/checkpoints`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/jobs/{job_id}/checkpoints",
                                timeout=5) as response:
        return dict(json.load(response)["counts"])


def start_job(input_path: Path, url: str, namespace: str, tolerable: int,
              port: int) -> Any:
    env = thread_mode_env(2, {
        "rest.port": str(port), "rest.bind-port": str(port),
        "execution.checkpointing.tolerable-failed-checkpoints": str(tolerable)})
    env.enable_checkpointing(300, CheckpointingMode.EXACTLY_ONCE)
    source = FileSource.for_record_stream_format(
        StreamFormat.text_line_format(), str(input_path)).build()
    records = (env.from_source(source, WatermarkStrategy.no_watermarks(), "sequences")
               .map(ParseSequence(throttle_ms=3.0), output_type=RECORD_TYPE))
    checked = pyflink_ndb.process(
        records.key_by(lambda r: r[0], key_type=Types.STRING()), SequenceCheck(),
        output_type=Types.TUPLE([Types.STRING(), Types.LONG()]), uid=OPERATOR_UID,
        options={"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
                 **DB_OPTIONS})
    from pyflink.datastream.connectors import Sink
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm
    checked.sink_to(Sink(jvm.org.apache.flink.streaming.api.functions.sink.v2
                         .DiscardingSink()))
    return env.execute_async(f"failed-checkpoint-{namespace}")


def wait_for(predicate: Any, what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.time() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def outage_during_job(tmp_path: Path, mysql_url: str, tolerable: int
                      ) -> tuple[Any, str, int, dict[str, int], dict[str, int], TcpProxy]:
    """Run the job through a proxy, stop the proxy for :data:`OUTAGE_S` once a checkpoint
    completed; returns (job client, namespace, REST port, counts right after the outage,
    the model, the proxy, running again: the caller stops it when the job is over)."""
    model = write_sequence_input(tmp_path / "input.txt", keys=60, min_per_key=80,
                                 max_per_key=120, seed=7)  # about 6,000 records, 9+ s
    server = parse_mysql_url(mysql_url)
    proxy = TcpProxy(server["host"], server["port"]).start()
    url = proxied_mysql_url(server, proxy)
    namespace = unique_namespace("fcp")
    port = free_port()
    client = start_job(tmp_path / "input.txt", url, namespace, tolerable, port)
    job_id = str(client.get_job_id())
    try:
        wait_for(lambda: _counts_or_none(port, job_id, "completed"), "a first checkpoint")
        proxy.stop()
        time.sleep(OUTAGE_S)
        after_outage = _counts_or_none(port, job_id, None) or {}
    finally:
        proxy.start()
    return client, namespace, port, after_outage, model, proxy


def _counts_or_none(port: int, job_id: str, key: str | None) -> dict[str, int] | None:
    try:
        c = counts(port, job_id)
    except OSError:  # the REST endpoint is not up yet, or the job ended
        return None
    return c if key is None or c.get(key) else None


def test_a_failed_background_write_fails_the_checkpoint_and_a_tolerated_one_loses_nothing(
        tmp_path, mysql_url):
    client, namespace, port, after_outage, model, proxy = outage_during_job(
        tmp_path, mysql_url, tolerable=100)
    job_id = str(client.get_job_id())
    try:
        assert after_outage.get("failed", 0) >= 1, after_outage
        completed_then = after_outage["completed"]
        # Back: a later checkpoint completes (it carries the failed epochs' entries).
        wait_for(lambda: (_counts_or_none(port, job_id, "completed") or {}).get(
            "completed", 0) > completed_then, "a checkpoint after the outage")
        client.get_job_execution_result().result()  # finished, not failed
        store = open_store(NdbStateOptions(url=mysql_url, namespace=namespace))
        try:
            verdict = check_sequence_state(read_sequence_state(store), model)
        finally:
            store.close()
        assert verdict.exact, verdict
        assert verdict.records == sum(model.values())
    finally:
        proxy.stop()
        drop_namespace(mysql_url, namespace)


def test_a_failed_background_write_counts_against_the_tolerable_failures(
        tmp_path, mysql_url):
    client, namespace, _, _, _, proxy = outage_during_job(
        tmp_path, mysql_url, tolerable=0)
    try:
        with pytest.raises(Exception) as failure:
            client.get_job_execution_result().result()
        assert "Exceeded checkpoint tolerable failure threshold" in str(failure.value), \
            str(failure.value)[-3000:]
    finally:
        proxy.stop()
        drop_namespace(mysql_url, namespace)
