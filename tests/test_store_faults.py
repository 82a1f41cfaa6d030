"""Transient database faults (requirement P5): bounded retries with exponential backoff and
jitter on fresh connections, a timeout on every socket operation, and a clean
StoreUnavailableError when the retries are spent.

The retry loop's own tests inject a fake sleep and clock. The fault tests run against the
real MySQL-protocol test server, through :class:`tcp_proxy.TcpProxy` where a fault needs
the network (black hole, cut connections, a stopped server); pymysql is never mocked.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pymysql
import pytest
from conftest import mysql_connect
from tcp_proxy import TcpProxy, proxied_mysql_url

from pyflink_ndb.config import NdbStateOptions, from_flink_keys
from pyflink_ndb.errors import ConfigurationError, StoreUnavailableError
from pyflink_ndb.stores.factory import create_store
from pyflink_ndb.stores.mysql import (
    MysqlStateStore,
    is_lost_while_connecting,
    is_transient_error,
    is_transient_warning,
    ndb_error_code,
    parse_mysql_url,
)
from pyflink_ndb.stores.retry import (
    RetriesExhaustedError,
    RetryCounter,
    RetryPolicy,
    backoff_delays_ms,
    error_number,
    run_with_retries,
)

#: Socket timeout of the stores under test (s): short, so a black hole fails fast.
SOCKET_TIMEOUT_S = 2.0  # above the 1 s lock wait of the 1205 test, also under load
#: Scheduling slack on a loaded 2-core machine (s).
SLACK_S = 1.5

Op = pymysql.err.OperationalError


# -- the retry loop with a fake clock --------------------------------------------------------
class FakeTime:
    """A clock that only moves when slept on (or when a test advances it)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.sleeps_ended_at: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.sleeps_ended_at.append(self.now)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


def retry_fake(fake: FakeTime, work: Callable[[], Any], policy: RetryPolicy,
               recover: Callable[[], None] = lambda: None,
               on_retry: Callable[[int, BaseException, float], None] | None = None) -> Any:
    return run_with_retries(work, is_transient=is_transient_error, recover=recover,
                            policy=policy, what="write of epoch 7", where="db.example:3306",
                            sleep=fake.sleep, clock=fake.clock, on_retry=on_retry)


def test_backoff_caps_double_from_the_initial_up_to_the_maximum():
    policy = RetryPolicy(max_attempts=10, initial_backoff_ms=50, max_backoff_ms=1000)
    assert list(backoff_delays_ms(policy, rng=lambda: 1.0)) == [
        50, 100, 200, 400, 800, 1000, 1000, 1000, 1000]
    assert list(backoff_delays_ms(policy, rng=lambda: 0.0)) == [0.0] * 9
    assert list(backoff_delays_ms(RetryPolicy(max_attempts=1))) == []
    assert list(backoff_delays_ms(RetryPolicy(max_attempts=3, initial_backoff_ms=500,
                                              max_backoff_ms=100), rng=lambda: 1.0)) == [
        100, 100]


def test_backoff_is_full_jitter_within_the_caps():
    policy = RetryPolicy(max_attempts=8, initial_backoff_ms=50, max_backoff_ms=1000)
    caps = list(backoff_delays_ms(policy, rng=lambda: 1.0))
    rng = random.Random(20240605).random
    runs = [list(backoff_delays_ms(policy, rng=rng)) for _ in range(200)]
    for run in runs:
        assert len(run) == len(caps)
        assert all(0.0 <= delay < cap for delay, cap in zip(run, caps, strict=True))
    for n, cap in enumerate(caps):
        column = [run[n] for run in runs]
        assert len(set(column)) == len(column)  # jittered: no two runs alike
        assert cap * 0.3 < sum(column) / len(column) < cap * 0.7  # uniform: mean ~ cap / 2


def test_retry_policy_rejects_values_out_of_range():
    RetryPolicy(max_attempts=1, initial_backoff_ms=0, max_backoff_ms=0, deadline_ms=0)
    for bad in ({"max_attempts": 0}, {"initial_backoff_ms": -1}, {"max_backoff_ms": -1},
                {"deadline_ms": -1}):
        with pytest.raises(ConfigurationError, match=next(iter(bad))):
            RetryPolicy(**bad)


