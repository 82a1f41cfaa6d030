"""Rendering an epoch's state rows as SQL literals in a child process, off the interpreter
lock (`state.backend.ndb.write.render-process`), and with `state.backend.ndb.write.process`
writing them there too (:meth:`RenderProcess.write`, :meth:`RenderProcess.delete_exact`:
the child executes the statements on a fenced connection of its own; docs/protocol.md,
"Writing off the GIL too").

In thread mode the task threads and the background writer share one interpreter and its
lock (java-bridge/README.md): every microsecond of Python the writer spends on an epoch is
taken from the records. The heaviest part of that work is rendering: unpickling each value
for its JSON, encoding the JSON of the value and of the key, and the SQL literals of the
rows (bench part 9 measures it). With this option the writer hands that part to a Python
process of its own, which runs on another core: the writer sends the epoch's rows
(pickled, C code), waits for the rendered text without holding the lock, and executes the
statements itself as before (fenced, in bounded transactions, by
:meth:`StateStore.write_versions <pyflink_ndb.stores.base.StateStore.write_versions>`).
The text is the same as the writer's own rendering: both call :func:`render_row`.

Pipeline: the epoch goes to the child in slices of :data:`SLICE_ROWS` rows; once a
slice's reply is read, the next slice is sent, and the child renders it while the writer
executes the statements of the slice it just got (:meth:`RenderProcess.slices`). The child
holds one slice, the writer at most two slices' rendered text, whatever the epoch's size.

Protocol: frames of an 8-byte big-endian length and a pickle on the child's stdin and
stdout, one request and its reply at a time (a request is sent only after the previous
reply was read in full, so neither side blocks on a full pipe while the other writes); a
request is `("render", version, rows, renderers)` (rows as the tuples of :class:`WriteRow`
without JSON, :class:`JsonRenderer` by state id; the write process's requests are in
:func:`_serve_store`), a reply `(rendered, undecodable)`: per row the
rendered database rows, and the indexes of the rows whose value the child could not
unpickle (a class that only the TaskManager's interpreter can import), which the writer
renders itself, so the JSON column is the same as without the process.

Life cycle: the child starts at the first epoch. A child that fails (exits, closes its
output, answers garbage) is stopped and the rest of the epoch is rendered by the writer
(logged as a warning); the next epoch starts a new child, at most :data:`MAX_STARTS`
times, after which the writer renders every epoch itself. The child ends when its input closes (the
TaskManager or the writer went away) or when :meth:`RenderProcess.close` stops it. It
imports only this package's serialization and store modules (not PyFlink), so it starts in
a fraction of a second and holds about 20 MB.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import select
import shutil
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from pyflink_ndb.cpu_pin import release_child
from pyflink_ndb.errors import (
    FencedError,
    SerializationError,
    StoreUnavailableError,
    ValueTooLargeError,
)
from pyflink_ndb.serialization.keys import KeyJsonMemo
from pyflink_ndb.serialization.values import PLAIN_JSON, JsonRenderer
from pyflink_ndb.stores.base import Deletion, Fence, StateStore, WriteRow, row_params
from pyflink_ndb.stores.mysql import TOO_MANY_CONNECTIONS, render_state_row

try:
    import fcntl
except ImportError:  # not on POSIX: the pipes keep their default size
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: Log lines of the write process that one reply carries at most (then a count).
MAX_LOG_LINES = 50
#: Children started per subtask before the writer gives up on them and renders itself.
MAX_STARTS = 3
#: Seconds between two checks of the writer's cancellation while it waits for the child
#: (a cancelled task's close waits up to this long for the writer; 0.05 made a close
#: during garbage collection take 24-25 ms here, 0.01 15-17 ms).
POLL_SECONDS = 0.01
#: Seconds the child may take without reading a request's byte or writing a reply's byte
#: (a slice of 2,000 rows renders in about 0.1 s): a child that is stopped (SIGSTOP, a
#: frozen cgroup) or hangs is treated as failed, and the writer renders the rest itself.
STALL_SECONDS = 60.0
#: Rows per request: an epoch is rendered in slices, so that the child holds one slice's
#: request and reply at a time instead of the whole epoch's (its memory no longer grows
#: with the largest epoch it rendered).
SLICE_ROWS = 2_000
#: Bytes of keys and values per request at most (a slice ends at the row that reaches it;
#: a single larger value is a slice of its own): large values do not make a slice of
#: SLICE_ROWS rows hold gigabytes in the child and the writer.
SLICE_BYTES = 4 * 1024 * 1024
#: Rows the write process's render thread renders per hand-over to its main thread, which
#: writes them (:class:`_RenderAhead`).
RENDER_AHEAD_ROWS = 100
#: The write process's thread switch interval, seconds (Python's default is 0.005): its main
#: thread, back from the database, waits at most this long for the interpreter lock while
#: the render thread renders (several times per transaction: send, fence check, commit).
CHILD_SWITCH_INTERVAL_S = 0.0005
#: Seconds after a further connection of the write process failed to open (or was given up:
#: its reconnect refused by the server's connection limit) before it is tried again (the
#: writes go on the connections open meanwhile).
REOPEN_AFTER_S = 60.0
#: Seconds a slice waits for the further connections that its request starts to open (a
#: thread of their own opens them, :meth:`_Connections.open_more`); a connection that
#: takes longer is used from the next slice on. On loopback one opens in a few
#: milliseconds; a handshake that hangs (found by a breaker: the store's retries of a
#: dropped handshake held every slice for the whole retry deadline, 90 s by default) costs
#: a slice at most this long, once per :data:`REOPEN_AFTER_S`.
OPEN_WAIT_S = 1.0
#: Bytes of a widened pipe to or from the child (:func:`_widen_pipes`), where allowed: the
#: default /proc/sys/fs/pipe-max-size. A widened pipe counts against the user's
#: `pipe-user-pages-soft` (64 MiB by default, for every process of that user), so only the
#: pipes that carry slices are widened.
PIPE_BYTES = 1 << 20
_HEADER = struct.Struct(">Q")
#: Started as `python -c BOOTSTRAP <package folder> <int digit limit>`: a stub of the
#: top-level package keeps `pyflink_ndb/__init__.py` (which imports PyFlink) from running
#: in the child, the frames use the real stdout, which the child's own prints can no longer
#: reach, and the child converts ints to text under the writer's limit
#: (`sys.set_int_max_str_digits`), so its JSON is the writer's.
BOOTSTRAP = (
    "import sys, types\n"
    "if hasattr(sys, 'set_int_max_str_digits'):\n"
    "    sys.set_int_max_str_digits(int(sys.argv[2]))\n"
    "out = sys.stdout.buffer\n"
    "sys.stdout = sys.stderr\n"
    "package = types.ModuleType('pyflink_ndb')\n"
    "package.__path__ = [sys.argv[1]]\n"
    "sys.modules['pyflink_ndb'] = package\n"
    "from pyflink_ndb.stores.render_process import serve\n"
    "serve(sys.stdin.buffer, out)\n")

#: Per entry, its database rows rendered as SQL literals (ASCII bytes: hex literals, digits,
#: NULL), which go into the statements unchanged (pymysql sends bytes queries as they are).
Rendered = list[list[bytes]]


def _widen_pipes(child: subprocess.Popen[bytes], replies_too: bool) -> None:
    """Make the pipe to `child` (and with `replies_too` the one from it: the render
    process's replies carry the rendered slice, the write process's a few numbers)
    :data:`PIPE_BYTES` large where the system allows (Linux `F_SETPIPE_SZ`; a refusal, for
    a size over pipe-max-size or over the user's pipe budget, leaves the default). Each
    wait of the writer for a pipe (the `select` before each write or read, the write
    itself) gives up the interpreter lock, and under the task threads' load taking it back
    costs up to a switch interval (5 ms): with the 64 KiB default a slice's 2 MB request
    took some 32 writes."""
    setter = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setter is None:
        return
    for stream in (child.stdin, child.stdout if replies_too else None):
        if stream is None:
            continue
        try:
            fcntl.fcntl(stream.fileno(), setter, PIPE_BYTES)
        except OSError:  # EPERM (over a limit) or EBADF: the default size stays
            continue


def _connection_of(answer: Any) -> tuple[int, ...] | None:
    """The server threads a child's `("connection", server_threads)` frame reports; None
    for any other frame."""
    if (type(answer) is tuple and len(answer) == 2 and answer[0] == "connection"
            and type(answer[1]) is tuple and answer[1]
            and all(type(thread) is int for thread in answer[1])):
        return tuple(answer[1])
    return None


def _last_report(child: subprocess.Popen[bytes], known: tuple[int, ...]) -> tuple[int, ...]:
    """The server threads of the last `("connection", ...)` report among the frames a
    stopped `child` left in its output pipe (read to its end: the child is dead), or
    `known` when there is none or the pipe cannot be read."""
    stream = child.stdout
    if stream is None:
        return known
    try:
        data = stream.read()
    except (OSError, ValueError):
        return known
    offset = 0
    while offset + _HEADER.size <= len(data):
        (size,) = _HEADER.unpack_from(data, offset)
        offset += _HEADER.size
        if offset + size > len(data):
            break
        try:
            threads = _connection_of(pickle.loads(data[offset:offset + size]))
        except Exception:  # noqa: BLE001 - a broken frame ends the reading
            break
        if threads is not None:
            known = threads
        offset += size
    return known


class RenderProcessError(Exception):
    """The child could not be started or failed; the writer renders the epoch itself."""


#: What a failing child raises in the writer (it is stopped; the writer renders instead).
_CHILD_ERRORS = (RenderProcessError, OSError, EOFError, pickle.UnpicklingError, ValueError)


def _json_of(renderers: Mapping[int, JsonRenderer]) -> Callable[[int, bytes], str | None]:
    """`json_of(state_id, value)`: the JSON of a value by its state's renderer
    (:data:`PLAIN_JSON` for a state without one)."""
    def json_of(state_id: int, value: bytes) -> str | None:
        return renderers.get(state_id, PLAIN_JSON)(value)
    return json_of


def render_rows(version: int, rows: Sequence[WriteRow],
                renderers: Mapping[int, JsonRenderer],
                key_json: Callable[[bytes], str | None] | None = None
                ) -> tuple[Rendered, list[int]]:
    """Render `rows` (without JSON, in (state, ukey) order) written as `version`: per row its
    database rows as SQL literals (:func:`~pyflink_ndb.stores.base.row_params`,
    :func:`~pyflink_ndb.stores.mysql.render_state_row`) with the JSON of the value (the
    state's renderer, :data:`PLAIN_JSON` by default) and of the Flink key.

    :param key_json: the JSON of a ukey's Flink key (None: a fresh
        :class:`~pyflink_ndb.serialization.keys.KeyJsonMemo`).
    :returns: (the rendered rows, the indexes of the rows whose value cannot be unpickled
        here; their entry in the first list is empty).
    """
    if key_json is None:
        key_json = KeyJsonMemo()
    json_of = _json_of(renderers)
    rendered: Rendered = []
    undecodable: list[int] = []
    for index, row in enumerate(rows):
        try:
            rendered.append(render_row(version, row, json_of, key_json))
        except SerializationError:
            undecodable.append(index)
            rendered.append([])
    return rendered, undecodable


def render_row(version: int, row: WriteRow, json_of: Callable[[int, bytes], str | None],
               key_json: Callable[[bytes], str | None]) -> list[bytes]:
    """The database rows of `row` (without JSON) written as `version`, as SQL literals,
    with `json_of(state_id, value)` and `key_json(ukey)` as the JSON of its value and key
    (a tombstone has neither).

    :raises SerializationError: from `json_of` (the value cannot be unpickled here).
    """
    if not row.tombstone and row.value is not None:
        row = row._replace(value_json=json_of(row.state_id, row.value),
                           key_json=key_json(row.ukey))
    return [render_state_row(p).encode("ascii") for p in row_params(version, row)]


def render_here(version: int, rows: Sequence[WriteRow],
                json_of: Callable[[int, bytes], str | None],
                key_json: Callable[[bytes], str | None]) -> Rendered:
    """:func:`render_row` of each of `rows`, in the writer (when the child cannot)."""
    return [render_row(version, row, json_of, key_json) for row in rows]


def _wait_fd(fd: int, writing: bool, timeout_s: float) -> bool:
    """Whether `fd` can be written (`writing`) or read within `timeout_s` seconds.

    `poll`, not `select`: a TaskManager holds thousands of descriptors (its RocksDB
    files, sockets, jars), and `select` refuses any numbered 1024 or more ("filedescriptor
    out of range in select()": the render process was given up for the writer; found
    when a test process held that many)."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if writing else select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def slices_of(rows: Iterable[WriteRow]) -> Iterator[list[WriteRow]]:
    """`rows` in slices, in order: at most :data:`SLICE_ROWS` rows, and ended by the row
    whose key and value bytes reach :data:`SLICE_BYTES`. Takes rows from `rows` only as
    far as the slice it yields (a generator of rows is read one slice ahead at most)."""
    part: list[WriteRow] = []
    size = 0
    for row in rows:
        part.append(row)
        size += len(row[2]) + len(row[4] or b"")
        if len(part) >= SLICE_ROWS or size >= SLICE_BYTES:
            yield part
            part, size = [], 0
    if part:
        yield part


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The child's loop: answer each request frame with a reply frame until the input
    closes. A request is `("render", version, rows, renderers)` (reply: `(rendered,
    undecodable)`, see :func:`render_rows`), `("write", store, fence, version, rows,
    renderers, connections)` or `("delete", store, fence, deletions)` (see
    :func:`_serve_store`)."""
    sys.setswitchinterval(CHILD_SWITCH_INTERVAL_S)
    logs = _LogLines()
    root = logging.getLogger()
    root.handlers[:] = [logs]  # the store's retries go back to the writer with the reply
    root.setLevel(logging.WARNING)
    key_json = KeyJsonMemo()
    stores: dict[bytes, _Connections] = {}

    def read() -> Any:
        header = requests.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack(header)
        return pickle.loads(requests.read(size))

    replying = threading.Lock()  # a reconnect's report may come from a writing thread

    def reply(message: object) -> None:
        frame = pickle.dumps(message, protocol=5)
        with replying:
            replies.write(_HEADER.pack(len(frame)) + frame)
            replies.flush()

    while (request := read()) is not None:
        if request[0] == "render":
            _, version, rows, renderers = request
            reply(render_rows(version, [WriteRow(*r) for r in rows], renderers, key_json))
        else:
            reply((*_serve_store(request, stores, key_json, read, reply),
                   logs.take()))


class _LogLines(logging.Handler):
    """The child's log records (the store's retry warnings), kept until the next reply
    takes them to the writer, which logs them in the TaskManager's log: the child's
    standard error is /dev/null (an inherited one can be a pipe nobody reads: PyFlink's
    gateway starts the JVM with `stderr=PIPE`, and a child writing to it blocks once it
    is full). At most :data:`MAX_LOG_LINES` per reply, then a count of the others."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("%(message)s"))
        self._lines: list[str] = []
        self._dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if len(self._lines) < MAX_LOG_LINES:
            self._lines.append(self.format(record))
        else:
            self._dropped += 1

    def take(self) -> list[str]:
        self.acquire()  # emit() runs under the same lock, from any of the child's threads
        try:
            lines, self._lines = self._lines, []
            if self._dropped:
                lines.append(f"... and {self._dropped} more lines like these")
                self._dropped = 0
            return lines
        finally:
            self.release()


