"""Rescale without moving state: stop the flight job with a savepoint at parallelism 2,
restore it at parallelism 3; the committed state must equal pandas' figures exactly."""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import drop_namespace, pandas_aircraft

from jobs.flight_data import flights_csv
from jobs.flight_delays import (
    OPERATOR_UID,
    AircraftDelays,
    build,
    committed_aircraft,
    make_environment,
)
from pyflink_ndb.config import from_flink_keys
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.testing import Throttled

pytestmark = pytest.mark.flink
LIMIT = 40_000


def wait_for_commit(options, timeout_s: float = 120.0) -> int:
    """Poll the store until the job has committed a checkpoint (the condition a savepoint
    needs), or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    store = open_store(from_flink_keys(options))
    try:
        while time.monotonic() < deadline:
            epoch = store.latest_committed_checkpoint(OPERATOR_UID)
            if epoch is not None:
                return epoch
            time.sleep(0.2)
    finally:
        store.close()
    pytest.fail("no checkpoint completed within the time limit")


def test_savepoint_at_parallelism_2_restore_at_3(tmp_path, mysql_url):
    namespace = "rescale_" + uuid.uuid4().hex[:8]
    options = {"state.backend.ndb.url": mysql_url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.cache.max-entries": "200"}
    csv = flights_csv(LIMIT)
    try:
        env = make_environment(parallelism=2, checkpoint_interval_ms=300)
        build(env, csv, options, function=Throttled(AircraftDelays(), per_record_ms=0.5))
        client = env.execute_async("flight-delays-p2")
        wait_for_commit(options)
        savepoint = client.stop_with_savepoint(False, str(tmp_path / "savepoints")).result()
        part = committed_aircraft(options)
        wanted = pandas_aircraft(csv)
        assert 0 < sum(v[0] for v in part.values()) < sum(v[0] for v in wanted.values())

        env3 = make_environment(parallelism=3, checkpoint_interval_ms=300,
                                extra={"execution.savepoint.path": savepoint})
        build(env3, csv, options)
        env3.execute("flight-delays-p3")
        assert committed_aircraft(options) == wanted
    finally:
        drop_namespace(mysql_url, namespace)
