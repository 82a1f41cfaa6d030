"""End to end on Flink's MiniCluster (thread mode): the flight-delays job on all 336,776
real flights, failing once mid-stream after a completed checkpoint and restarting from
it; the committed per-aircraft state must equal what pandas computes from the same data,
for every aircraft, exactly."""

from __future__ import annotations

import uuid
from pathlib import Path

import pandas as pd
import pytest

from jobs.flight_data import flights_csv, package_data_dir
from jobs.flight_delays import AircraftDelays, build, committed_aircraft, make_environment
from pyflink_ndb.testing import FailOnceAfterCheckpoint

pytestmark = pytest.mark.flink


def expected_from_pandas() -> dict[str, tuple[int, int, int, str]]:
    flights = pd.read_csv(package_data_dir() / "flights.csv.zip",
                          usecols=["tailnum", "dep_delay", "dest"])
    departed = flights.dropna(subset=["tailnum", "dep_delay"])
    grouped = departed.groupby("tailnum", sort=False)
    summary = pd.DataFrame({
        "flights": grouped.size(),
        "total": grouped["dep_delay"].sum(),
        "worst": grouped["dep_delay"].max(),
        "last_dest": grouped["dest"].last(),
    })
    return {tail: (int(r.flights), int(r.total), int(r.worst), str(r.last_dest))
            for tail, r in summary.iterrows()}


@pytest.fixture(params=["sqlite", "mysql"])
def state_options(request, tmp_path, mysql_url):
    namespace = "e2e_" + uuid.uuid4().hex[:8]
    url = (f"sqlite:///{tmp_path / 'state.sqlite'}" if request.param == "sqlite"
           else mysql_url)
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.cache.max-entries": "500"}
    yield options
    if request.param == "mysql":
        from conftest import drop_namespace

        drop_namespace(mysql_url, namespace)


def test_failure_mid_stream_then_exact_state(state_options, tmp_path: Path):
    marker = tmp_path / "failed.txt"
    env = make_environment(parallelism=2, checkpoint_interval_ms=500, restart_attempts=2)
    build(env, flights_csv(), state_options,
          function=FailOnceAfterCheckpoint(AircraftDelays(), str(marker), min_records=2000))
    env.execute("flight-delays-e2e")

    assert marker.exists(), "the injected failure did not happen"
    assert "checkpoints, keys from records: True" in marker.read_text()
    expected = expected_from_pandas()
    actual = committed_aircraft(state_options)
    assert len(expected) == 4037
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    wrong = sorted(t for t in expected.keys() & actual.keys() if expected[t] != actual[t])
    assert (missing, extra, wrong) == ([], [], []), (
        f"{len(missing)} missing, {len(extra)} extra, {len(wrong)} wrong; e.g. "
        f"{[(t, expected.get(t), actual.get(t)) for t in (missing + extra + wrong)[:5]]}")