def _serve_store(request: tuple[Any, ...], stores: dict[bytes, _Connections],
                 key_json: KeyJsonMemo, read: Callable[[], Any],
                 reply: Callable[[object], None]) -> tuple[Any, ...]:
    """The child's part of :meth:`RenderProcess.write` (one slice) and
    :meth:`RenderProcess.delete_exact`, on the child's own connections: `store` is the
    writer's store, pickled without its connection (the child connects once per distinct
    store and keeps its connections in `stores`: the first for deletes and writes, the
    others for writes only).

    A write renders its rows as :func:`render_rows` does, on a thread of its own
    (:class:`_RenderAhead`), and writes them as they are rendered, in the transactions of
    :meth:`StateStore.write_versions`, on as many connections at once as the request
    asks (:func:`write_batches`; `write.process-connections`); a row whose value the child
    cannot unpickle is asked for when the writes reach the first of them (with every
    other one rendered by then): the reply `("undecodable", indexes)` is answered by a
    request `("literals", {index: rendered})`, rendered by the writer. A delete runs
    :meth:`StateStore.delete_exact`. A reply `("connection", server_threads)` names the
    child's connections on the server whenever they change: before the work (the first
    request, a new connection) and at once after a reconnect inside a statement's
    retries (:class:`_Connections`); the writer's close has the server end their
    statements (`KILL CONNECTION`, :meth:`RenderProcess.interrupt`). A further connection
    that fails to open is logged, and the writes go on the connections open
    (:meth:`_Connections.open_more`); so do the writes of a slice one of whose
    connections is lost and refused a new one by the server's connection limit
    (:meth:`_Connections.give_up`). When the server refuses the child's first connection,
    or the reconnect of the only connection left (or a delete's), for a connection limit,
    the reply is `refused`: the writer does that work on its own connection, and this
    child stays and connects again at the next request (found by breakers: one lost
    connection at the limit failed every later checkpoint; a refused first connection
    spent the child's starts and left the write process off for good).

    :returns: the final reply without its log lines (:func:`serve` adds them),
        `("done", rows, retries)` (rows written or deleted, the store's retries meanwhile)
        or `("error", kind, message)` with kind `fenced`, `unavailable`, `too-large`,
        `refused` (see above) or `failed` (any other error: the writer stops this child
        and does the work itself).
    """
    kind, store_bytes, fence, *args = request
    try:
        connections = stores.get(store_bytes)
        if connections is None:
            for old in stores.values():
                old.close()
            stores.clear()
            # A refused first connection is answered `refused` below, as a refused reconnect.
            connections = _Connections(store_bytes, reply)
            stores[store_bytes] = connections
        # The writer's close has the server end these connections (KILL CONNECTION) when it
        # stops this child mid-request: tell it which connections they are.
        connections.open_more(args[3] if kind == "write" else 1)
        before = connections.retries()
        store = connections.stores[0]
        if kind == "delete":
            done = store.delete_exact(fence, [Deletion(*d) for d in args[0]])
            return ("done", done, connections.retries() - before)
        version, rows, renderers, wanted = args
        rows = [WriteRow(*r) for r in rows]

        def ask(indexes: list[int]) -> dict[int, list[bytes]]:
            """The writer's rendering of rows `indexes`, which the child cannot unpickle."""
            reply(("undecodable", indexes))
            answer = read()
            if (answer is None or answer[0] != "literals"
                    or not all(index in answer[1] for index in indexes)):
                raise RenderProcessError("the writer did not send the undecodable rows")
            return answer[1]

        with _RenderAhead(version, rows, renderers, key_json) as ahead:
            done = write_batches(connections.stores[:wanted], fence, store.version_batches(
                version, rows, None, ahead.rendered(ask)), connections.give_up)
        return ("done", done, connections.retries() - before)
    except FencedError as err:
        return ("error", "fenced", str(err))
    except StoreUnavailableError as err:
        if _connection_limit(err):  # not an outage: the writer's own connection may work
            return ("error", "refused", str(err))  # connected again at the next request
        return ("error", "unavailable", str(err))
    except ValueTooLargeError as err:
        return ("error", "too-large", str(err))
    except Exception as err:  # the writer stops this child and does the work itself
        return ("error", "failed", f"{type(err).__name__}: {err}")