def test_transient_errors_are_retried_after_a_recover_until_the_work_succeeds(
        fake_time, caplog):
    failures: list[Exception] = [Op(2013, "Lost connection to MySQL server during query"),
                                 Op(1205, "Lock wait timeout exceeded; try restarting "
                                          "transaction")]
    calls: list[str] = []

    def work() -> str:
        calls.append("work")
        if failures:
            raise failures.pop(0)
        return "done"

    counter = RetryCounter()
    policy = RetryPolicy(initial_backoff_ms=50, max_backoff_ms=5000)
    with caplog.at_level(logging.WARNING, logger="pyflink_ndb.stores.retry"):
        result = retry_fake(fake_time, work, policy, recover=lambda: calls.append("recover"),
                            on_retry=counter)
    assert result == "done"
    assert calls == ["work", "recover", "work", "recover", "work"]
    assert counter.retries == 2 and counter.last_error_number == 1205
    assert len(fake_time.sleeps) == 2
    assert 0 <= fake_time.sleeps[0] < 0.050 and 0 <= fake_time.sleeps[1] < 0.100
    records = [r for r in caplog.records if r.name == "pyflink_ndb.stores.retry"]
    assert [r.levelno for r in records] == [logging.WARNING] * 2
    assert "error 2013" in records[0].getMessage()
    assert "error 1205" in records[1].getMessage()
    assert all("db.example:3306" in r.getMessage() for r in records)


def test_a_non_transient_error_propagates_at_once_unchanged(fake_time):
    duplicate = pymysql.err.IntegrityError(1062, "Duplicate entry '1' for key 'PRIMARY'")
    recovered: list[bool] = []

    def work() -> None:
        raise duplicate

    with pytest.raises(pymysql.err.IntegrityError) as caught:
        retry_fake(fake_time, work, RetryPolicy(), recover=lambda: recovered.append(True))
    assert caught.value is duplicate
    assert recovered == [] and fake_time.sleeps == []


def test_spent_attempts_raise_store_unavailable_naming_server_attempts_and_error(fake_time):
    errors: list[Exception] = []
    recovered: list[bool] = []

    def work() -> None:
        errors.append(Op(2006, "MySQL server has gone away"))
        raise errors[-1]

    with pytest.raises(StoreUnavailableError) as caught:
        retry_fake(fake_time, work, RetryPolicy(max_attempts=4),
                   recover=lambda: recovered.append(True))
    err = caught.value
    assert isinstance(err, RetriesExhaustedError)
    assert str(err).startswith("write of epoch 7 failed at db.example:3306 after 4 attempts in ")
    assert "OperationalError: (2006, 'MySQL server has gone away')" in str(err)
    assert err.attempts == 4 and err.where == "db.example:3306"
    assert err.__cause__ is errors[-1] and err.last_error is errors[-1]
    assert len(errors) == 4 and len(recovered) == 3 and len(fake_time.sleeps) == 3
    assert not is_transient_error(err)  # an outer retry loop does not retry it again


def test_the_deadline_stops_retrying_before_a_sleep_would_pass_it(fake_time):
    policy = RetryPolicy(max_attempts=1000, initial_backoff_ms=100, max_backoff_ms=400,
                         deadline_ms=3000)
    tries: list[float] = []

    def work() -> None:
        tries.append(fake_time.now)
        fake_time.now += 0.3  # each try takes 300 ms before it fails
        raise Op(2013, "Lost connection to MySQL server during query")

    with pytest.raises(RetriesExhaustedError) as caught:
        retry_fake(fake_time, work, policy)
    assert all(end <= 3.0 for end in fake_time.sleeps_ended_at)
    assert caught.value.attempts == len(tries) < 1000
    assert caught.value.elapsed_s <= 3.0 + 0.3
    assert f"after {len(tries)} attempts in {caught.value.elapsed_s:.1f} s" in str(caught.value)


