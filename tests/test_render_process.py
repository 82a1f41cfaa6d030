"""The render process (`state.backend.ndb.write.render-process`): the same SQL text and
stored rows as the writer's own rendering, a failing child falls back without losing a
checkpoint, a value only the parent can unpickle keeps its JSON."""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import signal
import stat
import sys
import threading
import time
import tracemalloc
import types
from collections.abc import Iterator
from contextlib import closing
from itertools import chain
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import drop_namespace, mysql_connect, unique_namespace
from hypothesis import given, settings
from hypothesis import strategies as st
from pyflink.common import Row, Types
from pyflink.common.time import Time
from pyflink.datastream.state import (
    ListStateDescriptor,
    MapStateDescriptor,
    StateTtlConfig,
    ValueStateDescriptor,
)

from pyflink_ndb.checkpoint.writer import WriteCancelled
from pyflink_ndb.cli import main as cli
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import FencedError, StoreUnavailableError, ValueTooLargeError
from pyflink_ndb.serialization import encode_key, encode_value
from pyflink_ndb.serialization.keys import KeyJsonMemo, encode_map_key, key_prefix_json
from pyflink_ndb.serialization.values import PLAIN_JSON, JsonRenderer
from pyflink_ndb.stores.base import CHUNK_BYTES, WriteRow, row_params
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.stores.mysql import render_state_row
from pyflink_ndb.stores.render_process import (
    MAX_STARTS,
    RENDER_AHEAD_ROWS,
    RenderProcess,
    _RenderAhead,
    render_rows,
    slices_of,
    write_batches,
)
from pyflink_ndb.testing import LocalSubtask

pytestmark = pytest.mark.mysql

_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20) | st.binary(max_size=20)
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=8)


def _in_writer(version: int, rows: list[WriteRow], renderers: dict[int, JsonRenderer]
               ) -> list[list[bytes]]:
    """What the writer renders itself (TieredTable.render's JSON, then the store's rows)."""
    out = []
    for row in rows:
        if row.value is not None:
            row = row._replace(value_json=renderers.get(row.state_id, PLAIN_JSON)(row.value),
                               key_json=key_prefix_json(row.ukey)[1])
        out.append([render_state_row(p).encode("ascii") for p in row_params(version, row)])
    return out


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([1, 2, 3]), _values,
                          st.none() | _values, st.none() | st.integers(0, 2**40)),
                min_size=1, max_size=12))
def test_rendered_rows_equal_the_writers_own(entries) -> None:
    renderers = {2: JsonRenderer(list_segments=True), 3: JsonRenderer(list_segments=True,
                                                                     ttl=True)}
    rows = []
    for key, sid, map_key, value, expires in entries:
        if sid == 3 and value is not None:
            value = [(value, 1)]
        elif sid == 2 and value is not None:
            value = [value]
        ukey = encode_key(key) + encode_map_key(repr(map_key))
        data = None if value is None else encode_value(value)
        rows.append(WriteRow(key % 4, sid, ukey, data is None, data, None, expires, None))
    rows.sort(key=lambda r: (r.state_id, r.ukey))
    rows = list({(r.state_id, r.ukey): r for r in rows}.values())
    rendered, undecodable = render_rows(7, rows, renderers)
    assert undecodable == []
    assert rendered == _in_writer(7, rows, renderers)


def test_a_value_over_one_chunk_renders_its_chunks() -> None:
    big = encode_value("x" * (CHUNK_BYTES + 10))
    rows = [WriteRow(1, 1, encode_key("k"), False, big, None, None, None)]
    rendered, _ = render_rows(3, rows, {})
    assert len(rendered[0]) == 2 and rendered == _in_writer(3, rows, {})


def _class_only_here(monkeypatch: pytest.MonkeyPatch, module_name: str, name: str
                     ) -> type[list]:
    """A list subclass (its JSON is an array) of a module that only this interpreter has
    (registered in `sys.modules` for the test): the child process cannot unpickle it."""
    module = types.ModuleType(module_name)
    cls = type(name, (list,), {"__module__": module_name, "__qualname__": name})
    setattr(module, name, cls)
    monkeypatch.setitem(sys.modules, module_name, module)
    return cls