class _Connections:
    """The write process's connections to one store (the writer's, unpickled: each a
    store of its own): the first for deletes and writes, the others for writes only
    (`write.process-connections`). Whenever a connection's server thread changes (a new
    connection, a reconnect inside a statement's retries, a connection given up) the
    connections are reported to the writer at once with `report` (thread-safe), so that
    its close can end each one's statement (:meth:`RenderProcess.interrupt`).

    :raises StoreUnavailableError: the first connection failed (as
        :meth:`StateStore.connect`)."""

    def __init__(self, store_bytes: bytes, report: Callable[[object], None]) -> None:
        self._store_bytes = store_bytes
        self._report = report
        self._lock = threading.Lock()
        #: The server threads last reported to the writer.
        self._reported: tuple[int, ...] = ()
        #: When a further connection may be tried again after one failed to open or was
        #: given up (time.monotonic(); 0: any time).
        self._retry_at = 0.0
        #: The thread opening further connections, while it runs.
        self._opener: threading.Thread | None = None
        #: The retries of the connections given up (:meth:`retries` counts them on).
        self._retired_retries = 0
        self._closed = False
        self.stores = [self._connected()]

    def _connected(self) -> StateStore:
        store: StateStore = pickle.loads(self._store_bytes)
        store.connect()
        store.on_reconnect = self.report_changes
        return store

    def open_more(self, wanted: int) -> None:
        """Have `wanted` connections open: the missing ones are opened by a thread of
        their own, which this waits for at most :data:`OPEN_WAIT_S` (a connection that
        opens later is used from the next request on). A further connection that fails
        to open (the server's connection limit, a host it blocks, a handshake it drops
        or never answers) is logged and the writes go on those open; it is tried again
        after :data:`REOPEN_AFTER_S` (the first connection's failures are the
        request's)."""
        with self._lock:
            opener = None
            if (len(self.stores) < wanted and self._opener is None
                    and time.monotonic() >= self._retry_at):
                opener = self._opener = threading.Thread(
                    target=self._open, args=(wanted,), daemon=True,
                    name="pyflink-ndb-write-connect")
                try:
                    opener.start()
                except RuntimeError as err:  # no thread now: tried at the next request
                    self._opener = opener = None
                    log.warning("a further connection could not be opened (%s)", err)
        if opener is not None:
            opener.join(OPEN_WAIT_S)
        self.report_changes()

    def _open(self, wanted: int) -> None:
        """The opener thread of :meth:`open_more`."""
        try:
            while (len(self.stores) < wanted and not self._closed
                   and time.monotonic() >= self._retry_at):  # a give-up meanwhile waits
                try:
                    store = self._connected()
                except StoreUnavailableError as err:
                    self._retry_at = time.monotonic() + REOPEN_AFTER_S
                    if self._closed:
                        return
                    log.warning("a further connection failed to open (%s): the writes go on "
                                "%d connection(s); it is tried again in %.0f s", err,
                                len(self.stores), REOPEN_AFTER_S)
                    return
                with self._lock:
                    if self._closed:
                        store.close()
                        return
                    self.stores = [*self.stores, store]
                self.report_changes()
        finally:
            with self._lock:
                self._opener = None

    def give_up(self, store: StateStore, err: BaseException) -> bool:
        """For :func:`write_batches`: give up connection `store`, whose write failed with
        `err`, when the server refused its reconnect for a connection limit (another
        client may have taken the slot it held): it is closed and dropped, logged, and
        opened again after :data:`REOPEN_AFTER_S`. Returns True when it was given up;
        False for any other error (the write's failure)."""
        if not (isinstance(err, StoreUnavailableError) and _connection_limit(err)):
            return False
        with self._lock:
            if store not in self.stores:
                return False
            self.stores = [s for s in self.stores if s is not store]
            self._retired_retries += store.retries
            self._retry_at = time.monotonic() + REOPEN_AFTER_S
        store.close()
        log.warning("a connection was lost and the server refused a new one (%s): the "
                    "writes go on %d connection(s); it is tried again in %.0f s", err,
                    len(self.stores), REOPEN_AFTER_S)
        self.report_changes()
        return True

    def report_changes(self) -> None:
        """Report the connections' server threads to the writer when they changed since
        the last report (a new connection, a reconnect, one given up; from any thread)."""
        with self._lock:
            if self._closed:  # a set replaced by another store's: nothing to report
                return
            threads = tuple(t for t in (s.server_thread() for s in self.stores)
                            if t is not None)
            if threads and threads != self._reported:
                self._reported = threads
                self._report(("connection", threads))

    def retries(self) -> int:
        """The retries of every connection so far, those given up included."""
        return self._retired_retries + sum(store.retries for store in self.stores)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stores = self.stores
        for store in stores:
            store.close()