def test_a_transient_failure_of_recover_counts_as_a_failed_attempt(fake_time):
    works: list[bool] = []

    def work() -> None:
        works.append(True)
        raise Op(2013, "Lost connection to MySQL server during query")

    def recover() -> None:
        try:
            raise Op(2003, "Can't connect to MySQL server on 'db' (111)")
        except Op as err:
            raise StoreUnavailableError("Cannot reach the database at db:3306") from err

    with pytest.raises(RetriesExhaustedError) as caught:
        retry_fake(fake_time, work, RetryPolicy(max_attempts=3), recover=recover)
    assert works == [True]  # attempts 2 and 3 failed in recover()
    assert caught.value.attempts == 3
    assert isinstance(caught.value.__cause__, StoreUnavailableError)
    assert error_number(caught.value.__cause__) == 2003


def test_a_permanent_failure_of_recover_propagates_at_once(fake_time):
    denied = StoreUnavailableError("The database at db:3306 refused user 'app'")
    denied.__cause__ = Op(1045, "Access denied for user 'app'@'localhost'")

    def work() -> None:
        raise Op(2013, "Lost connection to MySQL server during query")

    def recover() -> None:
        raise denied

    with pytest.raises(StoreUnavailableError) as caught:
        retry_fake(fake_time, work, RetryPolicy(), recover=recover)
    assert caught.value is denied and len(fake_time.sleeps) == 1


# -- classification ------------------------------------------------------------------------
TRANSIENT = [
    Op(2003, "Can't connect to MySQL server on '127.0.0.1' ([Errno 111] Connection refused)"),
    Op(2006, "MySQL server has gone away"),
    Op(2013, "Lost connection to MySQL server during query (timed out)"),
    Op(1205, "Lock wait timeout exceeded; try restarting transaction"),
    Op(1213, "Deadlock found when trying to get lock; try restarting transaction"),
    Op(1297, "Got temporary error 266 'Time-out in NDB, probably caused by deadlock' from "
             "NDBCLUSTER"),
    Op(1297, "Got temporary error 233 'Out of operation records in transaction coordinator "
             "(increase MaxNoOfConcurrentOperations)' from NDBCLUSTER"),
    Op(1297, "Got temporary error 274 'Time-out in NDB, probably caused by deadlock' from "
             "NDBCLUSTER"),
    Op(1297, "Got temporary error 410 'REDO log files overloaded (decrease "
             "TimeBetweenLocalCheckpoints or increase NoOfFragmentLogFiles)' from NDBCLUSTER"),
    Op(1297, "Got temporary error 4006 'Connect failure - out of connection objects (increase "
             "MaxNoOfConcurrentTransactions)' from NDBCLUSTER"),
    Op(1297, "Got temporary error 4010 'Node failure caused abort of transaction' from "
             "NDBCLUSTER"),
    Op(1297, "Ein temporärer Fehler 266 von NDBCLUSTER"),  # localized: still 1297
    Op(1296, "Got error 4010 'Node failure caused abort of transaction' from NDBCLUSTER"),
    Op(1296, "Got error 266 'Time-out in NDB, probably caused by deadlock' from NDB"),
    Op(1296, "Got error 4012 'Request ndbd time-out, maybe due to high load or communication "
             "problems' from NDBCLUSTER"),
    Op(1180, "Got error 4010 - 'Node failure caused abort of transaction' during COMMIT"),
    Op(1927, "Connection was killed"),
    Op(1053, "Server shutdown in progress"),
    pymysql.err.InterfaceError(0, ""),
    TimeoutError("timed out"),
    ConnectionResetError(104, "Connection reset by peer"),
    BrokenPipeError(32, "Broken pipe"),
]
PERMANENT = [
    pymysql.err.IntegrityError(1062, "Duplicate entry '4010' for key 'PRIMARY'"),
    pymysql.err.ProgrammingError(1146, "Table 'test.nope' doesn't exist"),
    pymysql.err.ProgrammingError(1064, "You have an error in your SQL syntax; check the manual "
                                       "near 'Got temporary error 266' at line 1"),
    Op(1045, "Access denied for user 'root'@'localhost' (using password: YES)"),
    Op(1049, "Unknown database 'nope'"),
    Op(1296, "Got error 4243 'Index not found' from NDBCLUSTER"),
    Op(1296, "Ein Fehler 4010 von NDBCLUSTER"),  # localized 1296: the code is unknown
    Op(1180, "Got error 1 - 'Operation not permitted' during COMMIT"),
    pymysql.err.DataError(1406, "Data too long for column 'v' at row 1"),
    ValueError("not a database error"),
    StoreUnavailableError("no cause: nothing says it is transient"),
]


