"""Shared fixtures: stores (SQLite and the MySQL-protocol server), tier option sets.

The MySQL-protocol server comes from `PYFLINK_NDB_TEST_MYSQL_URL` (default
`mysql://root@127.0.0.1:3306/test`). Tests never skip for a missing database: when it
cannot be reached, every test that needs it fails with a message that says so.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from pyflink_ndb.checkpoint import protocol
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores import StateStore, open_store
from pyflink_ndb.stores.mysql import parse_mysql_url
from pyflink_ndb.testing import crash_open_subtasks, open_subtasks
from pyflink_ndb.tiers import handover

DEFAULT_MYSQL_URL = "mysql://root@127.0.0.1:3306/test"

#: Option sets of the tiers: every entry crosses RocksDB and the store (cache of 1), the
#: same without RocksDB (tier 1 straight onto the store), and a cache holding everything.
TIER_OPTIONS: dict[str, NdbStateOptions] = {
    "cache1-local": NdbStateOptions(cache_max_entries=1, local_enabled=True),
    "cache1-nolocal": NdbStateOptions(cache_max_entries=1, local_enabled=False),
    "cache10k": NdbStateOptions(cache_max_entries=10_000),
}

STORE_KINDS = [pytest.param("sqlite", id="sqlite"),
               pytest.param("mysql", id="mysql", marks=pytest.mark.mysql)]


def unique_namespace(prefix: str = "t") -> str:
    """A fresh table prefix (valid namespace: [a-z][a-z0-9_]{0,39})."""
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def free_port() -> int:
    """A loopback TCP port that nothing listens on (for a server or REST port of a test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The store's methods that read state rows: point reads, batches and prefix scans.
STORE_READ_METHODS = ("read_latest", "read_latest_many", "read_latest_batch", "scan_latest")


def append_to(path: str, as_repr: bool = False) -> Any:
    """A PyFlink `MapFunction` that appends each record to the file `path` (one line each:
    the record, or its `repr` with `as_repr`) and passes it on: the output of a test job
    that runs several times (a run's lines survive its cancel or failure)."""
    from pyflink.datastream import MapFunction

    class AppendTo(MapFunction):
        def open(self, runtime_context: Any) -> None:
            self.handle = open(path, "a")

        def map(self, value: Any) -> Any:
            self.handle.write((repr(value) if as_repr else value) + "\n")
            self.handle.flush()
            return value

        def close(self) -> None:
            self.handle.close()

    return AppendTo()


def thread_mode_env(parallelism: int, settings: dict[str, str] | None = None) -> Any:
    """A local (MiniCluster) `StreamExecutionEnvironment` as pyflink-ndb's Flink tests run
    it: PyFlink's thread mode on this interpreter, no restarts (a failure fails the test),
    `parallelism`, and `settings` (Flink keys and values) on top."""
    import sys

    from pyflink.common import Configuration
    from pyflink.datastream import StreamExecutionEnvironment

    config = Configuration()
    config.set_string("python.execution-mode", "thread")
    config.set_string("python.executable", sys.executable)
    config.set_string("restart-strategy.type", "none")
    for key, value in (settings or {}).items():
        config.set_string(key, value)
    env = StreamExecutionEnvironment.get_execution_environment(config)
    env.set_parallelism(parallelism)
    return env



def fixed_delay_restarts(attempts: int, delay: str) -> dict[str, str]:
    """Settings for :func:`thread_mode_env`: Flink restarts a failed job `attempts` times,
    `delay` (e.g. "500 ms") after each failure."""
    return {"restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": str(attempts),
            "restart-strategy.fixed-delay.delay": delay}

def count_store_reads(monkeypatch: pytest.MonkeyPatch, store: StateStore) -> Counter[str]:
    """Calls of the store's own read methods (:data:`STORE_READ_METHODS`, wrapped on the
    store object, not the tiered table's counters), by method name, from now on."""
    calls: Counter[str] = Counter()
    for name in STORE_READ_METHODS:
        method = getattr(store, name)

        def counted(*args: Any, _method: Any = method, _name: str = name,
                    **kwargs: Any) -> Any:
            calls[_name] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(store, name, counted)
    return calls


def mysql_connect(url: str) -> pymysql.connections.Connection:
    """A plain pymysql connection to the test server, or a test failure that says why."""
    args = parse_mysql_url(url)
    try:
        return pymysql.connect(host=args["host"], port=args["port"], user=args["user"],
                               password=args["password"] or "", database=args["database"],
                               charset="utf8mb4", autocommit=True, connect_timeout=5)
    except pymysql.err.MySQLError as err:
        pytest.fail(
            f"The MySQL-protocol test database at {url} is unreachable ({err}). Start "
            "MariaDB/MySQL there or point PYFLINK_NDB_TEST_MYSQL_URL at a reachable server; "
            "these tests do not skip.", pytrace=False)


def drop_namespace(url: str, namespace: str) -> None:
    """Drop a test namespace's tables (a failure that says why when the server is down)."""
    from pyflink_ndb.errors import StoreUnavailableError
    from pyflink_ndb.stores.factory import create_store

    store = create_store(NdbStateOptions(url=url, namespace=namespace))
    try:
        store.drop_tables()
    except StoreUnavailableError as err:
        pytest.fail(f"Cannot drop test namespace {namespace!r}: {err}", pytrace=False)
    finally:
        store.close()


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """URL of the MySQL-protocol test server; fails (never skips) when it is unreachable."""
    url = os.environ.get("PYFLINK_NDB_TEST_MYSQL_URL", DEFAULT_MYSQL_URL)
    mysql_connect(url).close()
    return url


@pytest.fixture
def store_factory(request: pytest.FixtureRequest, tmp_path: Path
                  ) -> Iterator[Callable[[str], StateStore]]:
    """`make(kind)` opens a store of `kind` ("sqlite" or "mysql") on a fresh namespace;
    every store is closed and MySQL tables are dropped at teardown."""
    opened: list[tuple[str, StateStore]] = []

    def make(kind: str, namespace: str | None = None) -> StateStore:
        ns = namespace or unique_namespace()
        if kind == "sqlite":
            url = f"sqlite:///{tmp_path / 'state.sqlite'}"
        elif kind == "mysql":
            url = request.getfixturevalue("mysql_url")
        else:
            raise AssertionError(f"unknown store kind {kind!r}")
        store = open_store(NdbStateOptions(url=url, namespace=ns))
        opened.append((url, store))
        return store

    yield make
    # Every store is closed before any namespace is dropped: several stores may share one
    # namespace, and MariaDB's DROP TABLE waits for the metadata lock of one still open.
    for _, store in opened:
        store.close()
    for url, namespace in dict.fromkeys((url, store.namespace) for url, store in opened):
        if url.startswith("mysql://"):
            drop_namespace(url, namespace)


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(store_kind: str, store_factory: Callable[[str], StateStore]) -> StateStore:
    """An opened store on a fresh namespace: SQLite in tmp_path, or the MySQL server."""
    return store_factory(store_kind)


@pytest.fixture(params=list(TIER_OPTIONS), ids=list(TIER_OPTIONS))
def tiers(request: pytest.FixtureRequest) -> NdbStateOptions:
    """Options of one tier configuration (cache of 1 with/without RocksDB, large cache)."""
    return TIER_OPTIONS[request.param]


def fast_tmpdir(prefix: str) -> str:
    """A new temporary folder, in memory (/dev/shm) where available: creating and dropping
    a RocksDB there takes milliseconds instead of tens of milliseconds."""
    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix=prefix, dir=base)