def write_batches(stores: Sequence[StateStore], fence: Fence,
                  batches: Iterator[list[Any]],
                  give_up: Callable[[StateStore, BaseException], bool] | None = None) -> int:
    """Write `batches` (:meth:`StateStore.version_batches`), fenced, each in a transaction
    of its own, on the connections of `stores` at once: each connection takes the next
    batch once it has committed its last (`write.process-connections`; the batches hold
    distinct primary keys and share the owner row's shared lock of the fence; a lock wait
    or deadlock between them, as when rows that exist are written again, is retried as
    any). Returns the rows written, once every batch taken is committed. The first
    failure (of a write, or of taking a batch: a rendering error, an oversized row) stops
    the others taking more and is raised once they have finished the batch they hold.

    :param give_up: asked when a connection's write fails, with the connection and the
        error (:meth:`_Connections.give_up`); True: that connection stops, and the batch
        it held is written on the others (a batch is an idempotent upsert of its rows).
        Never asked for the last connection left, whose failure is raised. None: every
        failure is raised.
    :raises FencedError, StoreUnavailableError, ValueTooLargeError: as
        :meth:`StateStore.write_versions`."""
    if len(stores) == 1:
        return sum(stores[0].write_batch(fence, batch) for batch in batches)
    lock = threading.Lock()
    failures: list[BaseException] = []
    #: Batches of connections given up, for the others to write.
    handed_back: list[list[Any]] = []
    live = set(range(len(stores)))
    written = [0] * len(stores)

    def work(index: int) -> None:
        batch: list[Any] | None = None
        try:
            while True:
                with lock:  # `batches` renders and may ask the writer: one taker at a time
                    if failures:
                        return
                    batch = handed_back.pop() if handed_back else next(batches, None)
                if batch is None:
                    return
                written[index] += stores[index].write_batch(fence, batch)
                batch = None
        except BaseException as err:  # noqa: BLE001 - raised by the caller
            with lock:
                if batch is not None and hand_back(index, batch, err):
                    return
                failures.append(err)

    def hand_back(index: int, batch: list[Any], err: BaseException) -> bool:
        """Whether connection `index` is given up for `err` (its batch then goes back)."""
        if give_up is None or len(live) < 2:
            return False
        try:
            given = give_up(stores[index], err)
        except Exception:  # noqa: BLE001 - the write's own error is the one to raise
            log.debug("give_up failed", exc_info=True)
            given = False
        if given:
            live.discard(index)
            handed_back.append(batch)
        return given

    threads = [threading.Thread(target=work, args=(index,), daemon=True,
                                name=f"pyflink-ndb-write-{index}")
               for index in range(1, len(stores))]
    for thread in threads:
        thread.start()
    work(0)
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    while handed_back:  # given back after the others had taken the last batch
        batch = handed_back.pop()
        index = min(live)
        try:
            written[index] += stores[index].write_batch(fence, batch)
        except BaseException as err:
            if not hand_back(index, batch, err):
                raise
    return sum(written)