def test_an_epoch_is_rendered_in_slices_with_undecodable_rows_in_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The child gets SLICE_ROWS rows per request (its memory is one slice's, not the
    epoch's): the slices' replies join in row order, and a row only this interpreter can
    unpickle, in any slice, is rendered here at its own index."""
    import pyflink_ndb.stores.render_process as render_process

    Opaque = _class_only_here(monkeypatch, "pfn_slices_only_here", "Opaque")
    monkeypatch.setattr(render_process, "SLICE_ROWS", 4)
    rows = []
    for i in range(11):  # three slices: 4 + 4 + 3
        value = Opaque([i]) if i in (2, 5, 10) else {"i": i}
        data = None if i == 7 else encode_value(value)
        rows.append(WriteRow(i % 4, 1, encode_key(f"k{i:02}"), data is None, data, None,
                             None, None))
    process = RenderProcess("test")
    sizes = _count_sends(process, monkeypatch)
    try:
        rendered = _slices(process, 9, rows)
    finally:
        process.close()
    assert sizes == [4, 4, 3]
    assert process.fallbacks == 0 and process.starts == 1 and process.rendered_epochs == 1
    assert rendered == _in_writer(9, rows, {})


def test_the_child_is_used_when_the_process_holds_over_1024_descriptors() -> None:
    """A TaskManager holds thousands of descriptors (RocksDB's files, sockets): pipes to
    the child numbered 1024 or more made `select` fail ("filedescriptor out of range"),
    and every epoch was rendered by the writer (found when the test process held that
    many)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        process = RenderProcess("test")
        try:
            rows = _numbered_rows(30)
            rendered = _slices(process, 3, rows)
            assert process._child is not None and process._child.stdout is not None
            assert process._child.stdout.fileno() >= 1024
        finally:
            process.close()
    finally:
        for fd in held:
            os.close(fd)
    assert process.fallbacks == 0 and process.rendered_epochs == 1
    assert rendered == _in_writer(3, rows, {})


def _open_slices(process: RenderProcess, version: int, rows: list[WriteRow],
                 between=None):
    """`process.slices` with the JSON functions the writer passes (plain JSON)."""
    return process.slices(version, rows, {}, lambda sid, v: PLAIN_JSON(v),
                          lambda ukey: key_prefix_json(ukey)[1], between)


def _slices(process: RenderProcess, version: int, rows: list[WriteRow]) -> list[list[bytes]]:
    with closing(_open_slices(process, version, rows)) as slices:
        return list(chain.from_iterable(slices))


def _count_sends(process: RenderProcess, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the requests `process` sends, in order (filled as it sends them)."""
    sizes: list[int] = []
    send = process._send

    def counted(version, part, renderers, between, start=False):
        sizes.append(len(part))
        return send(version, part, renderers, between, start)
    monkeypatch.setattr(process, "_send", counted)
    return sizes


def _numbered_rows(n: int) -> list[WriteRow]:
    return [WriteRow(i % 4, 1, encode_key(f"k{i:03}"), False, encode_value({"i": i}), None,
                     None, None) for i in range(n)]


def test_the_pipes_to_the_child_are_widened() -> None:
    """Each wait of the writer for a pipe gives up the GIL, which under the task threads'
    load costs up to a switch interval to take back: a slice's 2 MB request went in some
    32 writes through the default 64 KiB pipe. The pipes are 1 MiB or more (Linux)."""
    if not hasattr(fcntl, "F_GETPIPE_SZ"):
        pytest.fail("F_GETPIPE_SZ is missing: this suite runs on Linux")
    for kind in ("render", "write"):
        process = RenderProcess("test", kind=kind)
        try:
            child = process._start()
            assert child.stdin is not None and child.stdout is not None
            assert fcntl.fcntl(child.stdin.fileno(), fcntl.F_GETPIPE_SZ) >= 1 << 20
            replies = fcntl.fcntl(child.stdout.fileno(), fcntl.F_GETPIPE_SZ)
            # The write process's replies are a few numbers: its pipe keeps the default
            # (a widened pipe counts against the user's pipe budget).
            assert replies >= 1 << 20 if kind == "render" else replies < 1 << 20
        finally:
            process.close()


def test_the_write_processs_render_thread_renders_what_render_rows_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The write process renders on a thread while it writes (`_RenderAhead`): the same
    literals, in order, over several hand-overs; a row it cannot unpickle is asked for
    at its index; the thread ends when the rows are taken."""
    Gone = _class_only_here(monkeypatch, "pfn_gone_before_rendering", "Gone")
    rows = _numbered_rows(2 * RENDER_AHEAD_ROWS + 17)
    for i in (5, 130, 131):
        rows[i] = rows[i]._replace(value=encode_value(Gone([i])))
    monkeypatch.delitem(sys.modules, Gone.__module__)  # now it cannot be unpickled
    expected, undecodable = render_rows(3, rows, {})
    assert undecodable == [5, 130, 131]
    asked: list[list[int]] = []

    def ask(indexes: list[int]) -> dict[int, list[bytes]]:
        asked.append(indexes)
        return {i: [b"asked"] for i in indexes}

    with _RenderAhead(3, rows, {}, KeyJsonMemo()) as ahead:
        time.sleep(0.2)  # every chunk rendered before the writes reach row 5
        got = list(ahead.rendered(ask))
    assert asked == [undecodable]  # one question for the rows rendered by then
    assert got == [[b"asked"] if i in undecodable else r for i, r in enumerate(expected)]
    assert not ahead._thread.is_alive()


def test_a_failure_of_the_render_thread_reaches_the_writes_and_leaving_stops_it() -> None:
    rows = _numbered_rows(3 * RENDER_AHEAD_ROWS)

    def failing(value: bytes) -> str:
        raise RuntimeError("a renderer bug")

    broken = [r._replace(state_id=2) if i == 150 else r for i, r in enumerate(rows)]
    with _RenderAhead(3, broken, {2: failing}, KeyJsonMemo()) as ahead:
        taken = []
        with pytest.raises(RuntimeError, match="a renderer bug"):
            for literals in ahead.rendered(lambda indexes: {}):
                taken.append(literals)
    assert len(taken) == RENDER_AHEAD_ROWS  # the rows before the failing chunk
    with _RenderAhead(3, rows, {}, KeyJsonMemo()) as ahead:
        next(ahead.rendered(lambda indexes: {}))
    assert not ahead._thread.is_alive()  # left after one row: the thread stopped


class _BatchConnection:
    """A stand-in for one of the write process's connections in :func:`write_batches`
    (the logic above the store; the real connections: tests/test_write_process.py): it
    records the batches it wrote, takes `seconds` for each, and raises `failure` at its
    `fail_at`-th batch; with `together`, its first batch waits until every connection
    holds one (so each connection must have taken one)."""

    def __init__(self, seconds: float = 0.002, fail_at: int | None = None,
                 failure: BaseException | None = None,
                 together: threading.Barrier | None = None) -> None:
        self.seconds, self.fail_at, self.failure = seconds, fail_at, failure
        self.together = together
        self.wrote: list[int] = []

    def write_batch(self, fence, batch: list[int]) -> int:
        if self.fail_at is not None and len(self.wrote) + 1 == self.fail_at:
            raise self.failure or RuntimeError("fail")
        if self.together is not None and not self.wrote:
            self.together.wait(timeout=10)
        time.sleep(self.seconds)
        self.wrote.append(batch[0])
        return len(batch)


def _numbered_batches(count: int, taken: list[int], fail_at: int | None = None
                      ) -> Iterator[list[int]]:
    for number in range(count):
        if number == fail_at:
            raise ValueTooLargeError("an oversized row")
        taken.append(number)
        yield [number] * 3


def test_batches_go_to_every_connection_each_once() -> None:
    """Each connection writes at once (the barrier breaks unless all three hold a batch
    together), and every batch is written once."""
    together = threading.Barrier(3)
    connections = [_BatchConnection(together=together) for _ in range(3)]
    taken: list[int] = []
    written = write_batches(connections, None, _numbered_batches(60, taken))  # type: ignore
    assert written == 180 and not together.broken
    assert sorted(chain.from_iterable(c.wrote for c in connections)) == list(range(60))


@pytest.mark.parametrize("failing", [0, 1])  # the caller's thread, a thread of its own
def test_a_failed_write_stops_the_other_connections_taking_batches(failing: int) -> None:
    fenced = FencedError("a newer attempt claimed the key groups")
    connections = [_BatchConnection(seconds=0.01), _BatchConnection(seconds=0.01)]
    connections[failing] = _BatchConnection(fail_at=3, failure=fenced)
    other = connections[1 - failing]
    taken: list[int] = []
    with pytest.raises(FencedError):
        write_batches(connections, None, _numbered_batches(60, taken))  # type: ignore
    # The failing connection took its 3rd batch; the other one finished what it held.
    assert len(taken) < 10
    assert len(connections[failing].wrote) == 2
    assert len(taken) == 2 + 1 + len(other.wrote)


def test_a_failure_taking_a_batch_is_raised_after_the_batches_held_are_written() -> None:
    connections = [_BatchConnection(seconds=0.01), _BatchConnection(seconds=0.01)]
    taken: list[int] = []
    with pytest.raises(ValueTooLargeError):
        write_batches(connections, None, _numbered_batches(60, taken, fail_at=5))  # type: ignore
    assert taken == [0, 1, 2, 3, 4]
    assert sorted(chain.from_iterable(c.wrote for c in connections)) == taken


@pytest.mark.parametrize("failing", [0, 1])  # the caller's thread, a thread of its own
def test_a_connection_given_up_hands_its_batch_to_the_others(failing: int) -> None:
    """A connection whose write fails with an error `give_up` accepts (the server refused
    its reconnect for a connection limit) stops; the batch it held is written by the
    others, and every batch is written (found by a breaker: the slice failed, and so did
    every later one)."""
    refused = StoreUnavailableError("too many connections")
    connections = [_BatchConnection(seconds=0.005) for _ in range(3)]
    connections[failing] = _BatchConnection(fail_at=2, failure=refused)
    given_up: list[object] = []

    def give_up(connection: object, err: BaseException) -> bool:
        given_up.append(connection)
        return err is refused

    taken: list[int] = []
    written = write_batches(connections, None, _numbered_batches(40, taken),  # type: ignore
                            give_up)  # type: ignore[arg-type]
    assert written == 120 and given_up == [connections[failing]]
    assert sorted(chain.from_iterable(c.wrote for c in connections)) == list(range(40))


def test_the_last_connection_is_not_given_up_and_a_refused_give_up_is_raised() -> None:
    """`give_up` is never asked for the last connection left: its failure is the slice's;
    an error `give_up` declines is raised as without it."""
    refused = StoreUnavailableError("too many connections")
    both = [_BatchConnection(fail_at=2, failure=refused),
            _BatchConnection(fail_at=3, failure=refused)]
    asked: list[object] = []

    def give_up(connection: object, err: BaseException) -> bool:
        asked.append(connection)
        return True

    with pytest.raises(StoreUnavailableError):
        write_batches(both, None, _numbered_batches(40, []), give_up)  # type: ignore
    assert len(asked) == 1  # the second failure came with one connection left
    fenced = FencedError("a newer attempt claimed the key groups")
    declined = [_BatchConnection(fail_at=2, failure=fenced), _BatchConnection()]
    with pytest.raises(FencedError):
        write_batches(declined, None, _numbered_batches(40, []),  # type: ignore
                      lambda connection, err: False)


def test_a_batch_given_back_after_the_last_was_taken_is_still_written() -> None:
    """The other connection has taken the last batch when the failing one gives its back:
    the handed-back batch is written after the others finished."""
    refused = StoreUnavailableError("too many connections")
    slow_failure = _BatchConnection(fail_at=1, failure=refused)
    original = slow_failure.write_batch

    def late(fence: object, batch: list[int]) -> int:
        time.sleep(0.2)  # the other connection takes every other batch meanwhile
        return original(fence, batch)

    slow_failure.write_batch = late  # type: ignore[method-assign]
    other = _BatchConnection(seconds=0.001)
    written = write_batches([other, slow_failure], None, _numbered_batches(10, []),  # type: ignore
                            lambda connection, err: True)
    assert written == 30
    assert sorted(other.wrote) == list(range(10)) and slow_failure.wrote == []


def test_a_stopped_childs_last_report_names_the_connections_to_end() -> None:
    """The reports a child sent before it was stopped (a reconnect while the writer read
    the next slice) are read from its dead output before the kills (a review: the kills
    went to the connections of the last report the writer had read)."""
    import io
    import pickle
    import types

    from pyflink_ndb.stores.render_process import _HEADER, _last_report

    def frame(message: object) -> bytes:
        data = pickle.dumps(message)
        return _HEADER.pack(len(data)) + data

    def child(data: bytes) -> types.SimpleNamespace:
        return types.SimpleNamespace(stdout=io.BytesIO(data))

    reports = frame(("connection", (7, 8))) + frame(("connection", (7, 9)))
    assert _last_report(child(reports), (1, 2)) == (7, 9)
    assert _last_report(child(reports + frame(("done", 3, 0, []))), (1, 2)) == (7, 9)
    assert _last_report(child(b""), (1, 2)) == (1, 2)
    assert _last_report(child(frame(("connection", (5,)))[:-3]), (1, 2)) == (1, 2)


def test_the_child_renders_the_next_slice_while_the_writer_uses_this_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipelining: when the writer gets a slice, the next one is already on its way to the
    child; a generator closed with that request in flight stops the child (its reply would
    be stale), and the next epoch starts a fresh one that renders correctly."""
    import pyflink_ndb.stores.render_process as render_process
    monkeypatch.setattr(render_process, "SLICE_ROWS", 4)
    rows = _numbered_rows(10)
    process = RenderProcess("test")
    sent = _count_sends(process, monkeypatch)
    try:
        slices = _open_slices(process, 5, rows)
        first = next(slices)
        assert first == _in_writer(5, rows[:4], {})
        assert sent == [4, 4]  # the second slice was sent before the first was handed over
        slices.close()
        assert process._child is None and process.fallbacks == 0
        assert _slices(process, 6, rows) == _in_writer(6, rows, {})
        assert process.starts == 2 and process.rendered_epochs == 1
    finally:
        process.close()


def test_a_child_that_dies_mid_epoch_leaves_the_rest_to_the_writer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The child is killed after its first reply: the slices it had not rendered yet are
    rendered by the writer, with the same text, and the next epoch gets a new child."""
    import pyflink_ndb.stores.render_process as render_process
    monkeypatch.setattr(render_process, "SLICE_ROWS", 4)
    rows = _numbered_rows(11)
    process = RenderProcess("test")
    try:
        out: list[list[bytes]] = []
        with closing(_open_slices(process, 3, rows)) as slices:
            for index, part in enumerate(slices):
                out += part
                if index == 0:
                    assert process._child is not None
                    process._child.kill()
                    process._child.wait()
        assert out == _in_writer(3, rows, {})
        assert process.fallbacks == 1 and process.rendered_epochs == 0
        assert _slices(process, 4, rows) == _in_writer(4, rows, {})
        assert process.starts == 2 and process.rendered_epochs == 1
    finally:
        process.close()


@pytest.mark.parametrize("when", ["before its first request", "after its first reply"])
def test_a_stopped_child_is_given_up_after_the_stall_limit(
        monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """A child stopped with SIGSTOP (a frozen cgroup, a debugger) neither reads nor
    answers: the writer gives up on it after STALL_SECONDS, even in the middle of writing
    a request larger than the pipe (its input is non-blocking), and renders the rest of
    the epoch itself with the same text."""
    import pyflink_ndb.stores.render_process as render_process
    monkeypatch.setattr(render_process, "SLICE_ROWS", 4)
    monkeypatch.setattr(render_process, "STALL_SECONDS", 1.0)
    rows = [WriteRow(i % 4, 1, encode_key(f"k{i:03}"), False,
                     encode_value("x" * 100_000 + str(i)), None, None, None)
            for i in range(10)]  # each request ~400 kB: far more than a pipe holds
    process = RenderProcess("test")
    try:
        out: list[list[bytes]] = []
        child = process._start()
        if when == "before its first request":
            os.kill(child.pid, signal.SIGSTOP)
        started = time.monotonic()
        with closing(_open_slices(process, 2, rows)) as slices:
            for index, part in enumerate(slices):
                out += part
                if index == 0 and when == "after its first reply":
                    os.kill(child.pid, signal.SIGSTOP)
        assert time.monotonic() - started < 20
        assert out == _in_writer(2, rows, {})
        assert process.fallbacks == 1 and process._child is None
        assert child.poll() is not None  # killed, not left stopped
    finally:
        process.close()


def test_a_writer_cancelled_while_a_stopped_child_holds_its_request_stops_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's cancellation point is called while it waits to write a request, and
    what it raises stops the child and propagates (no wait for the stall limit)."""
    import pyflink_ndb.stores.render_process as render_process
    monkeypatch.setattr(render_process, "SLICE_ROWS", 4)
    rows = [WriteRow(0, 1, encode_key(f"k{i}"), False, encode_value("y" * 200_000), None,
                     None, None) for i in range(4)]
    process = RenderProcess("test")
    calls = []

    def between() -> None:
        calls.append(1)
        if len(calls) >= 3:
            raise WriteCancelled("closing")
    try:
        child = process._start()
        os.kill(child.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(WriteCancelled), closing(
                _open_slices(process, 1, rows, between)) as slices:
            list(slices)
        assert time.monotonic() - started < 5
        assert process._child is None and child.poll() is not None
    finally:
        process.close()


def test_slices_end_at_a_byte_bound_too() -> None:
    """Slices of large values are bounded by SLICE_BYTES as well as SLICE_ROWS (breaker
    finding: an epoch of 200 values of 1 MB was one slice, and the writer grew by 786 MB,
    the child to 989 MB). Now the child's peak stays under 150 MB and the writer's new
    allocations under 80 MB while it renders 200 MB of values."""
    rows = [WriteRow(0, 1, encode_key(i), False, encode_value(os.urandom(1_000_000)), None,
                     None, None) for i in range(200)]
    assert max(len(part) for part in slices_of(rows)) == 5  # 5 MB: >= 4 MiB
    assert [len(part) for part in slices_of(_numbered_rows(4_001))] == [2_000, 2_000, 1]
    process = RenderProcess("test")
    tracemalloc.start()
    try:
        count = 0
        with closing(_open_slices(process, 1, rows)) as slices:
            for part in slices:
                count += len(part)
                del part
        writer_peak = tracemalloc.get_traced_memory()[1]
        assert process._child is not None
        status = Path(f"/proc/{process._child.pid}/status").read_text()
        child_peak_kib = int(status.split("VmHWM:")[1].split()[0])
    finally:
        tracemalloc.stop()
        process.close()
    assert count == 200 and process.fallbacks == 0
    assert child_peak_kib < 150 * 1024, child_peak_kib
    assert writer_peak < 80 * 1024 * 1024, writer_peak


# -- a subtask with the option ------------------------------------------------------------

def _options(url: str, namespace: str, **extra) -> NdbStateOptions:
    """Options of these tests: the child only where a test asks for it (`write.process`
    is `false` unless given; its default, `auto`, would start one on 2 CPUs)."""
    extra.setdefault("write_process", False)
    return NdbStateOptions(url=url, namespace=namespace, cache_max_entries=50,
                           on_fresh_start="truncate", **extra)


def _fill_states(sub: LocalSubtask) -> tuple[Any, Any, Any]:
    """The states `_fill` writes: a ValueState, a MapState and a ListState with TTL."""
    ttl = (StateTtlConfig.new_builder(Time.milliseconds(3_600_000))
           .update_ttl_on_create_and_write().build())
    seen = MapStateDescriptor("m", Types.STRING(), Types.LONG())
    seen.enable_time_to_live(ttl)
    listed = ListStateDescriptor("l", Types.PICKLED_BYTE_ARRAY())
    listed.enable_time_to_live(ttl)
    return (sub.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY())),
            sub.context.get_map_state(seen), sub.context.get_list_state(listed))


def _fill(sub: LocalSubtask, n: int, cp_start: int, checkpoints: int) -> None:
    value, mapped, recent = _fill_states(sub)
    for cp in range(cp_start, cp_start + checkpoints):
        for i in range(n):
            sub.key(f"user-{i}")
            value.update({"n": i, "cp": cp, "tags": ["a", "é"], "raw": b"\x00'"})
            mapped.put(f"e{i % 3}", cp)
            recent.add((cp, i))
            if i % 7 == 0:
                mapped.remove("e0")
        sub.checkpoint(cp)


def _rows(url: str, namespace: str) -> list[tuple]:
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT key_group, state_id, ukey, chunk, tombstone, chunks, "
                        f"expires_at_ms IS NULL, vbytes, vjson, kjson FROM {namespace}_state "
                        "ORDER BY state_id, ukey, version, chunk")
            rows = []
            for *head, vbytes, vjson, kjson in cur.fetchall():
                value = None if vbytes is None else pickle.loads(vbytes)
                if isinstance(value, tuple):  # a list's head: (segments, random epoch token)
                    value = value[0]
                rows.append((*head, value, vjson, kjson))
            return rows
    finally:
        conn.close()


@pytest.fixture
def namespaces(mysql_url: str) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for ns in made:
        drop_namespace(mysql_url, ns)


def _run(url: str, namespace: str, tmp_path: Path, **extra) -> LocalSubtask:
    store = open_store(_options(url, namespace, **extra))
    # LocalSubtask's manual clock: the same TTL expiries in every run
    return LocalSubtask(store, _options(url, namespace, **extra),
                        local_dir=str(tmp_path / namespace))


#: The two options that start a child: it renders, or renders and writes.
CHILD_OPTIONS = ["write_render_process", "write_process"]


def _epochs_done(process: RenderProcess, option: str) -> int:
    return process.written_epochs if option == "write_process" else process.rendered_epochs


@pytest.mark.parametrize("option", CHILD_OPTIONS)
def test_stored_rows_equal_those_of_the_writers_own_rendering(
        mysql_url: str, tmp_path: Path, namespaces: list[str], option: str) -> None:
    stored = []
    for on in (True, False):
        ns = unique_namespace("rp")
        namespaces.append(ns)
        sub = _run(mysql_url, ns, tmp_path, **{option: on})
        _fill(sub, 120, 1, 3)
        process = sub.backend.protocol.render_process
        if on:
            assert process is not None and _epochs_done(process, option) == 3
            assert process.fallbacks == 0 and process.starts == 1
            assert process.rendered_epochs + process.written_epochs == 3  # one path only
        else:
            assert process is None
        sub.close()
        stored.append(_rows(mysql_url, ns))
    assert stored[0] == stored[1] and len(stored[0]) > 200
    assert any(r[8] is not None for r in stored[0])  # JSON columns are written


@pytest.mark.parametrize("option", CHILD_OPTIONS)
def test_a_failing_child_falls_back_and_nothing_is_lost(
        mysql_url: str, tmp_path: Path, namespaces: list[str], option: str) -> None:
    ns = unique_namespace("rp")
    namespaces.append(ns)
    sub = _run(mysql_url, ns, tmp_path, **{option: True})
    protocol = sub.backend.protocol
    protocol.render_process = RenderProcess("test", python="/bin/false")  # exits at once
    _fill(sub, 40, 1, MAX_STARTS + 2)
    process = protocol.render_process
    assert process.fallbacks == MAX_STARTS and process.starts == MAX_STARTS
    assert not process.usable and _epochs_done(process, option) == 0
    assert protocol.epochs_failed == 0
    sub.close()
    restored = LocalSubtask(open_store(_options(mysql_url, ns)), _options(mysql_url, ns),
                            restored_checkpoint_id=MAX_STARTS + 2,
                            storage=sub.storage, local_dir=str(tmp_path / "again"))
    restored.key("user-39")
    value = restored.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    assert value.value()["cp"] == MAX_STARTS + 2
    restored.close()


def test_a_killed_child_is_replaced_at_the_next_checkpoint(
        mysql_url: str, tmp_path: Path, namespaces: list[str]) -> None:
    ns = unique_namespace("rp")
    namespaces.append(ns)
    sub = _run(mysql_url, ns, tmp_path, write_render_process=True)
    _fill(sub, 20, 1, 1)
    process = sub.backend.protocol.render_process
    assert process is not None and process._child is not None
    process._child.kill()
    process._child.wait()
    _fill(sub, 20, 2, 1)
    assert process.starts == 2 and process.rendered_epochs == 2 and process.fallbacks == 0
    sub.close()
    assert process._child is None  # closed with the subtask


@pytest.mark.parametrize("option", CHILD_OPTIONS)
def test_a_value_only_the_writer_can_unpickle_keeps_its_json(
        mysql_url: str, tmp_path: Path, namespaces: list[str],
        monkeypatch: pytest.MonkeyPatch, option: str) -> None:
    """The child asks the writer for those rows' literals (with `write.process`, one
    question per row as its writes reach it: here three in one slice)."""
    Tags = _class_only_here(monkeypatch, "pfn_only_in_this_interpreter", "Tags")
    assert pickle.loads(pickle.dumps(Tags([1]))) == [1]
    ns = unique_namespace("rp")
    namespaces.append(ns)
    sub = _run(mysql_url, ns, tmp_path, **{option: True})
    value = sub.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    for i in range(6):
        sub.key(f"k{i}")
        value.update(Tags(["a", i]) if i % 2 == 0 else ["b", i])
    questions: list[object] = []
    real_send = RenderProcess._send_frame

    def send_frame(self, message, between):
        if message[0] == "literals":
            questions.append(sorted(message[1]))
        return real_send(self, message, between)

    monkeypatch.setattr(RenderProcess, "_send_frame", send_frame)
    sub.checkpoint(1)
    process = sub.backend.protocol.render_process
    assert process is not None and process.fallbacks == 0
    if option == "write_process":  # the three rows of one chunk: one question
        assert questions == [[0, 2, 4]]  # k0, k2, k4 of the slice
    assert _epochs_done(process, option) == 1
    sub.close()
    assert sorted(r[8] for r in _rows(mysql_url, ns)) == sorted(
        f'["a",{i}]' if i % 2 == 0 else f'["b",{i}]' for i in range(6))


# -- breaker findings at the subtask level ------------------------------------------------

ANY = Types.PICKLED_BYTE_ARRAY()


def _subtask(url: str, namespaces: list[str], tmp_path: Path, **extra) -> LocalSubtask:
    ns = unique_namespace("rp")
    namespaces.append(ns)
    return LocalSubtask(open_store(_options(url, ns, **extra)), _options(url, ns, **extra),
                        local_dir=str(tmp_path / ns))


def _restore(url: str, sub: LocalSubtask, tmp_path: Path, checkpoint_id: int
             ) -> LocalSubtask:
    ns = sub.backend.protocol.wstore.namespace
    return LocalSubtask(open_store(_options(url, ns)), _options(url, ns),
                        restored_checkpoint_id=checkpoint_id, storage=sub.storage,
                        local_dir=str(tmp_path / (ns + "_again")))


def _state_rows(url: str, namespace: str) -> list[tuple]:
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT key_group, state_id, ukey, chunk, tombstone, chunks, "
                        f"expires_at_ms IS NULL, fmt, vbytes, vjson, kjson "
                        f"FROM {namespace}_state ORDER BY state_id, ukey, version, chunk")
            return list(cur.fetchall())
    finally:
        conn.close()


def _write_values(sub: LocalSubtask, values: dict, checkpoint_id: int) -> None:
    value = sub.context.get_state(ValueStateDescriptor("v", ANY))
    for key, v in values.items():
        sub.key(key)
        value.update(v)
    sub.checkpoint(checkpoint_id)


def test_render_process_json_equals_writers_when_int_digit_limit_is_lifted(
        mysql_url, tmp_path, namespaces):
    """The TaskManager's interpreter lifted the int-to-str digit limit
    (sys.set_int_max_str_digits(0), as code handling big numbers does): the child converts
    under the same limit, so a 4,400-digit int gets the same JSON as from the writer's own
    rendering (breaker finding: the child, with the default limit of 4,300 digits,
    rendered NULL for vjson and kjson)."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        stored = []
        for on in (True, False):
            sub = _subtask(mysql_url, namespaces, tmp_path, write_render_process=on)
            _write_values(sub, {"big": 10 ** 4400, 10 ** 4400: "big key"}, 1)
            sub.close()
            stored.append([r[9:] for r in _state_rows(mysql_url, namespaces[-1])])
    finally:
        sys.set_int_max_str_digits(old)
    assert stored[1][0][0] is not None  # the writer's own rendering has the JSON
    assert stored[0] == stored[1]


@pytest.mark.parametrize("entry", ["path", "bytes"])
def test_a_non_str_entry_in_sys_path_does_not_fail_checkpoints(
        mysql_url, tmp_path, namespaces, monkeypatch, entry):
    """User code put a pathlib.Path (or bytes) into sys.path, which imports tolerate: the
    child's PYTHONPATH takes it as text (breaker finding: joining sys.path raised TypeError
    and failed the first MAX_STARTS checkpoints of every attempt)."""
    extra = tmp_path if entry == "path" else os.fsencode(str(tmp_path))
    monkeypatch.setattr(sys, "path", sys.path + [extra])
    sub = _subtask(mysql_url, namespaces, tmp_path, write_render_process=True)
    try:
        _write_values(sub, {"a": 1}, 1)
        process = sub.backend.protocol.render_process
        assert process is not None and process.rendered_epochs == 1 and process.starts == 1
    finally:
        sub.close()


_GARBAGE_CHILD = """#!{python}
import pickle, struct, sys
inp, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    header = inp.read(8)
    if len(header) < 8:
        break
    version, rows, renderers = pickle.loads(inp.read(struct.unpack(">Q", header)[0]))
    reply = pickle.dumps({reply})
    out.write(struct.pack(">Q", len(reply)) + reply)
    out.flush()
"""


def _garbage_child(tmp_path: Path, reply: str) -> str:
    script = tmp_path / "python-garbage"
    script.write_text(_GARBAGE_CHILD.format(python=sys.executable, reply=reply))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.parametrize("reply", ["42", "([], [])",
                                   "(None, None)"],
                         ids=["not-a-pair", "too-few-rows", "nones"])
def test_a_child_that_answers_garbage_falls_back_without_failing_a_checkpoint(
        mysql_url, tmp_path, namespaces, reply):
    """A child that answers garbage is stopped and the writer renders the epoch itself
    (breaker finding: a well-framed reply of the wrong shape — not a pair, fewer rows than
    requested, None — raised TypeError/ValueError outside the fallback and failed the
    checkpoint, at each of the first MAX_STARTS checkpoints)."""
    sub = _subtask(mysql_url, namespaces, tmp_path, write_render_process=True)
    protocol = sub.backend.protocol
    protocol.render_process = RenderProcess("test", python=_garbage_child(tmp_path, reply))
    try:
        _write_values(sub, {f"k{i}": i for i in range(5)}, 1)
        _write_values(sub, {f"k{i}": -i for i in range(5)}, 2)
        assert protocol.render_process.fallbacks == 2
    finally:
        sub.close()
    again = _restore(mysql_url, sub, tmp_path, 2)
    value = again.context.get_state(ValueStateDescriptor("v", ANY))
    try:
        assert [again.key(f"k{i}") and value.value() for i in range(5)] == \
            [-i for i in range(5)]
    finally:
        again.close()


@pytest.mark.parametrize("option", [None, *CHILD_OPTIONS])
def test_without_value_json_the_rows_differ_only_in_vjson_and_restore_alike(
        mysql_url: str, tmp_path: Path, namespaces: list[str], option: str | None) -> None:
    """`write.value-json: false` on each write path (the writer's thread, the render
    process, the write process): `vjson` is NULL in every row, every other column is as
    with it on (the key's JSON too), and the state restores and reads from SQL alike."""
    stored, subs, queried = [], [], []
    for value_json in (True, False):
        ns = unique_namespace("vj")
        namespaces.append(ns)
        extra = {"write_value_json": value_json, **({option: True} if option else {})}
        sub = _run(mysql_url, ns, tmp_path, **extra)
        _fill(sub, 120, 1, 3)
        named = sub.context.get_state(ValueStateDescriptor("r", Types.PICKLED_BYTE_ARRAY()))
        for i in range(5):
            sub.key(f"user-{i}")
            named.update(Row(a=i, b="x"))  # has a JSON form: an object
        sub.checkpoint(4)
        process = sub.backend.protocol.render_process
        assert (process is None) == (option is None)
        sub.close()
        stored.append(_rows(mysql_url, ns))
        subs.append((ns, sub))
        printed = CliRunner().invoke(cli, ["query", "--url", mysql_url, "--namespace", ns,
                                           "--limit", "0"])
        assert printed.exit_code == 0, printed.output
        lines = [json.loads(line) for line in printed.stdout.splitlines()]
        # a list's head holds a random epoch token: equal in neither case
        queried.append([e for e in lines if e["state"] != "l" or "entry" in e])
    assert queried[0] == queried[1]  # `query` prints the same JSON either way
    assert {"a": 0, "b": "x"} in [e["value"] for e in queried[1]]
    assert [[1, 8], [2, 8], [3, 8]] == [  # the elements, not (element, expiry) pairs
        element for e in queried[1] if e["key"] == "user-8" and e["state"] == "l"
        and "entry" in e for element in e["value"]]
    with_json, without = stored
    assert [r[:8] + r[9:] for r in with_json] == [r[:8] + r[9:] for r in without]
    assert sum(r[8] is not None for r in with_json) > 200  # the map's and lists' values
    assert all(r[8] is None for r in without) and all(r[9] is not None for r in without
                                                      if not r[4])  # kjson stays
    ns, sub = subs[1]
    restored = LocalSubtask(open_store(_options(mysql_url, ns)), _options(mysql_url, ns),
                            restored_checkpoint_id=4, storage=sub.storage,
                            local_dir=str(tmp_path / "again"))
    value, mapped, recent = _fill_states(restored)
    restored.key("user-8")
    assert value.value()["cp"] == 3
    assert dict(mapped.items()) == {"e2": 3}  # user-8 puts e{8 % 3} only
    assert list(recent.get()) == [(1, 8), (2, 8), (3, 8)]
    restored.close()