@pytest.mark.parametrize("err", TRANSIENT, ids=lambda e: f"{type(e).__name__}{e.args[:1]}")
def test_transient_errors(err):
    assert is_transient_error(err)


@pytest.mark.parametrize("err", PERMANENT, ids=lambda e: f"{type(e).__name__}{e.args[:1]}")
def test_permanent_errors(err):
    assert not is_transient_error(err)


def test_a_store_unavailable_error_is_as_transient_as_its_cause():
    def wrapped(cause: BaseException) -> StoreUnavailableError:
        try:
            raise cause
        except BaseException as err:
            try:
                raise StoreUnavailableError("Lost the database at db:3306") from err
            except StoreUnavailableError as outer:
                return outer

    assert is_transient_error(wrapped(Op(2013, "Lost connection to MySQL server")))
    assert not is_transient_error(wrapped(Op(1045, "Access denied")))
    spent = RetriesExhaustedError("read", "db:3306", 3, 1.0, Op(2013, "Lost connection"))
    spent.__cause__ = spent.last_error
    assert not is_transient_error(spent)


def test_ndb_codes_are_read_only_from_the_leading_number_of_1296_1297_1180():
    assert ndb_error_code(1297, "Got temporary error 266 'Time-out in NDB' from NDB") == 266
    assert ndb_error_code(1296, "Got error 4010 'Node failure' from NDBCLUSTER") == 4010
    assert ndb_error_code(1180, "Got error 4010 - 'Node failure' during COMMIT") == 4010
    assert ndb_error_code(1062, "Got error 4010 'x' from NDBCLUSTER") is None
    assert ndb_error_code(1296, "Table full; Got error 4010") is None


def test_ndb_warnings_tell_temporary_errors():
    # ha_ndbcluster pushes a warning 1297 (temporary) or 1296 with the NDB code.
    assert is_transient_warning(1297, "Got temporary error 266 'Time-out in NDB, probably "
                                      "caused by deadlock' from NDB")
    assert is_transient_warning(1296, "Got error 4010 'Node failure caused abort of "
                                      "transaction' from NDB")
    assert not is_transient_warning(1296, "Got error 4243 'Index not found' from NDB")
    assert not is_transient_warning(1265, "Data truncated for column 'v' at row 1")


# -- options -------------------------------------------------------------------------------
def test_the_options_reach_the_store():
    options = from_flink_keys({
        "state.backend.ndb.url": "mysql://app@db.example:3307/state",
        "state.backend.ndb.db.socket-timeout-ms": "1500",
        "state.backend.ndb.db.retry.max-attempts": "4",
        "state.backend.ndb.db.retry.max-backoff-ms": "250",
        "state.backend.ndb.db.retry.deadline-ms": "6000",
    })
    store = create_store(options)
    assert isinstance(store, MysqlStateStore)
    assert store._read_timeout_s == 1.5 and store._write_timeout_s == 1.5
    assert store.retry_policy == RetryPolicy(max_attempts=4, max_backoff_ms=250,
                                             deadline_ms=6000)
    assert store.address == "db.example:3307"
    default = create_store(NdbStateOptions(url="mysql://app@db.example/state"))
    assert isinstance(default, MysqlStateStore)
    assert default.retry_policy == RetryPolicy() and default._read_timeout_s == 30.0


@pytest.mark.parametrize("field", ["db_socket_timeout_ms", "db_retry_max_attempts",
                                   "db_retry_deadline_ms"])
def test_option_values_below_one_are_rejected(field):
    with pytest.raises(ConfigurationError, match="at least 1"):
        NdbStateOptions(**{field: 0})


def test_a_negative_max_backoff_is_rejected():
    NdbStateOptions(db_retry_max_backoff_ms=0)
    with pytest.raises(ConfigurationError,
                       match="max-backoff-ms=-1 is not allowed: it must be at least 0"):
        NdbStateOptions(db_retry_max_backoff_ms=-1)