class _RenderAhead:
    """The write process's rendering of one slice, by a thread of its own while the main
    thread writes the rows rendered before: the database's work on one transaction overlaps
    the rendering of the next (unpickling values for their JSON, the SQL literals), which
    before came first, whole, for the slice. The thread renders :data:`RENDER_AHEAD_ROWS`
    rows per hand-over and never waits for the writes (it holds at most the slice's text,
    as the child did before). Its failures reach the main thread where it takes the rows
    it failed on. Use as a context manager: leaving stops the thread."""

    def __init__(self, version: int, rows: Sequence[WriteRow],
                 renderers: Mapping[int, JsonRenderer], key_json: KeyJsonMemo) -> None:
        self._rows = rows
        self._queue: queue.SimpleQueue[list[list[bytes] | None] | BaseException] = \
            queue.SimpleQueue()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._render, name="pyflink-ndb-render-ahead",
                                        args=(version, _json_of(renderers), key_json),
                                        daemon=True)

    def __enter__(self) -> _RenderAhead:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._thread.join()

    def _render(self, version: int, json_of: Callable[[int, bytes], str | None],
                key_json: KeyJsonMemo) -> None:
        try:
            for start in range(0, len(self._rows), RENDER_AHEAD_ROWS):
                if self._stopped.is_set():
                    return
                chunk: list[list[bytes] | None] = []
                for row in self._rows[start:start + RENDER_AHEAD_ROWS]:
                    try:
                        chunk.append(render_row(version, row, json_of, key_json))
                    except SerializationError:
                        chunk.append(None)  # the writer renders it (see `rendered`)
                self._queue.put(chunk)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            self._queue.put(err)

    def rendered(self, ask: Callable[[list[int]], dict[int, list[bytes]]]
                 ) -> Iterator[list[bytes]]:
        """Per row of the slice, in order, its rendered database rows, as the thread
        renders them. Rows the child cannot unpickle are asked of the writer when the
        writes reach the first of them, together with every other such row rendered by
        then: `ask(indexes)` returns their rendered rows by index.

        :raises BaseException: what the thread raised rendering the next row."""
        index = 0
        ready: deque[list[list[bytes] | None] | BaseException] = deque()
        answers: dict[int, list[bytes]] = {}
        while index < len(self._rows):
            chunk = ready.popleft() if ready else self._queue.get()
            if isinstance(chunk, BaseException):
                raise chunk
            for offset, literals in enumerate(chunk):
                if literals is None and index not in answers:
                    while True:  # the chunks rendered by now: one question for them all
                        try:
                            ready.append(self._queue.get_nowait())
                        except queue.Empty:
                            break
                    missing = [index + i for i, r in enumerate(chunk[offset:]) if r is None]
                    start = index + len(chunk) - offset
                    for later in ready:
                        if isinstance(later, BaseException):
                            break
                        missing += [start + i for i, r in enumerate(later) if r is None]
                        start += len(later)
                    answers.update(ask(missing))
                yield answers.pop(index) if literals is None else literals
                index += 1


def _connection_limit(err: StoreUnavailableError) -> bool:
    """Whether `err` is the server refusing the child's connection for a connection limit
    (:data:`~pyflink_ndb.stores.mysql.TOO_MANY_CONNECTIONS`): not an outage, since the
    writer's connection is open, so the writer does the work (found by a breaker: at
    `max_connections` every checkpoint failed)."""
    args: tuple[Any, ...] = getattr(err.__cause__, "args", ())
    return bool(args) and args[0] in TOO_MANY_CONNECTIONS


