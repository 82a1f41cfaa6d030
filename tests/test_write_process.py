"""The write process (`state.backend.ndb.write.process`): a child killed between two
slices, a newer attempt fencing the child, a stopped child at a cancel, an unreachable
database, the child's log lines, and a real job whose child is killed mid-epoch. The
stored rows, a child that cannot start and values only the writer can unpickle are
tested with the render process (tests/test_render_process.py, `CHILD_OPTIONS`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import drop_namespace, mysql_connect, unique_namespace
from pyflink.common import Types
from pyflink.datastream.state import ValueStateDescriptor
from tcp_proxy import TcpProxy, proxied_mysql_url
from test_render_process import (  # noqa: F401
    _class_only_here,
    _fill,
    _options,
    _rows,
    _run,
    namespaces,
)

from pyflink_ndb.checkpoint.writer import WRITER_PACE, WRITER_PACE_WITH_PROCESS
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import CheckpointError, FencedError
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.stores.mysql import parse_mysql_url
from pyflink_ndb.stores.render_process import RenderProcess
from pyflink_ndb.testing import LocalSubtask

pytestmark = pytest.mark.mysql

ANY = Types.PICKLED_BYTE_ARRAY()


def _value(sub: LocalSubtask):
    return sub.context.get_state(ValueStateDescriptor("v", ANY))


def _restored_value(url: str, sub: LocalSubtask, tmp_path: Path, checkpoint_id: int,
                    keys: list[str]) -> dict[str, object]:
    ns = sub.backend.protocol.wstore.namespace
    restored = LocalSubtask(open_store(_options(url, ns)), _options(url, ns),
                            restored_checkpoint_id=checkpoint_id, storage=sub.storage,
                            local_dir=str(tmp_path / (ns + "_again")))
    try:
        value = _value(restored)
        out = {}
        for key in keys:
            restored.key(key)
            out[key] = value.value()
        return out
    finally:
        restored.close()


@contextlib.contextmanager
def _proxied_namespace(mysql_url: str) -> Iterator[tuple[TcpProxy, str, str]]:
    """A loopback proxy in front of the test server and a fresh namespace, dropped after:
    yields (the proxy, the server's URL through it, the namespace)."""
    server = parse_mysql_url(mysql_url)
    ns = unique_namespace("wp")
    try:
        with TcpProxy(server["host"], server["port"]) as proxy:
            yield proxy, proxied_mysql_url(server, proxy), ns
    finally:
        drop_namespace(mysql_url, ns)


def _process_options(url: str, made: list[str]) -> NdbStateOptions:
    """Options with `write.process` on a new namespace, added to `made` (the namespaces
    the test drops)."""
    ns = unique_namespace("wp")
    made.append(ns)
    return _options(url, ns, write_process=True, checkpoints_retained=8)


def _checkpoint_each(sub: LocalSubtask, value: Any, keys: list[str],
                     checkpoint_ids: tuple[int, ...]) -> None:
    """Per id of `checkpoint_ids`: every key of `keys` holds the id, then that checkpoint
    (which raises if it failed)."""
    for checkpoint_id in checkpoint_ids:
        for key in keys:
            sub.key(key)
            value.update(checkpoint_id)
        sub.checkpoint(checkpoint_id)


def _checkpointed(options, local_dir: Path, keys: list[str]):
    """A subtask with `options` whose `keys` hold "one" in checkpoint 1; (it, its value)."""
    sub = LocalSubtask(open_store(options), options, local_dir=str(local_dir))
    value = _value(sub)
    for key in keys:
        sub.key(key)
        value.update("one")
    sub.checkpoint(1)
    return sub, value


def test_slices_are_written_by_the_child_and_a_child_killed_mid_epoch_leaves_the_rest(
        mysql_url: str, tmp_path: Path, namespaces: list[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    import pyflink_ndb.stores.render_process as render_process

    monkeypatch.setattr(render_process, "SLICE_ROWS", 16)
    ns = unique_namespace("wp")
    namespaces.append(ns)
    sub = _run(mysql_url, ns, tmp_path, write_process=True)
    value = _value(sub)
    keys = [f"k{i}" for i in range(100)]
    for key in keys:
        sub.key(key)
        value.update(("one", key))
    sub.checkpoint(1)
    process = sub.backend.protocol.render_process
    assert process is not None and process.written_epochs == 1
    slices = []
    real = RenderProcess._store_send

    def kill_at_the_third(self, request, *args, **kwargs):
        slices.append(request[0])
        if slices.count("write") == 3 and request[0] == "write":
            os.kill(self._child.pid, signal.SIGKILL)
            self._child.wait()
        return real(self, request, *args, **kwargs)

    monkeypatch.setattr(RenderProcess, "_store_send", kill_at_the_third)
    wstore = sub.backend.protocol.wstore
    paces: list[float] = []  # the writer's pace whenever it writes a slice itself
    real_write = type(wstore).write_versions

    def write_here(self, *args, **kwargs):
        paces.append(sub.backend.protocol.writer.pace())
        return real_write(self, *args, **kwargs)

    # On the class: the store is pickled for the child, a patched instance would not be.
    monkeypatch.setattr(type(wstore), "write_versions", write_here)
    assert sub.backend.protocol.writer.pace() == WRITER_PACE_WITH_PROCESS
    for key in keys:
        sub.key(key)
        value.update(("two", key))
    sub.checkpoint(2)  # slices 1-2 by the child, 3 on by the writer: no failed checkpoint
    assert slices.count("write") == 3 and process.fallbacks == 1
    assert paces and set(paces) == {WRITER_PACE}  # the writer paces what it writes
    assert process.written_epochs == 1
    assert sub.backend.protocol.epochs_failed == 0
    monkeypatch.setattr(RenderProcess, "_store_send", real)
    for key in keys[:10]:
        sub.key(key)
        value.update(("three", key))
    sub.checkpoint(3)  # a new child
    assert process.starts == 2 and process.written_epochs == 2
    sub.close()
    assert process._child is None  # closed with the subtask
    assert _restored_value(mysql_url, sub, tmp_path, 2, keys) == {k: ("two", k) for k in keys}
    assert _restored_value(mysql_url, sub, tmp_path, 3, keys) == {
        k: ("three" if i < 10 else "two", k) for i, k in enumerate(keys)}


def _watch_rows(monkeypatch: pytest.MonkeyPatch, sub: LocalSubtask,
                watch: Callable[[int], None]) -> None:
    """Call `watch(n)` as the writer takes row n of an epoch, before it gets the row
    (what `watch` raises is a failure of the writer while it reads the epoch)."""
    table = sub.backend.protocol.table
    real = type(table).rows_of

    def rows_of(self, *args, **kwargs):
        for n, row in enumerate(real(self, *args, **kwargs)):
            watch(n)
            yield row

    monkeypatch.setattr(type(table), "rows_of", rows_of)


def _counted_rows(monkeypatch: pytest.MonkeyPatch, sub: LocalSubtask,
                  fail_at: int | None = None) -> list[int]:
    """Count the rows the writer takes from the epoch (one element a row), in the list
    returned; `fail_at`: the row whose taking raises (a failure of the writer while it
    reads the epoch)."""
    taken: list[int] = []

    def count(n: int) -> None:
        if n == fail_at:
            raise OSError("the local tier could not be read")
        taken.append(1)

    _watch_rows(monkeypatch, sub, count)
    return taken


def test_the_writer_reads_the_next_slice_while_the_child_writes_this_one(
        mysql_url: str, tmp_path: Path, namespaces: list[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are read out of tiers 1-2 slice by slice, and slice n+1 is read before the
    writer waits for the child's reply to slice n (the two overlap; before, the whole
    epoch was read first, then written)."""
    import pyflink_ndb.stores.render_process as render_process

    monkeypatch.setattr(render_process, "SLICE_ROWS", 16)
    options = _process_options(mysql_url, namespaces)
    keys = [f"k{i}" for i in range(100)]
    sub, value = _checkpointed(options, tmp_path / "s", keys)
    taken = _counted_rows(monkeypatch, sub)
    at_reply: list[int] = []
    real = RenderProcess._store_finish

    def finish(self, *args, **kwargs):
        at_reply.append(len(taken))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RenderProcess, "_store_finish", finish)
    for key in keys:
        sub.key(key)
        value.update("two")
    sub.checkpoint(2)
    assert at_reply == [32, 48, 64, 80, 96, 100, 100]  # one slice ahead; 7 slices
    process = sub.backend.protocol.render_process
    assert process is not None and process.fallbacks == 0 and process.written_epochs == 2
    sub.close()
    assert _restored_value(mysql_url, sub, tmp_path, 2, keys) == {k: "two" for k in keys}


def test_a_new_childs_connection_is_known_while_the_writer_reads_the_next_slice(
        mysql_url: str, tmp_path: Path, namespaces: list[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A close while the writer reads slice 2 of a new child's first epoch has the server
    end the child's statement (:meth:`RenderProcess.interrupt`): the child's connection
    is read before the writer moves on to the next slice, not with the reply (found by a
    review: it was unknown then, and the close sent no kill)."""
    import pyflink_ndb.stores.render_process as render_process

    monkeypatch.setattr(render_process, "SLICE_ROWS", 16)
    options = _process_options(mysql_url, namespaces)
    sub = LocalSubtask(open_store(options), options, local_dir=str(tmp_path / "s"))
    value = _value(sub)
    for i in range(40):
        sub.key(f"k{i}")
        value.update("one")
    seen: list[object] = []

    def at_slice_2(n: int) -> None:
        if n == 16:  # the first row of slice 2: slice 1 is with the child
            process = sub.backend.protocol.render_process
            seen.append((process._request_store is not None, process.server_threads))

    _watch_rows(monkeypatch, sub, at_slice_2)
    sub.checkpoint(1)
    process = sub.backend.protocol.render_process
    assert process is not None and process.starts == 1 and process.written_epochs == 1
    # Both connections of the default write.process-connections (2), distinct.
    assert seen == [(True, process.server_threads)]
    assert len(set(process.server_threads)) == 2
    sub.close()


def test_a_failure_while_the_next_slice_is_read_stops_the_child_and_loses_nothing(
        mysql_url: str, tmp_path: Path, namespaces: list[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer fails while it reads slice 2 and the child still writes slice 1: the
    checkpoint fails, the child (whose reply would be stale) is stopped, no epoch 2
    becomes visible, and the next checkpoint writes every entry with a new child."""
    import pyflink_ndb.stores.render_process as render_process

    monkeypatch.setattr(render_process, "SLICE_ROWS", 16)
    options = _process_options(mysql_url, namespaces)
    keys = [f"k{i}" for i in range(60)]
    sub, value = _checkpointed(options, tmp_path / "s", keys)
    process = sub.backend.protocol.render_process
    assert process is not None and process._child is not None
    first_child = process._child
    _counted_rows(monkeypatch, sub, fail_at=20)
    for key in keys:
        sub.key(key)
        value.update("two")
    with pytest.raises(CheckpointError, match="could not be written"):
        sub.snapshot(2)
    assert process._child is None and first_child.poll() is not None
    assert process._request_store is None
    assert process.fallbacks == 0  # the writer's failure, not the child's
    monkeypatch.undo()
    sub.checkpoint(3)
    assert process.starts == 2 and process.written_epochs == 2
    sub.close()
    assert _restored_value(mysql_url, sub, tmp_path, 3, keys) == {k: "two" for k in keys}
    with pytest.raises(CheckpointError):
        _restored_value(mysql_url, sub, tmp_path, 2, keys)


def test_a_write_fenced_in_the_child_fails_the_checkpoint_and_the_task(
        mysql_url: str, tmp_path: Path, namespaces: list[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    options = _process_options(mysql_url, namespaces)
    ns = options.namespace
    keys = [f"k{i}" for i in range(30)]
    zombie, value = _checkpointed(options, tmp_path / "z", keys)
    heir = None
    real = RenderProcess._store_send

    def claim_first(self, request, *args, **kwargs):  # a newer attempt claims first
        nonlocal heir
        if heir is None and request[0] == "write":
            heir_options = _options(mysql_url, ns)
            heir = LocalSubtask(open_store(heir_options), heir_options,
                                restored_checkpoint_id=1, storage=zombie.storage,
                                local_dir=str(tmp_path / "h"), attempt=1)
        return real(self, request, *args, **kwargs)

    monkeypatch.setattr(RenderProcess, "_store_send", claim_first)
    for key in keys:
        zombie.key(key)
        value.update("zombie")
    with pytest.raises(FencedError):
        zombie.checkpoint(2)
    process = zombie.backend.protocol.render_process
    assert process is not None and process.fallbacks == 0  # not the child's failure
    assert heir is not None
    heir_value = _value(heir)
    for key in keys:
        heir.key(key)
        assert heir_value.value() == "one"
    heir.close()
    zombie.close()
    assert {r[8] for r in _rows(mysql_url, ns) if r[8] is not None} == {'"one"'}


def test_a_close_while_a_stopped_child_holds_the_write_leaves_no_visible_epoch(
        mysql_url: str, tmp_path: Path, namespaces: list[str]) -> None:  # noqa: F811
    options = _process_options(mysql_url, namespaces)
    ns = options.namespace
    keys = [f"k{i}" for i in range(50)]
    sub, value = _checkpointed(options, tmp_path / "s", keys)
    process = sub.backend.protocol.render_process
    assert process is not None and process._child is not None
    child = process._child
    os.kill(child.pid, signal.SIGSTOP)  # a frozen child (a paused cgroup, a debugger)
    try:
        for key in keys:
            sub.key(key)
            value.update("two")
        sub.snapshot(2, durable=False)  # the writer sends it and waits for the child
        assert sub.backend.protocol.writer.wait_for(
            lambda: sub.backend.protocol.writer.writing() == 2, 10)
        sub.crash()  # cancel: the writer stops waiting and kills the child
        assert child.poll() is not None and process._child is None
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
    store = open_store(_options(mysql_url, ns))
    try:
        assert {r.epoch for r in store.list_snapshots(sub.operator)} == {1}
    finally:
        store.close()
    assert _restored_value(mysql_url, sub, tmp_path, 1, keys) == {k: "one" for k in keys}
    with pytest.raises(CheckpointError):
        _restored_value(mysql_url, sub, tmp_path, 2, keys)


def _until(condition: Callable[[], bool], seconds: float = 10) -> bool:
    """Poll `condition` every 20 ms for up to `seconds`; its last value."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


@contextlib.contextmanager
def _child_writes_waiting(mysql_url: str, made: list[str], tmp_path: Path,
                          **changes: Any) -> Iterator[tuple[LocalSubtask, RenderProcess,
                                                            Callable[[tuple[int, ...]], int]]]:
    """A subtask whose checkpoint 1 holds "one" for 50 keys (transactions of 10 rows)
    while another session holds the owner row's lock: checkpoint 2 ("two" for every key)
    is snapshotted, and both of the child's connections wait in the server for that lock
    (a cold read or a large batch would wait the same). Yields (the subtask, its write
    process, waiting(server threads): how many of them run a statement). On leaving, the
    session rolls back, and checkpoint 1 must still restore "one" for every key. `made`:
    the namespaces the test drops (the new one is added); `changes`: other options."""
    options = dataclasses.replace(_process_options(mysql_url, made), write_batch_rows=10,
                                  **changes)
    keys = [f"k{i}" for i in range(50)]
    sub, value = _checkpointed(options, tmp_path / "s", keys)
    process = sub.backend.protocol.render_process
    assert process is not None and len(process.server_threads) == 2
    first = process.server_threads
    holder = mysql_connect(mysql_url)
    try:
        with holder.cursor() as cur:
            cur.execute("SET SESSION innodb_lock_wait_timeout = 30")
            cur.execute("BEGIN")
            cur.execute(f"SELECT owners FROM {options.namespace}_operators FOR UPDATE")

        def waiting(threads: tuple[int, ...]) -> int:
            with holder.cursor() as cur:
                cur.execute("SELECT COUNT(*) FROM information_schema.processlist WHERE id IN "
                            f"({', '.join(['%s'] * len(threads))}) AND info IS NOT NULL",
                            threads)
                return int(cur.fetchone()[0])

        for key in keys:
            sub.key(key)
            value.update("two")
        sub.snapshot(2, durable=False)  # the child's fence checks wait for the lock
        assert _until(lambda: waiting(first) == 2), \
            "the child's statements did not reach the server"
        yield sub, process, waiting
    finally:
        holder.rollback()
        holder.close()
    assert _restored_value(mysql_url, sub, tmp_path, 1, keys) == {k: "one" for k in keys}


def test_a_cancel_has_the_server_end_the_childs_statement(
        mysql_url: str, tmp_path: Path, namespaces: list[str]) -> None:  # noqa: F811
    """The child's writes wait in the server when the subtask is cancelled: the close has
    the server end those statements (KILL CONNECTION of each of the child's connections,
    which the child reported), instead of leaving them to run on with their locks after
    the child is killed (the server notices a killed client only when its statement
    ends; the next attempt's claim would wait for its shared lock)."""
    with _child_writes_waiting(mysql_url, namespaces, tmp_path) as (sub, process, waiting):
        child_threads = process.server_threads
        sub.crash()
        assert _until(lambda: not waiting(child_threads), 3), \
            "the child's statement ran on in the server after the cancel"


def test_a_drained_close_that_times_out_has_the_server_end_the_childs_statements(
        mysql_url: str, tmp_path: Path, namespaces: list[str]) -> None:  # noqa: F811
    """Found by a breaker: the child's writes wait in the server when the subtask closes
    with a drain (a stop-with-savepoint's end, a finished job), and the drain times out
    (retry deadline + 10 s): the close stopped the child while its statements ran on in
    the server with their locks (until their 50 s lock-wait timeout; the next attempt's
    claim waited 30 s), because the writer thread gave up on the request itself, so the
    close's interrupt never ran. Stopping a child mid-request now has the server end
    them first (`RenderProcess._stop`)."""
    with _child_writes_waiting(mysql_url, namespaces, tmp_path,
                               db_retry_deadline_ms=500) as (sub, process, waiting):
        child_threads = process.server_threads
        sub.close()  # drains for 10.5 s, then stops the writer and the child
        assert _until(lambda: not waiting(child_threads), 3), \
            "the child's statements ran on in the server after the close"


def test_a_reconnect_of_a_childs_connection_mid_write_is_reported_and_killed_at_a_cancel(
        mysql_url: str, tmp_path: Path, namespaces: list[str]) -> None:  # noqa: F811
    """Both of the child's connections wait in the server (for the owner row's lock); one
    of them is killed by the server (a network fault would do the same), retries on a new
    connection, and waits again: the child reports the new connection at once, not with
    the next request (found by a review), so the cancel has the server end the statement
    of the new connection too."""
    with _child_writes_waiting(mysql_url, namespaces, tmp_path) as (sub, process, waiting):
        first = process.server_threads
        killer = mysql_connect(mysql_url)
        try:
            with killer.cursor() as cur:
                cur.execute("KILL CONNECTION %s", (first[1],))
        finally:
            killer.close()
        assert _until(lambda: len(set(process.server_threads) - set(first)) == 1), \
            "the reconnected connection was not reported while the write was in flight"
        now = process.server_threads
        assert _until(lambda: waiting(now) == 2), "the retried statement did not wait again"
        sub.crash()
        assert _until(lambda: waiting(now) == 0, 3), \
            "a statement ran on in the server after the cancel"


def test_an_unreachable_database_fails_the_checkpoint_and_the_next_one_has_everything(
        mysql_url: str, tmp_path: Path) -> None:
    with _proxied_namespace(mysql_url) as (proxy, url, ns):
        options = _options(url, ns, write_process=True, db_socket_timeout_ms=1500,
                           db_retry_deadline_ms=1500, db_retry_max_attempts=2,
                           checkpoints_retained=8)
        keys = [f"k{i}" for i in range(40)]
        sub, value = _checkpointed(options, tmp_path / "u", keys)
        process = sub.backend.protocol.render_process
        assert process is not None and process.written_epochs == 1
        for key in keys:
            sub.key(key)
            value.update("two")
        proxy.set_black_hole(True)
        proxy.cut_connections()
        with pytest.raises(CheckpointError, match="could not be written"):
            sub.snapshot(2)
        assert process.fallbacks == 0  # the child reported it: not its own failure
        assert sub.backend.protocol.entries_taken_back == len(keys)
        proxy.set_black_hole(False)
        sub.checkpoint(3)
        assert process.written_epochs == 2
        sub.close()
        assert _restored_value(url, sub, tmp_path, 3, keys) == {k: "two" for k in keys}


@pytest.mark.parametrize("errno", [1040, 1203])  # max_connections, max_user_connections
def test_a_child_refused_by_the_connection_limit_leaves_the_writes_to_the_writer(
        mysql_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        errno: int) -> None:
    """Found by a breaker: a server with room for a subtask's two connections but not the
    write process's third failed every checkpoint ("Cannot reach the database … Start the
    MySQL server") although the writer's own connection worked. The writer does the work;
    the child stays and connects again at each request (found by a second breaker: a
    child stopped for it spent its three starts, and the write process stayed off once
    the server had room), so once there is room it writes again."""
    import logging

    with _proxied_namespace(mysql_url) as (proxy, url, ns):
        options = _options(url, ns, write_process=True, checkpoints_retained=2)
        sub = LocalSubtask(open_store(options), options, local_dir=str(tmp_path / "l"))
        value = _value(sub)
        proxy.limit_connections(proxy.connections, errno)  # those open now, no more
        keys = [f"k{i}" for i in range(20)]
        with caplog.at_level(logging.WARNING, logger="pyflink_ndb"):
            _checkpoint_each(sub, value, keys, (1, 2, 3, 4, 5))
        process = sub.backend.protocol.render_process
        assert proxy.refused >= 5 and process is not None
        assert process.written_epochs == 0 and process.refusals >= 5
        assert process.usable and process.starts == 1 and process.fallbacks == 0
        assert sub.backend.protocol.writer.pace() == WRITER_PACE  # it runs the statements
        assert sub.backend.protocol.epochs_failed == 0
        said = caplog.text
        assert "too many connections" in said and "Start the MySQL server" not in said
        assert said.count("the writer does this work itself") == 1  # then at DEBUG
        proxy.limit_connections(None)
        _checkpoint_each(sub, value, keys, (6,))  # room again: the child writes
        assert process.written_epochs == 1 and process.starts == 1
        sub.close()
        assert _restored_value(url, sub, tmp_path, 6, keys) == {k: 6 for k in keys}


def test_an_epoch_on_three_connections_commits_every_row(
        mysql_url: str, tmp_path: Path, namespaces: list[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`write.process-connections: 3` with transactions of 4 rows: the child reports three
    connections, and each checkpoint restores every key's value of that checkpoint; every
    seventh value is one the child cannot unpickle (it asks the writer for it from
    whichever connection's thread takes that batch)."""
    import pyflink_ndb.stores.render_process as render_process

    Tags = _class_only_here(monkeypatch, "pfn_three_connections", "Tags")
    monkeypatch.setattr(render_process, "SLICE_ROWS", 16)
    ns = unique_namespace("wp")
    namespaces.append(ns)
    options = _options(mysql_url, ns, write_process=True, checkpoints_retained=8,
                       write_process_connections=3, write_batch_rows=4)
    sub = LocalSubtask(open_store(options), options, local_dir=str(tmp_path / "s"))
    value = _value(sub)
    keys = [f"k{i}" for i in range(100)]
    def value_of(checkpoint_id: int, i: int) -> object:
        return Tags([checkpoint_id, i]) if i % 7 == 0 else (checkpoint_id, i)

    for checkpoint_id in (1, 2):
        for i, key in enumerate(keys):
            sub.key(key)
            value.update(value_of(checkpoint_id, i))
        sub.checkpoint(checkpoint_id)
    process = sub.backend.protocol.render_process
    assert process is not None and process.written_epochs == 2 and process.fallbacks == 0
    assert len(set(process.server_threads)) == 3
    sub.close()
    for checkpoint_id in (1, 2):
        restored = _restored_value(mysql_url, sub, tmp_path, checkpoint_id, keys)
        assert restored == {k: value_of(checkpoint_id, i) for i, k in enumerate(keys)}
        assert all(type(restored[k]) is Tags for k in keys[::7])


def test_a_further_connection_refused_by_the_limit_leaves_the_writes_on_those_open(
        mysql_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A server with room for the child's first connection but not its second: the child
    writes every epoch on the one (no checkpoint fails, the child is not given up), and
    says so once."""
    import logging

    with _proxied_namespace(mysql_url) as (proxy, url, ns):
        options = _options(url, ns, write_process=True, checkpoints_retained=8)
        sub = LocalSubtask(open_store(options), options, local_dir=str(tmp_path / "l"))
        value = _value(sub)
        proxy.limit_connections(proxy.connections + 1)  # the child's first, no more
        keys = [f"k{i}" for i in range(20)]
        with caplog.at_level(logging.WARNING, logger="pyflink_ndb"):
            _checkpoint_each(sub, value, keys, (1, 2, 3))
        process = sub.backend.protocol.render_process
        assert proxy.refused >= 1 and process is not None
        assert process.written_epochs == 3 and process.fallbacks == 0
        assert len(process.server_threads) == 1
        assert sub.backend.protocol.epochs_failed == 0
        assert caplog.text.count("a further connection failed to open") == 1
        sub.close()
        proxy.limit_connections(None)
        assert _restored_value(url, sub, tmp_path, 3, keys) == {k: 3 for k in keys}


@pytest.mark.parametrize("connections", [1, 2])
def test_a_childs_connection_lost_at_the_connection_limit_leaves_its_writes_to_the_others(
        mysql_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        connections: int) -> None:
    """Found by a breaker: at the server's connection limit, one of the child's
    connections is lost and another client takes its slot; the child's reconnect is
    refused ("too many connections"), and every later checkpoint failed, although the
    child's other connection and the writer's own worked. Now a connection refused so is
    given up (tried again after REOPEN_AFTER_S) and the batch it held goes to the others;
    when it was the only one, the writer writes the slice on its own connection and the
    child stays (a review: stopping it spent the child's starts, and the write process
    was off for good), so once the slot is free the child writes again."""
    import logging

    with _proxied_namespace(mysql_url) as (proxy, url, ns):
        options = _options(url, ns, write_process=True, checkpoints_retained=8,
                           write_process_connections=connections, write_batch_rows=5)
        keys = [f"k{i}" for i in range(60)]
        sub, value = _checkpointed(options, tmp_path / "l", keys)
        process = sub.backend.protocol.render_process
        assert process is not None and len(process.server_threads) == connections
        open_before = proxy.connections
        proxy.limit_connections(open_before, 1203)  # the server is full
        killer = mysql_connect(mysql_url)  # directly, not through the proxy
        try:
            with killer.cursor() as cur:
                cur.execute("KILL CONNECTION %s", (process.server_threads[-1],))
        finally:
            killer.close()
        assert proxy.wait_for(lambda: proxy.connections == open_before - 1)
        other = mysql_connect(url)  # another client takes the slot
        try:
            with caplog.at_level(logging.WARNING, logger="pyflink_ndb"):
                _checkpoint_each(sub, value, keys, (2, 3, 4))
        finally:
            other.close()
        assert sub.backend.protocol.epochs_failed == 0 and process.fallbacks == 0
        if connections == 2:  # the child wrote each epoch on its other connection
            assert process.written_epochs == 4 and process.refusals == 0
            assert len(process.server_threads) == 1
            assert "a connection was lost and the server refused a new one" in caplog.text
        else:  # the writer wrote each epoch, the child stayed
            assert process.written_epochs == 1 and process.refusals == 3
            assert process.starts == 1 and process.usable
            assert caplog.text.count("the writer does this work itself") == 1
        proxy.limit_connections(None)
        _checkpoint_each(sub, value, keys, (5,))  # the slot is free: the child writes again
        assert process.written_epochs == (5 if connections == 2 else 2)
        sub.close()
        assert _restored_value(url, sub, tmp_path, 5, keys) == {k: 5 for k in keys}


def test_a_further_connection_whose_handshake_hangs_holds_no_slice_back(
        mysql_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a breaker: the write process opened its further connections before
    writing, under the store's retries of a dropped handshake, so one whose handshake
    never came held the epoch for the whole retry deadline (90 s by default), again
    every REOPEN_AFTER_S. They are opened by a thread of their own now, which a request
    waits for at most OPEN_WAIT_S; a connection that opens later, or after a failure
    once REOPEN_AFTER_S passed, is used from the next request on."""
    import pickle

    import pyflink_ndb.stores.render_process as render_process

    monkeypatch.setattr(render_process, "REOPEN_AFTER_S", 0.2)
    with _proxied_namespace(mysql_url) as (proxy, url, ns):
        store = open_store(_options(url, ns, db_socket_timeout_ms=1000,
                                    db_retry_deadline_ms=2000))
        reports: list[object] = []
        connections = render_process._Connections(pickle.dumps(store), reports.append)
        try:
            first = connections.stores[0].server_thread()
            proxy.hang_new_connections(True)
            started = time.monotonic()
            connections.open_more(2)
            assert time.monotonic() - started < render_process.OPEN_WAIT_S + 0.5
            assert len(connections.stores) == 1 and reports == [("connection", (first,))]
            proxy.hang_new_connections(False)
            # The opener's handshake times out (the socket timeout) and is retried: it
            # either reaches the server now or gives up at the retry deadline, after which
            # (REOPEN_AFTER_S) the next request opens the second connection.
            assert _until(lambda: connections._opener is None, 10)
            time.sleep(0.3)
            connections.open_more(2)
            assert _until(lambda: len(connections.stores) == 2, 10)
            second = connections.stores[1].server_thread()
            assert second is not None and second != first
            assert reports[-1] == ("connection", (first, second))
        finally:
            connections.close()
            store.close()


# -- a real job ---------------------------------------------------------------------------

@pytest.mark.flink
def test_a_job_whose_write_process_is_killed_mid_epoch_commits_every_record_once(
        mysql_url: str, tmp_path: Path) -> None:
    """The fault job of `make faults` on a MiniCluster with `write.process`: one subtask's
    write process is killed (SIGKILL) twice while its writer writes an epoch
    (`pyflink_ndb.faults.KILL_WRITE_PROCESS`); the job ends normally and its committed
    state holds every record exactly once."""
    from faults.harness import MiniJob

    from pyflink_ndb.faults import (
        KILL_WRITE_PROCESS,
        check_sequence_state,
        read_events,
        read_sequence_state,
        write_sequence_input,
    )

    ns = unique_namespace("wpjob")
    data, events = tmp_path / "input", tmp_path / "events"
    model = write_sequence_input(data, 200, 150, 250, seed=7)
    args = ["--input", str(data), "--url", mysql_url, "--namespace", ns,
            "--parallelism", "2", "--checkpoint-ms", "300", "--events", str(events),
            "--throttle-ms", "0.3", "--crashes", "1", "--seed", "3", "--max-records", "400",
            "--modes", KILL_WRITE_PROCESS, "--restart-attempts", "5",
            "--set", "state.backend.ndb.write.process=true",
            "--set", "state.backend.ndb.cache.max-entries=100"]
    try:
        job = MiniJob(args, tmp_path / "job.log")
        try:
            rc = job.wait(600)
        finally:
            job.kill()
        assert rc == 0, job.tail()
        seen = read_events(events)
        kills = [e for e in seen if e["event"] == "kill"]
        assert kills, f"no kill while an epoch was written: {seen[-5:]}"
        assert not [e for e in seen if e["event"] == "crash"]
        killed = {(e["attempt"], e["subtask"]) for e in kills}
        ends = [e for e in seen if e["event"] == "write_process"
                and (e["attempt"], e["subtask"]) in killed]
        assert ends, "the killed subtask did not report its write process at close"
        # each kill made the writer either write the rest itself or start a new child
        assert len({e["pid"] for e in kills}) == len(kills)  # each a child of its own
        assert all(e["fallbacks"] + e["starts"] >= 2 for e in ends), ends
        store = open_store(NdbStateOptions(url=mysql_url, namespace=ns))
        try:
            verdict = check_sequence_state(read_sequence_state(store), model)
        finally:
            store.close()
        assert verdict.exact and verdict.lost == 0 and verdict.doubled == 0, verdict
    finally:
        drop_namespace(mysql_url, ns)


def test_the_childs_retry_warnings_reach_the_writers_log_not_an_inherited_stderr(
        mysql_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Found by `make faults` with `write.process`: PyFlink starts the JVM with
    `stderr=PIPE` and nobody reads it, so a child that logged its retries to an inherited
    standard error blocked once the pipe was full (a write held for 210 s). The child's
    standard error is /dev/null; its warnings come back with its replies and are logged
    by the writer."""
    import logging

    with _proxied_namespace(mysql_url) as (proxy, url, ns):
        options = _options(url, ns, write_process=True, checkpoints_retained=8)
        sub, value = _checkpointed(options, tmp_path / "l", ["a", "b"])
        process = sub.backend.protocol.render_process
        assert process is not None and process.pid is not None
        assert os.readlink(f"/proc/{process.pid}/fd/2") == "/dev/null"
        proxy.cut_connections()  # the child's idle connection is gone
        for key in ("a", "b"):
            sub.key(key)
            value.update("two")
        with caplog.at_level(logging.WARNING, logger="pyflink_ndb"):
            sub.checkpoint(2)
        lines = [r.getMessage() for r in caplog.records if "write process: " in r.getMessage()]
        assert any("failed at" in line and "retrying" in line for line in lines), \
            caplog.text
        assert process.fallbacks == 0 and process.written_epochs == 2
        sub.close()
        assert _restored_value(url, sub, tmp_path, 2, ["a", "b"]) == {"a": "two",
                                                                    "b": "two"}


def test_a_pickled_store_has_no_connection_and_no_counter(mysql_url: str) -> None:
    """The write process keeps one connection per distinct pickle of the writer's store:
    the pickle must not change when the store's retries do (it would reconnect after
    every retry), and must never carry the connection."""
    import pickle

    ns = unique_namespace("wp")
    store = open_store(NdbStateOptions(url=mysql_url, namespace=ns))
    try:
        before = pickle.dumps(store, protocol=5)
        store.retries += 3
        assert pickle.dumps(store, protocol=5) == before
        twin = pickle.loads(before)
        assert twin._conn is None and twin.retries == 0
        twin.connect()
        assert twin._conn is not None and twin.describe() == store.describe()
        twin.close()
    finally:
        store.close()
        drop_namespace(mysql_url, ns)


def test_a_store_that_cannot_be_pickled_is_written_by_the_writer_and_logged_once(
        mysql_url: str, tmp_path: Path, namespaces: list[str],  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """Found with `write.process` on for the whole suite: a store carrying an attribute a
    pickle cannot hold (tests put locks on it) failed every checkpoint ("cannot pickle
    '_thread.lock' object") instead of leaving the write to the writer."""
    import threading

    options = _process_options(mysql_url, namespaces)
    sub, value = _checkpointed(options, tmp_path / "local", ["a", "b"])
    try:
        sub.backend.protocol.wstore.guard = threading.Lock()  # type: ignore[attr-defined]
        with caplog.at_level("WARNING", logger="pyflink_ndb"):
            for checkpoint_id, text in ((2, "two"), (3, "three")):
                for key in ("a", "b"):
                    sub.key(key)
                    value.update(text)
                sub.checkpoint(checkpoint_id)  # GC of checkpoint 2's versions runs after 3
        process = sub.backend.protocol.render_process
        assert process is not None and process.unpicklable_store is not None
        assert sub.backend.protocol.writer.pace() == WRITER_PACE  # it writes itself
        assert "_thread.lock" in process.unpicklable_store
        assert process.written_epochs == 1  # checkpoint 1, before the lock was set
        lines = [r for r in caplog.records if "cannot be handed to the write process" in
                 r.getMessage()]
        assert len(lines) == 1
        assert _restored_value(mysql_url, sub, tmp_path, 3, ["a", "b"]) == \
            {"a": "three", "b": "three"}
        assert _restored_value(mysql_url, sub, tmp_path, 2, ["a", "b"]) == \
            {"a": "two", "b": "two"}
    finally:
        sub.close()


@pytest.mark.parametrize("where", ["synchronous flush", "sqlite"])
def test_the_option_where_it_does_not_apply_is_logged_once(
        mysql_url: str, tmp_path: Path, namespaces: list[str],  # noqa: F811
        caplog: pytest.LogCaptureFixture, where: str) -> None:
    """A fresh user set `write.process` with `write.async: false` and saw nothing say
    that it was ignored."""
    import logging

    ns = unique_namespace("wp")
    if where == "sqlite":
        url = f"sqlite:///{tmp_path / 'state.sqlite'}"
        extra: dict[str, object] = {}
    else:
        url = mysql_url
        namespaces.append(ns)
        extra = {"write_async": False}
    with caplog.at_level(logging.WARNING, logger="pyflink_ndb"):
        sub = _run(url, ns, tmp_path, write_process=True, **extra)
        _fill(sub, 10, 1, 3)
    assert sub.backend.protocol.render_process is None
    ignored = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert len(ignored) == 1, caplog.text
    assert "state.backend.ndb.write.process is ignored" in ignored[0]
    sub.close()


@pytest.mark.parametrize(("cpus", "on"), [(1.0, False), (2.0, True)])
def test_auto_decides_by_the_usable_cpus_and_logs_its_decision(
        mysql_url: str, tmp_path: Path, namespaces: list[str],  # noqa: F811
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
        cpus: float, on: bool) -> None:
    """`write.process: auto` (the default): the child writes where the TaskManager may use
    2 CPUs, the writer on 1; a fresh user found no line in the log that said which."""
    import logging

    import pyflink_ndb.checkpoint.protocol as protocol

    monkeypatch.setattr(protocol, "usable_cpus", lambda: cpus)
    ns = unique_namespace("wp")
    namespaces.append(ns)
    with caplog.at_level(logging.INFO, logger="pyflink_ndb"):
        sub = _run(mysql_url, ns, tmp_path, write_process="auto")
        _fill(sub, 30, 1, 2)
    try:
        said = [r.getMessage() for r in caplog.records if "write.process auto" in
                r.getMessage()]
        assert len(said) == 1, said
        assert f"write.process auto: {'on' if on else 'off'}" in said[0]
        assert f"may use {cpus:g} CPUs" in said[0]
        process = sub.backend.protocol.render_process
        if on:
            assert process is not None and process.written_epochs == 2
        else:
            assert process is None
        # The writer paces itself only where it runs the statements itself.
        assert sub.backend.protocol.writer.pace() == (
            WRITER_PACE_WITH_PROCESS if on else WRITER_PACE)
        assert not [r for r in caplog.records if "is ignored" in r.getMessage()]
    finally:
        sub.close()


def test_the_stall_limit_covers_the_retry_deadline_and_one_more_socket_timeout(
        tmp_path: Path) -> None:
    """Found by a breaker: with `db.socket-timeout-ms` 70 s and a 1-s retry deadline, a
    statement the child had sent into a network partition was still waiting when the
    writer gave up on the child after 61 s, blamed it (one of its three starts) and waited
    the same statement out again on its own connection: 131 s instead of about 70."""
    from pyflink_ndb.stores.render_process import STALL_SECONDS

    url = f"sqlite:///{tmp_path / 'state.sqlite'}"
    sub = _run(url, unique_namespace("wp"), tmp_path, db_retry_deadline_ms=1_000,
               db_socket_timeout_ms=70_000)
    try:
        assert sub.backend.protocol._process_stall_s == 71 + STALL_SECONDS
    finally:
        sub.close()