# -- real faults on the test server ---------------------------------------------------------
def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll `condition` every 10 ms; fail the test when it is not true within `timeout_s`."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"not true within {timeout_s} s: {condition}"
        time.sleep(0.01)


@pytest.fixture
def server(mysql_url: str) -> dict[str, Any]:
    return parse_mysql_url(mysql_url)


@pytest.fixture
def proxy(server: dict[str, Any]) -> Iterator[TcpProxy]:
    with TcpProxy(server["host"], server["port"]) as running:
        yield running


@pytest.fixture
def store(server: dict[str, Any], proxy: TcpProxy) -> Iterator[MysqlStateStore]:
    """A store that reaches the test server through `proxy`, with 1 s socket timeouts."""
    made = MysqlStateStore(
        proxied_mysql_url(server, proxy),
        "faults", password=server["password"], connect_timeout_s=2,
        read_timeout_s=SOCKET_TIMEOUT_S, write_timeout_s=SOCKET_TIMEOUT_S)
    yield made
    made.close()


@pytest.fixture
def admin(mysql_url: str) -> Iterator[pymysql.connections.Connection]:
    """A direct connection to the test server (no proxy), autocommit."""
    conn = mysql_connect(mysql_url)
    yield conn
    conn.close()


@pytest.fixture
def table(admin: pymysql.connections.Connection) -> Iterator[str]:
    """A fresh InnoDB table `(id INT PRIMARY KEY, v INT)` holding row (1, 0); dropped after."""
    name = f"faults_{uuid.uuid4().hex[:16]}"
    with admin.cursor() as cur:
        cur.execute(f"CREATE TABLE {name} (id INT NOT NULL PRIMARY KEY, v INT NOT NULL) "
                    "ENGINE=InnoDB")
        cur.execute(f"INSERT INTO {name} (id, v) VALUES (1, 0)")
    yield name
    with admin.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")


class Session:
    """The connection a unit of work runs on; `recover()` replaces it with a new one from
    `MysqlStateStore._connect` (session settings re-applied), as the store will."""

    def __init__(self, store: MysqlStateStore) -> None:
        self.store = store
        self.conn = store._connect()
        self.reconnects = 0
        self.errors: list[BaseException] = []

    def recover(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        self.conn = self.store._connect()
        self.reconnects += 1

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> tuple[tuple[Any, ...], ...]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params or None)
            return tuple(cur.fetchall())

    def isolation(self) -> set[str]:
        rows = self.query("SHOW SESSION VARIABLES LIKE '%isolation'")
        return {value for name, value in rows if name in ("tx_isolation",
                                                           "transaction_isolation")}

    def retry(self, work: Callable[[], Any], policy: RetryPolicy,
              on_retry: Callable[[int, BaseException, float], None] | None = None) -> Any:
        def record(attempt: int, err: BaseException, delay_ms: float) -> None:
            self.errors.append(err)
            if on_retry is not None:
                on_retry(attempt, err, delay_ms)

        return run_with_retries(work, is_transient=self.store._is_transient,
                                recover=self.recover, policy=policy, what="test work",
                                where=self.store.address, on_retry=record)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


@pytest.fixture
def session(store: MysqlStateStore) -> Iterator[Session]:
    opened = Session(store)
    yield opened
    opened.close()


def value_of(admin: pymysql.connections.Connection, table: str) -> int:
    with admin.cursor() as cur:
        cur.execute(f"SELECT v FROM {table} WHERE id = 1")
        return int(cur.fetchone()[0])


FAST = RetryPolicy(max_attempts=5, initial_backoff_ms=20, max_backoff_ms=200,
                   deadline_ms=10_000)


@pytest.mark.mysql
def test_a_black_holed_server_fails_the_connect_within_the_socket_timeout(store, proxy):
    proxy.set_black_hole(True)
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{proxy.port}") as caught:
        store._connect()
    elapsed = time.monotonic() - start
    assert proxy.accepted == 1  # the TCP connect succeeded; the greeting never came
    assert SOCKET_TIMEOUT_S * 0.9 <= elapsed < SOCKET_TIMEOUT_S + SLACK_S
    assert is_transient_error(caught.value)