def python_executable() -> str | None:
    """A Python interpreter for the child: this one's, when `sys.executable` is a Python
    (in the TaskManager's embedded interpreter it may be the JVM), else the first
    `python3` on `PATH` of the same version (thread mode puts the virtualenv's first);
    None when there is none."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, getattr(sys, "_base_executable", None)):
        if candidate and Path(candidate).name.startswith("python") and os.access(
                candidate, os.X_OK):
            return candidate
    return shutil.which(version) or shutil.which("python3")


class RenderProcess:
    """The render process of one subtask's background writer (used from that thread only;
    :meth:`close` and :meth:`interrupt` from any thread).

    :param name: for log messages (operator/subtask).
    :param python: the interpreter to start (None: :func:`python_executable`).
    :param kind: what the child is called in log messages: "render" (default) or "write"
        (`write.process`).
    """

    def __init__(self, name: str, python: str | None = None, kind: str = "render") -> None:
        self.name = name
        self.kind = kind
        self.python = python
        self.starts = 0
        #: Epochs rendered by the child / by the writer after a failure (metrics, tests).
        self.rendered_epochs = 0
        #: Epochs written by the child (`write.process`).
        self.written_epochs = 0
        self.fallbacks = 0
        #: Requests the child could not do because the server refused its connection
        #: (a connection limit): done by the writer, the child kept (metrics, tests).
        self.refusals = 0
        #: Set once the writer's store could not be pickled for the child: the writer
        #: writes itself from then on (logged once).
        self.unpicklable_store: str | None = None
        #: The latest write or delete fell back to the writer (see :attr:`delegates`).
        self.writing_here = False
        #: The server threads of the child's connections, as the child last reported them
        #: (empty: no child, or it has not connected yet); see :meth:`interrupt`.
        self.server_threads: tuple[int, ...] = ()
        #: The most connections a write request asked the running child for (0: none).
        self._asked_connections = 0
        #: The writer's store while a write or delete request is with the child (from its
        #: send to its reply; None: none): the store through which the server is asked
        #: to end the child's statements (:meth:`_kill_connections`).
        self._request_store: StateStore | None = None
        #: A frame of the reply that :meth:`_take_connection` read before
        #: :meth:`_store_finish` (in a 1-tuple; None: none).
        self._early_answer: tuple[Any] | None = None
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The running child's process id (None: none runs); for fault injection."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    @property
    def usable(self) -> bool:
        """False once :data:`MAX_STARTS` children failed: the writer renders itself."""
        return self._child is not None or self.starts < MAX_STARTS

    @property
    def delegates(self) -> bool:
        """The child runs the writer's statements: it is usable, the store could be
        handed to it, and the latest :meth:`write` or :meth:`delete_exact` did not fall
        back to the writer (a child that failed mid-epoch)."""
        return self.usable and self.unpicklable_store is None and not self.writing_here

    def _pickled(self, store: StateStore) -> bytes | None:
        """`store` pickled for the child (without its connection), or None when it cannot
        be (an attribute a pickle cannot hold, e.g. a lock set on the store by code
        around it): logged once, and the writer writes and deletes itself from then on,
        so no checkpoint fails for it."""
        if self.unpicklable_store is not None:
            return None
        try:
            return pickle.dumps(store, protocol=5)
        except Exception as err:  # noqa: BLE001 - whatever pickling raises, write here
            self.unpicklable_store = f"{type(err).__name__}: {err}"
            log.warning("pyflink-ndb %s: the store %s cannot be handed to the write process "
                        "(%s); the background writer writes and deletes itself from now "
                        "on", self.name, store.describe(), self.unpicklable_store)
            return None

    def slices(self, version: int, rows: Sequence[WriteRow],
               renderers: Mapping[int, JsonRenderer],
               json_of: Callable[[int, bytes], str | None],
               key_json: Callable[[bytes], str | None],
               between: Callable[[], None] | None = None) -> Generator[Rendered, None, None]:
        """The rendered rows of `rows` (see :func:`render_rows`), one list per slice
        (:func:`slices_of`), in order. The child renders the next slice while the
        caller uses this one (the writer executes its statements), so the writer holds
        at most two slices' rendered text. Rows the child could not decode are rendered
        here with `json_of(state_id, value)` and `key_json(ukey)`; so is every slice
        after a failure of the child (logged as a warning) and every slice once
        :attr:`usable` is False: the text is the same either way.

        `between()` is called while waiting (the writer's cancellation point; what it
        raises stops the child and propagates). Close the generator when done with it
        (:func:`contextlib.closing`): closed with a request in flight, it stops the child,
        whose reply would be stale.
        """
        def here(part: Sequence[WriteRow]) -> Rendered:
            return render_here(version, part, json_of, key_json)

        in_flight = False

        def send(part: Sequence[WriteRow], start: bool = False) -> bool:
            """Send `part`; False when the child failed (stopped and logged)."""
            nonlocal in_flight
            in_flight = True  # from its first byte: a part of a request is stale too
            try:
                self._send(version, part, states, between, start)
            except _CHILD_ERRORS as err:
                in_flight = False
                return not self._failed(err)
            return True

        states = dict(renderers)
        failed = not self.usable
        try:
            parts = list(slices_of(rows))
            if parts and not failed:
                failed = not send(parts[0], start=True)
            for number, part in enumerate(parts):
                if failed:
                    yield here(part)
                    continue
                try:
                    rendered, undecodable = self._receive(len(part), between)
                    in_flight = False
                except _CHILD_ERRORS as err:
                    in_flight = False
                    failed = self._failed(err)
                    yield here(part)
                    continue
                if number + 1 < len(parts):
                    failed = not send(parts[number + 1])
                for index in undecodable:
                    rendered[index] = render_row(version, part[index], json_of, key_json)
                yield rendered
            if not failed:
                self.rendered_epochs += 1
        finally:
            if in_flight:  # cancelled, failed or closed early: the reply would be stale
                self._stop()

    def write(self, store: StateStore, fence: Fence, version: int, rows: Iterable[WriteRow],
              renderers: Mapping[int, JsonRenderer],
              json_of: Callable[[int, bytes], str | None],
              key_json: Callable[[bytes], str | None],
              between: Callable[[], None] | None = None,
              value_max_bytes: int | None = None, stall_s: float | None = None,
              connections: int = 1) -> int:
        """Write `rows` (without JSON, in (state, ukey) order) as `version` from the child
        (`state.backend.ndb.write.process`): slice by slice (:func:`slices_of`), the
        child renders each slice as :func:`render_rows` does and writes it in the
        transactions of :meth:`StateStore.write_versions` on `connections` connections of
        its own to `store`'s database at once (`write.process-connections`; each takes
        the next transaction when it committed its last, :func:`write_batches`), each
        transaction fenced by `fence`. While the child writes a
        slice, the next slice is taken from `rows` (a generator: the writer reads the
        epoch's next rows out of tiers 1-2 meanwhile, docs/protocol.md, "Writing off the
        GIL too") and sent once the child reported the previous one committed. Returns
        the database rows written, once every row is committed (the caller writes the
        snapshot row after, on its own connection).

        Each slice's sizes are checked (:meth:`StateStore.check_sizes`) before it is
        sent: an oversized row fails the write before anything of its slice is written
        (earlier slices may be committed, as after any failed write: their version is
        never restorable without the snapshot row). A child that fails (exits, stalls
        for `stall_s` seconds, answers garbage, or fails the write for any reason but the
        three below) is stopped and logged, and the writer renders and writes the slice
        it was writing and the rest itself, on `store` (the rows are idempotent upserts
        of `version`: a slice the child committed in part is written again whole); rows
        whose value only the writer can unpickle are rendered here and sent to the
        child. A store that cannot be pickled for the child is written here
        (:meth:`_pickled`).

        :param stall_s: seconds a slice may take without a byte from the child (at least
            the store's retry deadline: the child retries as the store does; None:
            :data:`STALL_SECONDS`).
        :param connections: connections the child writes on at once (at least 1; fewer
            while a further one fails to open, :class:`_Connections`).
        :raises FencedError: the branch no longer owns its key groups.
        :raises StoreUnavailableError: the child's retries are spent.
        :raises ValueTooLargeError: a key or value over its limit (nothing of its slice
            written).
        """
        store_bytes = self._pickled(store) if self.usable else None
        self.writing_here = store_bytes is None
        states = dict(renderers)
        written = 0
        slices = slices_of(rows)
        part = next(slices, None)
        number = 0
        try:
            while part is not None:
                store.check_sizes(part, value_max_bytes, f"version {version}")
                if not self.writing_here:
                    def literals(indexes: list[int], part: Sequence[WriteRow] = part
                                 ) -> dict[int, list[bytes]]:
                        return {i: render_row(version, part[i], json_of, key_json)
                                for i in indexes}
                    sent = self._store_send(
                        ("write", store_bytes, fence, version, list(map(tuple, part)), states,
                         connections),
                        store, between, number == 0, stall_s)
                    following = next(slices, None)  # read while the child writes `part`
                    done = None if not sent else self._store_finish(
                        len(part), literals, store, between, stall_s)
                    if done is not None:
                        written += done
                        part, number = following, number + 1
                        continue
                    self.writing_here = True
                else:
                    following = next(slices, None)
                written += store.write_versions(
                    fence, version, part, None, between,
                    rendered=render_here(version, part, json_of, key_json))
                part, number = following, number + 1
        except BaseException:
            if self._request_store is not None:  # its reply would be stale
                self._stop()
            raise
        if not self.writing_here:
            self.written_epochs += 1
        return written

    def delete_exact(self, store: StateStore, fence: Fence, deletions: Sequence[Any],
                     between: Callable[[], None] | None = None,
                     stall_s: float | None = None) -> int:
        """:meth:`StateStore.delete_exact` of `deletions` (each (key_group, state_id, ukey,
        version)) run by the child on its own connection to `store`'s database (garbage
        collection with `state.backend.ndb.write.process`); returns the rows deleted. A
        child that fails leaves the work to the writer, on `store`, as in :meth:`write`
        (deleting a version twice deletes nothing more).

        :raises FencedError: the branch no longer owns its key groups.
        :raises StoreUnavailableError: the child's retries are spent.
        """
        store_bytes = self._pickled(store) if self.usable and deletions else None
        self.writing_here = False
        if store_bytes is not None:
            done = self._store_call(
                ("delete", store_bytes, fence, list(map(tuple, deletions))),
                0, None, store, between, stall_s, start=True)
            if done is not None:
                return done
        self.writing_here = bool(deletions)
        return store.delete_exact(fence, deletions)

    def _store_call(self, request: tuple[Any, ...], rows: int,
                    literals: Callable[[list[int]], dict[int, list[bytes]]] | None,
                    store: StateStore, between: Callable[[], None] | None, stall_s: float | None,
                    start: bool) -> int | None:
        """Send `request` (see :func:`_serve_store`) and return the rows the child wrote or
        deleted: :meth:`_store_send`, then :meth:`_store_finish`; None when the child
        failed (it is stopped and logged: the caller does the work itself).

        :raises FencedError, StoreUnavailableError, ValueTooLargeError: as the child
            reported them.
        """
        if not self._store_send(request, store, between, start, stall_s):
            return None
        return self._store_finish(rows, literals, store, between, stall_s)

    def _store_send(self, request: tuple[Any, ...], store: StateStore,
                    between: Callable[[], None] | None, start: bool,
                    stall_s: float | None = None) -> bool:
        """Send `request` (see :func:`_serve_store`) for `store`, the writer's; its reply
        is read by :meth:`_store_finish`, and until then the request is in flight
        (:meth:`interrupt` ends its statements; a caller that gives up on it stops the
        child, which ends them too: :meth:`_stop`). `start`: start a child unless one
        runs; else the one that took the earlier slices must still run. Returns False
        when the child failed (it is stopped and logged: the caller does the work
        itself)."""
        try:
            self._require_child(start)
            self._request_store = store
            self._send_frame(request, between)
            # A write that asks for more connections than this child was asked for
            # before opens them first: wait for its report.
            wanted = request[-1] if request[0] == "write" else 1
            self._take_connection(between, stall_s, wanted > self._asked_connections)
            self._asked_connections = max(self._asked_connections, wanted)
        except _CHILD_ERRORS as err:
            self._failed(err, "done")
            return False
        except BaseException:
            self._stop()  # cancelled mid-request: its reply would be stale
            raise
        return True

    def _take_connection(self, between: Callable[[], None] | None, stall_s: float | None,
                         opening: bool) -> None:
        """Read the child's report of its connections (`("connection", server_threads)`,
        sent before any work whenever they change) now rather than with the reply: the
        writer reads the epoch's next slice while the request is in flight, and
        :meth:`interrupt` needs the connections meanwhile. A child that has not reported
        one yet (a new child), or that is `opening` more connections for this request,
        is waited for (its first frame: the report, or, when nothing changed, the reply);
        otherwise only a frame already there is read. Another frame read here is kept for
        :meth:`_store_finish`."""
        child = self._child
        assert child is not None and child.stdout is not None
        if self.server_threads and not opening and not _wait_fd(
                child.stdout.fileno(), False, 0):
            return
        answer = self._receive_frame(between, stall_s)
        server_threads = _connection_of(answer)
        if server_threads is not None:
            self.server_threads = server_threads
        else:
            self._early_answer = (answer,)

    def _store_finish(self, rows: int,
                      literals: Callable[[list[int]], dict[int, list[bytes]]] | None,
                      store: StateStore, between: Callable[[], None] | None,
                      stall_s: float | None) -> int | None:
        """The reply to the request in flight (:meth:`_store_send`): the rows the child
        wrote or deleted; None when the child failed (it is stopped and logged: the
        caller does the work itself). Answers each of the child's questions for
        undecodable rows (of the `rows` rows sent) with `literals(indexes)`, and takes
        each report of its connections (:attr:`server_threads`) that comes before the
        reply.

        :raises FencedError, StoreUnavailableError, ValueTooLargeError: as the child
            reported them.
        """
        try:
            try:
                early, self._early_answer = self._early_answer, None
                answer = early[0] if early is not None else \
                    self._receive_frame(between, stall_s)
                while True:  # reports of its connections and questions, then the reply
                    server_threads = _connection_of(answer)
                    if server_threads is not None:
                        self.server_threads = server_threads
                    elif (type(answer) is tuple and len(answer) == 2
                            and answer[0] == "undecodable" and literals is not None):
                        indexes = answer[1]
                        if not (type(indexes) is list
                                and all(type(i) is int and 0 <= i < rows for i in indexes)):
                            raise RenderProcessError(
                                "it asked for rows that are not in the slice")
                        self._send_frame(("literals", literals(indexes)), between)
                    else:
                        break
                    answer = self._receive_frame(between, stall_s)
            except BaseException:
                self._stop()  # cancelled or failed mid-request: its reply would be stale
                raise
            finally:
                self._request_store = None
            if not (type(answer) is tuple and len(answer) == 4 and (
                    (answer[0] == "done" and type(answer[1]) is int
                     and type(answer[2]) is int)
                    or (answer[0] == "error" and type(answer[2]) is str and answer[1] in
                        ("fenced", "unavailable", "too-large", "refused", "failed")))
                    and type(answer[3]) is list
                    and all(type(line) is str for line in answer[3])):
                raise RenderProcessError(f"it answered a reply of the wrong shape "
                                         f"({type(answer).__name__})")
            for line in answer[3]:
                log.warning("pyflink-ndb %s: write process: %s", self.name, line)
        except _CHILD_ERRORS as err:
            self._failed(err, "done")
            return None
        if answer[0] == "done":
            store.retries += int(answer[2])
            return int(answer[1])
        what, message = answer[1], answer[2]
        if what == "fenced":
            raise FencedError(message)
        if what == "unavailable":
            raise StoreUnavailableError(message)
        if what == "too-large":
            raise ValueTooLargeError(message)
        if what == "refused":  # the child is sound and keeps its connections
            self.refusals += 1
            log.log(logging.WARNING if self.refusals == 1 else logging.DEBUG,
                    "pyflink-ndb %s: the server refused the write process's connection "
                    "(%s); the writer does this work itself, and the child connects again "
                    "at its next request%s", self.name, message,
                    "" if self.refusals == 1 else f" ({self.refusals} times)")
            return None
        self._failed(RenderProcessError(f"its work failed: {message}"), "done")
        return None

    def _send_frame(self, message: object, between: Callable[[], None] | None) -> None:
        frame = pickle.dumps(message, protocol=5)
        self._write(_HEADER.pack(len(frame)) + frame, between)

    def _receive_frame(self, between: Callable[[], None] | None, stall_s: float | None
                       ) -> Any:
        (size,) = _HEADER.unpack(self._read(_HEADER.size, between, stall_s))
        return pickle.loads(self._read(size, between, stall_s))

    def _failed(self, err: BaseException, done: str = "rendered") -> bool:
        """Stop the failed child and log it; returns True (the epoch's other slices, or
        the rest of the work, are `done` by the writer)."""
        self._stop()
        self.fallbacks += 1
        log.warning("pyflink-ndb %s: the %s process failed (%s); the rest of this "
                    "work is %s by the writer%s", self.name,
                    self.kind,
                    err if isinstance(err, RenderProcessError)
                    else f"{type(err).__name__}: {err}", done,
                    "" if self.usable else ", and every later one too")
        return True

    def _send(self, version: int, rows: Sequence[WriteRow],
              renderers: dict[int, JsonRenderer], between: Callable[[], None] | None,
              start: bool = False) -> None:
        """One request frame to the child: render `rows`. `start`: the epoch's first
        request, which starts a child if none runs; later ones need the child that
        rendered the epoch's earlier slices.

        :raises RenderProcessError: no child runs (and `start` is False)."""
        self._require_child(start)
        # Plain tuples: pickling a named tuple calls back into Python for every row.
        self._send_frame(("render", version, list(map(tuple, rows)), renderers), between)

    def _require_child(self, start: bool) -> None:
        """`start`: start a child unless one runs; else check that the child that got the
        epoch's earlier slices still runs.

        :raises RenderProcessError: it does not (or none could be started)."""
        if start:
            self._start()
        elif self._child is None or self._child.poll() is not None:
            raise RenderProcessError("it exited" if self._child is None else
                                     f"it exited with code {self._child.returncode}")

    def _receive(self, rows: int, between: Callable[[], None] | None
                 ) -> tuple[Rendered, list[int]]:
        """The reply to the request in flight (a slice of `rows` rows): the rendered rows
        of its slice and the indexes (within the slice) of those the child could not
        decode.

        :raises RenderProcessError: the reply is not of that shape (the child is broken:
            the writer must not write what it sent).
        """
        reply = self._receive_frame(between, None)
        if not (type(reply) is tuple and len(reply) == 2 and type(reply[0]) is list
                and len(reply[0]) == rows and type(reply[1]) is list):
            raise RenderProcessError(f"it answered a reply of the wrong shape for {rows} "
                                     f"rows ({type(reply).__name__})")
        rendered, undecodable = reply
        if not (all(type(i) is int and 0 <= i < rows for i in undecodable)
                and all(type(r) is list and all(type(b) is bytes for b in r)
                        for r in rendered)):
            raise RenderProcessError("it answered rows that are not lists of SQL literals")
        return rendered, undecodable

    def _start(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        self._stop()
        python = self.python or python_executable()
        if python is None:
            self.starts = MAX_STARTS
            raise RenderProcessError("no Python interpreter found (neither sys.executable "
                                     "nor python3 on PATH)")
        self.starts += 1
        env = dict(os.environ)
        # sys.path may hold paths as bytes or path objects too (imports accept them).
        env["PYTHONPATH"] = os.pathsep.join(
            entry for entry in (os.fsdecode(p) for p in sys.path
                                if isinstance(p, (str, bytes, os.PathLike))) if entry)
        package = str(Path(__file__).resolve().parent.parent)
        digits = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0
        try:
            self._child = subprocess.Popen(
                [python, "-c", BOOTSTRAP, package, str(digits)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, close_fds=True)
        except OSError as err:
            raise RenderProcessError(f"cannot start {python}: {err}") from err
        try:  # a pinned writer's child would inherit its one CPU (python.cpu-pin)
            release_child(self._child.pid)
        except OSError:  # it died at once: the first request finds out
            pass
        assert self._child.stdin is not None
        os.set_blocking(self._child.stdin.fileno(), False)  # see _write
        _widen_pipes(self._child, replies_too=self.kind == "render")
        log.info("pyflink-ndb %s: %s process started (pid %d, %s)", self.name, self.kind,
                 self._child.pid, python)
        return self._child

    def _read(self, size: int, between: Callable[[], None] | None,
              stall_s: float | None = None) -> bytes:
        child = self._child
        assert child is not None and child.stdout is not None
        fd = child.stdout.fileno()
        parts: list[bytes] = []
        progress = time.monotonic()
        while size:
            if not self._ready(child, fd, False, between, progress, stall_s):
                continue
            data = os.read(fd, min(size, 1 << 20))
            if not data:
                raise RenderProcessError("it closed its output")
            parts.append(data)
            size -= len(data)
            progress = time.monotonic()
        return b"".join(parts)

    def _write(self, data: bytes, between: Callable[[], None] | None) -> None:
        """Write `data` to the child's input (non-blocking: a child that stops reading
        cannot hold the writer beyond its cancellation or :data:`STALL_SECONDS`)."""
        child = self._child
        assert child is not None and child.stdin is not None
        fd = child.stdin.fileno()
        view = memoryview(data)
        progress = time.monotonic()
        while view:
            if not self._ready(child, fd, True, between, progress):
                continue
            try:
                view = view[os.write(fd, view[:1 << 20]):]
            except BlockingIOError:
                continue
            progress = time.monotonic()

    @staticmethod
    def _ready(child: subprocess.Popen[bytes], fd: int, writing: bool,
               between: Callable[[], None] | None, progress: float,
               stall_s: float | None = None) -> bool:
        """Wait up to :data:`POLL_SECONDS` until `fd` can be written (`writing`) or read;
        False when it cannot yet, after `between()` and a check of the child.

        :raises RenderProcessError: the child exited, or made no progress for `stall_s`
            seconds since `progress` (a monotonic time).
        """
        if _wait_fd(fd, writing, POLL_SECONDS):
            return True
        if between is not None:
            between()
        if child.poll() is not None:
            raise RenderProcessError(f"it exited with code {child.returncode}")
        limit = STALL_SECONDS if stall_s is None else stall_s
        if time.monotonic() - progress > limit:
            raise RenderProcessError(f"it made no progress for {limit:.0f} s")
        return False

    def interrupt(self, store: StateStore) -> None:
        """End the statements the child runs for a write or delete in flight: the server
        ends them (`KILL CONNECTION` of each of the child's connections, through `store`'s
        :meth:`~StateStore.kill_connection`, which returns at once). For the writer's close
        (:meth:`BackgroundWriter.close <pyflink_ndb.checkpoint.writer.BackgroundWriter.close>`),
        which then stops the child: the server notices a killed client only once its
        statement ends, and until then the statement holds its locks (a fenced write holds
        the owner row's shared lock, which the next attempt's claim waits for). Nothing
        when no request is in flight or the child has not reported its connections."""
        if self._request_store is not None:
            self._kill_connections(store, self.server_threads)

    def _kill_connections(self, store: StateStore, server_threads: tuple[int, ...]) -> None:
        """`KILL CONNECTION` of each of `server_threads` through `store` (each on a daemon
        thread of its own; a failure is logged, never raised: the close goes on)."""
        for server_thread in server_threads:
            try:
                store.kill_connection(server_thread)
            except Exception as err:  # e.g. no thread can be started: the statement ends
                log.debug("pyflink-ndb %s: KILL CONNECTION %d not sent: %s", self.name,
                          server_thread, err)

    def _stop(self) -> None:
        """Stop the child. With a request in flight (the writer gives up on it: a cancel,
        a drained close that timed out, a stall, a broken reply) the server then ends
        the child's statements (:meth:`_kill_connections`): killing the child closes its
        connections, but the server notices only once a statement ends, and until then
        it holds its locks, which the writer's own rewrite of the slice or the next
        attempt's claim wait for (found by a breaker: a drained close that timed out
        left two statements waiting for a row lock until its 50 s timeout, and the next
        attempt's claim waited 30 s). The child is killed first, so that no statement
        starts after the kills, and the reports of its connections that it sent before
        it died are read first (a reconnect inside a statement's retries while the
        writer read the next slice), so that the kills reach the connections it had."""
        request_store, self._request_store = self._request_store, None
        server_threads = self.server_threads
        self.server_threads = ()
        self._asked_connections = 0
        self._early_answer = None
        child, self._child = self._child, None
        if child is None:
            return
        if child.poll() is None:
            child.kill()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("pyflink-ndb %s: the render process did not exit", self.name)
        if request_store is not None:
            if child.poll() is not None:  # dead: its output ends, reading cannot block
                server_threads = _last_report(child, server_threads)
            self._kill_connections(request_store, server_threads)
        for stream in (child.stdin, child.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def close(self) -> None:
        """Stop the child (idempotent)."""
        self._stop()
