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


@pytest.fixture(params=["sqlite", "mysql", "mysql-render-process", "mysql-write-process"])
def state_options(request, tmp_path, mysql_url):
    namespace = "e2e_" + uuid.uuid4().hex[:8]
    url = (f"sqlite:///{tmp_path / 'state.sqlite'}" if request.param == "sqlite"
           else mysql_url)
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.cache.max-entries": "500"}
    if request.param == "mysql-render-process":
        options["state.backend.ndb.write.render-process"] = "true"
    if request.param == "mysql-write-process":
        options["state.backend.ndb.write.process"] = "true"
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


def test_demo_passes_every_set_option_to_the_operators(tmp_path: Path):
    """`make demo DEMO_ARGS="--set KEY=VALUE"` (README, "Set up"): a key given with --set
    reaches the job's operators and overrides the demo's own option (here the namespace:
    the state lands in the table of the --set one)."""
    from click.testing import CliRunner

    from jobs.flight_delays import main

    url = f"sqlite:///{tmp_path / 'demo.sqlite'}"
    result = CliRunner().invoke(main, [
        "--url", url, "--namespace", "ignored", "--limit", "3000", "--checkpoint-ms", "300",
        "--set", "state.backend.ndb.namespace=by_set",
        "--set", "state.backend.ndb.read-ahead.records=0"])
    assert result.exit_code == 0, result.output
    assert "table by_set_state" in result.output
    assert "ignored_state" not in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--cache-entries", "-5"], "state.backend.ndb.cache.max-entries=-5 is not allowed: it "
                                "must be at least 1 (default: 10000)."),
    (["--set", "state.backend.ndb.restore-mode=eager"],
     "Did you mean state.backend.ndb.restore.mode?"),
    (["--set", "restore.mode=eager"], "give KEY=VALUE with a state.backend.ndb.* key"),
])
def test_demo_refuses_a_bad_option_before_flink_starts(args: list[str], message: str):
    """A fresh user's report: a bad value surfaced only deep in a Java stack trace."""
    from click.testing import CliRunner

    from jobs.flight_delays import main

    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_demo_reports_an_unreachable_database_in_one_line():
    """A fresh user's report: a wrong port printed the right message after a 60-line
    traceback (the store is checked when the job is built)."""
    from click.testing import CliRunner

    from jobs.flight_delays import main

    result = CliRunner().invoke(main, ["--url", "mysql://root@127.0.0.1:9/test",
                                       "--limit", "10"])
    assert result.exit_code == 1, result.output
    assert "Cannot reach the database at 127.0.0.1:9" in result.output
    assert "Traceback" not in result.output
