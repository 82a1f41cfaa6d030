"""StateStore.interrupt (a cancelled subtask's close of its writer's connection) while the
store's retry loop is between two tries: the interrupt must end the retries too, not only
a statement in flight (MariaDB through tests/tcp_proxy.py)."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import drop_namespace, unique_namespace
from tcp_proxy import TcpProxy, proxied_mysql_url

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.stores.mysql import parse_mysql_url
from pyflink_ndb.stores.retry import RetryPolicy


@pytest.mark.mysql
def test_an_interrupt_between_two_tries_ends_the_retries(mysql_url):
    """A statement fails on a lost connection (a transient error) and the store pauses
    before its next try; the close interrupts the store right then. The store is closed:
    it does not open a new connection and run the statement again after the pause (the
    writer would then outlive the close's wait, and a connection opened after the close
    of the store would never be closed)."""
    server = parse_mysql_url(mysql_url)
    ns = unique_namespace("intr")
    try:
        with TcpProxy(server["host"], server["port"]) as proxy:
            store = open_store(NdbStateOptions(url=proxied_mysql_url(server, proxy),
                                               namespace=ns))
            store.retry_policy = RetryPolicy(initial_backoff_ms=1_500, max_backoff_ms=1_500)
            retrying, interrupted = threading.Event(), threading.Event()
            count_retry = store._count_retry

            def on_retry(*args):  # the pause begins once the close interrupted
                count_retry(*args)
                retrying.set()
                interrupted.wait(10)

            store._count_retry = on_retry
            connects = []
            connect = store._connect

            def counted_connect():
                connects.append(time.monotonic())
                return connect()

            store._connect = counted_connect
            outcome: list[object] = []

            def read() -> None:
                try:
                    outcome.append(store._read("slow read", "SELECT SLEEP(2)"))
                except BaseException as err:
                    outcome.append(err)

            thread = threading.Thread(target=read, daemon=True)
            thread.start()
            time.sleep(0.3)  # in the server now
            assert proxy.cut_connections() == 1
            assert retrying.wait(10), "the lost connection was not retried"
            started = time.monotonic()
            store.interrupt()
            interrupted.set()
            thread.join(10)
            took = time.monotonic() - started
            store.close()
            assert outcome and isinstance(outcome[0], Exception), outcome
            assert not connects, "the interrupted store connected again"
            assert took < 0.5, f"the retries went on for {took:.2f} s after the interrupt"
            assert store._conn is None
    finally:
        drop_namespace(mysql_url, ns)


@pytest.mark.mysql
def test_a_killed_connection_runs_no_statement_sent_after_the_kill(mysql_url):
    """`kill_connection` of a connection between two statements: a statement that reaches
    the server after the kill (a stopped client's packet still in flight) must not run.
    A `KILL QUERY` is cleared when the connection's next statement starts, which then ran
    with its locks (found by a breaker with a proxy that held the write process's packets
    for 300 ms: the next attempt's claim waited for that statement); `KILL CONNECTION`
    ends the connection."""
    import pymysql

    ns = unique_namespace("kill")
    store = open_store(NdbStateOptions(url=mysql_url, namespace=ns))
    server = parse_mysql_url(mysql_url)
    victim = pymysql.connect(host=server["host"], port=server["port"], user=server["user"],
                             password=server["password"] or "", database=server["database"],
                             autocommit=True)
    try:
        thread = victim.thread_id()
        store.kill_connection(thread)  # while the victim is idle

        def listed() -> bool:
            return bool(store._read("process list", "SELECT 1 FROM information_schema."
                                    "processlist WHERE id = ?", (thread,)))
        deadline = time.monotonic() + 5
        while listed() and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(pymysql.err.OperationalError):
            with victim.cursor() as cur:
                cur.execute("SELECT 1")
    finally:
        victim.close()
        store.close()
        drop_namespace(mysql_url, ns)