@pytest.fixture
def local_dir() -> Iterator[str]:
    """Folder for the subtasks' RocksDB tier (removed afterwards)."""
    path = fast_tmpdir("pyflink-ndb-local-")
    yield path
    crash_open_subtasks(under=path)  # a subtask left open must not outlive its folder
    handover.discard_all(under=path)  # nor a tier a crashed one parked (local.recovery)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_subtask_left_open() -> Iterator[None]:
    """Crash the LocalSubtasks a test left open (their writer threads and RocksDBs would
    outlive the test's folders); those of wider-scoped fixtures, made before, stay."""
    before = open_subtasks()
    yield
    crash_open_subtasks(keep=before)
    # Tiers that crashed subtasks parked for a next attempt (`local.recovery`): a test's
    # next attempts ran within it; the folders go with the test's.
    handover.discard_all()


@pytest.fixture(autouse=True)
def _background_work_bounded_by_statements_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lift, in every test of this process, the wall-clock bound of each completed
    checkpoint's cleanup and adoption
    (:data:`~pyflink_ndb.checkpoint.protocol.BACKGROUND_SECONDS_PER_CHECKPOINT`, 0.25 s).

    Tests count what one checkpoint's budget of statements removes; on a loaded machine
    (CI runs the whole suite on 2 cores) a quarter second can pass before the budget is
    spent, and the rest waits for the next checkpoint (CI failed once so). The bound has
    its own test (tests/test_history_adversarial.py, which sets it to run out); Flink
    tests run their subtasks in the JVM's interpreter, which keeps it."""
    monkeypatch.setattr(protocol, "BACKGROUND_SECONDS_PER_CHECKPOINT", 3600.0)


def pandas_aircraft(csv: Path) -> dict[str, tuple[int, int, int, str]]:
    """(flights, total delay, max delay, last destination) per aircraft over the departed
    flights of a flights CSV (or the package's .csv.zip), computed by pandas."""
    import pandas as pd

    frame = pd.read_csv(csv, usecols=["tailnum", "dep_delay", "dest"])
    departed = frame.dropna(subset=["tailnum", "dep_delay"])
    grouped = departed.groupby("tailnum", sort=False)
    return {tail: (int(len(g)), int(g["dep_delay"].sum()), int(g["dep_delay"].max()),
                   str(g["dest"].iloc[-1])) for tail, g in grouped}


def assert_exact(actual: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Every key with exactly the wanted value; the message counts and shows the misses."""
    missing = sorted(set(wanted) - set(actual))
    extra = sorted(set(actual) - set(wanted))
    wrong = sorted(t for t in wanted.keys() & actual.keys() if wanted[t] != actual[t])
    assert (missing, extra, wrong) == ([], [], []), (
        f"{len(missing)} missing, {len(extra)} extra, {len(wrong)} wrong; e.g. "
        f"{[(t, wanted.get(t), actual.get(t)) for t in (missing + extra + wrong)[:5]]}")