@pytest.mark.parametrize(("err", "lost"), [
    (pymysql.err.OperationalError(2006, "MySQL server has gone away (ConnectionResetError)"),
     True),
    (pymysql.err.OperationalError(2013, "Lost connection to MySQL server during query"), True),
    (ConnectionResetError(104, "Connection reset by peer"), True),
    (pymysql.err.OperationalError(2003, "Can't connect to MySQL server (refused)"), False),
    (pymysql.err.OperationalError(2002, "Can't connect to local server"), False),
    (pymysql.err.OperationalError(1045, "Access denied for user"), False),
    (pymysql.err.OperationalError(1049, "Unknown database"), False),
], ids=lambda v: f"{type(v).__name__}{getattr(v, 'args', ())[:1]}" if not isinstance(v, bool)
    else str(v))
def test_only_a_connection_dropped_after_the_server_took_it_is_connected_again(err, lost):
    assert is_lost_while_connecting(err) is lost
    wrapped = StoreUnavailableError("Cannot reach the database at db:3306")
    wrapped.__cause__ = err
    assert is_lost_while_connecting(wrapped) is lost


@pytest.mark.mysql
def test_a_connection_dropped_in_the_handshake_is_connected_again(server, proxy):
    """CI's failure of test_rescale_2_to_3_to_1: the server reset a new connection in the
    handshake (error 2006) while a subtask forked its writer's store, and the test failed
    with "Cannot reach the database". open(), connect() and fork() now try again."""
    made = MysqlStateStore(
        proxied_mysql_url(server, proxy),
        "faults", password=server["password"], connect_timeout_s=2,
        read_timeout_s=SOCKET_TIMEOUT_S, write_timeout_s=SOCKET_TIMEOUT_S,
        retry=RetryPolicy(max_attempts=5, initial_backoff_ms=10, max_backoff_ms=50))
    try:
        proxy.drop_in_handshake(2)
        made.open()
        assert proxy.accepted == 3 and made.retries == 2
        assert made._read("probe", "SELECT 1") == [(1,)]
        proxy.drop_in_handshake(1)
        twin = made.fork()
        assert twin is not None and proxy.accepted == 5 and twin.retries == 1
        assert twin._read("probe", "SELECT 2") == [(2,)]
        twin.close()
    finally:
        made.close()


@pytest.mark.mysql
def test_a_refused_first_connection_fails_at_once(server, proxy):
    """Nothing listens: reported without waiting out the retry deadline (the default
    policy's 90 s), so a wrong port is named at once."""
    port = proxy.port
    proxy.stop()
    made = MysqlStateStore(f"mysql://{server['user']}@127.0.0.1:{port}/{server['database']}",
                           "faults", password=server["password"], connect_timeout_s=2)
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError, match=f"Cannot reach the database at "
                                                    f"127.0.0.1:{port}"):
        made.open()
    assert time.monotonic() - start < 2.0 and made.retries == 0


@pytest.mark.mysql
def test_a_connection_that_stops_answering_fails_within_the_socket_timeout(session, proxy):
    assert session.query("SELECT 1") == ((1,),)
    proxy.set_black_hole(True)
    start = time.monotonic()
    with pytest.raises(pymysql.err.OperationalError) as caught:
        session.query("SELECT 2")
    elapsed = time.monotonic() - start
    assert caught.value.args[0] == 2013
    assert SOCKET_TIMEOUT_S * 0.9 <= elapsed < SOCKET_TIMEOUT_S + SLACK_S
    assert is_transient_error(caught.value)


@pytest.mark.mysql
def test_cut_connections_are_retried_on_a_new_connection_with_the_session_settings(
        session, proxy, table, admin):
    session.query("SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE")
    assert session.isolation() == {"SERIALIZABLE"}
    wait_until(lambda: proxy.connections == 1)
    assert proxy.cut_connections() == 1

    def work() -> set[str]:
        session.query(f"REPLACE INTO {table} (id, v) VALUES (1, 7)")
        return session.isolation()

    assert session.retry(work, FAST) == {"READ-COMMITTED"}  # re-applied by _connect
    assert session.reconnects == 1 and len(session.errors) == 1
    assert error_number(session.errors[0]) in (2006, 2013)
    assert value_of(admin, table) == 7


