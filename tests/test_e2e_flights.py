"""End to end on Flink's MiniCluster (thread mode): the flight-delays job on all 336,776
real flights, failing once mid-stream after a completed checkpoint and restarting from
it; the committed per-aircraft state must equal what pandas computes from the same data,
for every aircraft, exactly."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from conftest import assert_exact, drop_namespace, pandas_aircraft

from jobs.flight_data import flights_csv, package_data_dir
from jobs.flight_delays import AircraftDelays, build, committed_aircraft, make_environment
from pyflink_ndb.testing import FailOnceAfterCheckpoint

pytestmark = pytest.mark.flink


@pytest.fixture(params=["sqlite", "mysql", "mysql-render-process"])
def state_options(request, tmp_path, mysql_url):
    namespace = "e2e_" + uuid.uuid4().hex[:8]
    url = (f"sqlite:///{tmp_path / 'state.sqlite'}" if request.param == "sqlite"
           else mysql_url)
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.cache.max-entries": "500"}
    if request.param == "mysql-render-process":
        options["state.backend.ndb.write.render-process"] = "true"
    yield options
    if request.param != "sqlite":
        drop_namespace(mysql_url, namespace)


def test_failure_while_a_background_write_is_in_flight_then_exact_state(state_options,
                                                                          tmp_path: Path):
    """The task dies while its writer is writing an epoch (issue 7): the half-written
    epoch never becomes state, the restore resumes from the last completed checkpoint,
    and the final committed state is exact."""
    marker = tmp_path / "failed.txt"
    env = make_environment(parallelism=2, checkpoint_interval_ms=300, restart_attempts=2)
    build(env, flights_csv(), state_options,
          function=FailOnceAfterCheckpoint(AircraftDelays(), str(marker), min_records=2000,
                                           throttle_ms=0.2, while_writing=True))
    env.execute("flight-delays-e2e-write-in-flight")

    text = marker.read_text()
    assert "writing checkpoint None" not in text, text
    expected = pandas_aircraft(package_data_dir() / "flights.csv.zip")
    assert_exact(committed_aircraft(state_options), expected)


def test_failure_mid_stream_then_exact_state(state_options, tmp_path: Path):
    marker = tmp_path / "failed.txt"
    env = make_environment(parallelism=2, checkpoint_interval_ms=500, restart_attempts=2)
    build(env, flights_csv(), state_options,
          function=FailOnceAfterCheckpoint(AircraftDelays(), str(marker), min_records=2000))
    env.execute("flight-delays-e2e")

    assert marker.exists(), "the injected failure did not happen"
    assert "checkpoints, keys from records: True" in marker.read_text()
    expected = pandas_aircraft(package_data_dir() / "flights.csv.zip")
    assert len(expected) == 4037
    assert_exact(committed_aircraft(state_options), expected)