@pytest.mark.mysql
def test_a_server_restart_is_ridden_out(session, proxy, table, admin):
    proxy.stop()  # connections cut, new ones refused: what a restarting server does
    restart = threading.Timer(3.0, proxy.start)
    restart.start()
    policy = RetryPolicy(max_attempts=100, initial_backoff_ms=50, max_backoff_ms=500,
                         deadline_ms=20_000)

    def work() -> tuple[tuple[Any, ...], ...]:
        session.query(f"REPLACE INTO {table} (id, v) VALUES (1, 8)")
        return session.query(f"SELECT v FROM {table} WHERE id = 1")

    start = time.monotonic()
    try:
        assert session.retry(work, policy) == ((8,),)
    finally:
        restart.join()
    elapsed = time.monotonic() - start
    assert 2.5 <= elapsed < 3.0 + 0.5 + SLACK_S
    numbers = [error_number(err) for err in session.errors]
    assert numbers[0] in (2006, 2013) and 2003 in numbers  # lost, then refused
    assert all(is_transient_error(err) for err in session.errors)
    assert value_of(admin, table) == 8


@pytest.mark.mysql
def test_a_server_down_longer_than_the_deadline_gives_store_unavailable(session, proxy,
                                                                        caplog):
    proxy.stop()
    policy = RetryPolicy(max_attempts=100, initial_backoff_ms=50, max_backoff_ms=300,
                         deadline_ms=1500)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pyflink_ndb.stores.retry"), \
            pytest.raises(StoreUnavailableError) as caught:
        session.retry(lambda: session.query("SELECT 1"), policy)
    elapsed = time.monotonic() - start
    err = caught.value
    assert isinstance(err, RetriesExhaustedError) and 3 <= err.attempts < 100
    assert str(err).startswith(f"test work failed at 127.0.0.1:{proxy.port} after "
                               f"{err.attempts} attempts in ")
    assert "(error 2003)" in str(err)  # the last error: connection refused
    assert elapsed < 1.5 + SLACK_S
    assert error_number(err.__cause__) == 2003 and is_transient_error(err.__cause__)
    retries = [r.getMessage() for r in caplog.records if r.name == "pyflink_ndb.stores.retry"]
    assert len(retries) == err.attempts - 1
    assert all(f"127.0.0.1:{proxy.port}" in line for line in retries)


@pytest.mark.mysql
def test_a_lock_wait_timeout_is_transient_and_succeeds_after_the_competitor_commits(
        session, table, mysql_url, admin):
    competitor = mysql_connect(mysql_url)
    try:
        competitor.autocommit(False)
        with competitor.cursor() as cur:
            cur.execute(f"SELECT v FROM {table} WHERE id = 1 FOR UPDATE")  # holds the row

        def work() -> tuple[tuple[Any, ...], ...]:
            session.query("SET SESSION innodb_lock_wait_timeout = 1")  # per connection
            session.query(f"UPDATE {table} SET v = 42 WHERE id = 1")  # idempotent
            return session.query(f"SELECT v FROM {table} WHERE id = 1")

        result = session.retry(work, FAST, on_retry=lambda *_: competitor.commit())
    finally:
        competitor.close()
    assert result == ((42,),)
    assert [error_number(err) for err in session.errors] == [1205]
    assert is_transient_error(session.errors[0])
    assert value_of(admin, table) == 42


@pytest.mark.mysql
def test_a_connection_killed_by_the_server_fails_transiently_and_is_retried(
        session, table, admin):
    ((killed_id,),) = session.query("SELECT CONNECTION_ID()")
    with admin.cursor() as cur:
        cur.execute(f"KILL {int(killed_id)}")

    def gone() -> bool:
        with admin.cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s",
                        (killed_id,))
            return int(cur.fetchone()[0]) == 0

    wait_until(gone)

    def work() -> int:
        session.query(f"REPLACE INTO {table} (id, v) VALUES (1, 9)")
        ((conn_id,),) = session.query("SELECT CONNECTION_ID()")
        return int(conn_id)

    assert session.retry(work, FAST) != killed_id
    assert len(session.errors) == 1 and is_transient_error(session.errors[0])
    assert value_of(admin, table) == 9
