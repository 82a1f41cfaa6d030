"""A loopback TCP proxy for fault tests: put it between a client and a server, then stop
it (a restart: connections cut, new ones refused), cut its connections (a network reset)
or black-hole it (a partition: it accepts and reads, but nothing ever answers).

Threads only, standard library only. Usage::

    with TcpProxy("127.0.0.1", 3306) as proxy:
        connect(port=proxy.port)
        proxy.cut_connections()
        proxy.stop(); ...; proxy.start()       # same port again
        proxy.set_black_hole(True)
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

_CHUNK = 65536
#: How often the accept loop looks at its stop flag (s).
_POLL_S = 0.05


class _Link:
    """One client connection and, unless it arrived black-holed, its upstream socket."""

    def __init__(self, client: socket.socket, upstream: socket.socket | None) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()
        #: Reset the link when the client first sends (see TcpProxy.drop_in_handshake).
        self.drop_at_client_bytes = False

    def close(self) -> None:
        """Reset both sockets (RST, no lingering FIN handshake); wakes blocked recv()s."""
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            if sock is None:
                continue
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class TcpProxy:
    """Forwards `listen_host:port` to `target_host:target_port`.

    :param target_host: the server's host.
    :param target_port: the server's port.
    :param listen_host: where to listen. Default loopback.
    :param listen_port: 0 (default) picks a free port at the first :meth:`start`; later
        starts reuse it, so clients keep their address across a stop/start.
    """

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1",
                 listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self._port = listen_port
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._black_hole = False
        self._hang_new = False
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        #: Connections accepted since the proxy was created (black-holed ones included).
        self.accepted = 0
        self._drop_in_handshake = 0
        self._limit: tuple[int, int] | None = None
        #: Connections refused by :meth:`limit_connections`.
        self.refused = 0

    # -- life cycle -----------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The listening port (known after the first :meth:`start`)."""
        return self._port

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> TcpProxy:
        """Listen and forward. Returns self.

        :raises RuntimeError: already running.
        :raises OSError: the port cannot be bound.
        """
        if self._listener is not None:
            raise RuntimeError("the proxy is already running")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.listen_host, self._port))
        listener.listen(64)
        self._port = listener.getsockname()[1]
        self._stopping.clear()
        self._listener = listener
        self._accept_thread = threading.Thread(target=self._accept_loop, args=(listener,),
                                               name=f"tcp-proxy-accept-{self._port}",
                                               daemon=True)
        self._accept_thread.start()
        return self

    def stop(self) -> None:
        """Stop listening (new connections are refused) and cut every connection. Idempotent."""
        listener, self._listener = self._listener, None
        self._stopping.set()
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)
            self._accept_thread = None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.close()
        self.cut_connections()

    def __enter__(self) -> TcpProxy:
        return self.start() if not self.running else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- faults ---------------------------------------------------------------------------
    def cut_connections(self) -> int:
        """Reset every current connection (client and server side); returns how many.

        The proxy keeps listening: new connections work.
        """
        with self._lock:
            links, self._links = self._links, set()
        for link in links:
            link.close()
        return len(links)

    def set_black_hole(self, enabled: bool = True) -> None:
        """While enabled, nothing reaches anybody: new connections are accepted and read
        but never connected upstream nor answered; on existing connections the bytes of
        both directions are read and dropped. Disabling resumes forwarding on the
        connections that are still open (the dropped bytes stay lost)."""
        self._black_hole = enabled

    def hang_new_connections(self, enabled: bool = True) -> None:
        """While enabled, new connections are accepted and read but never connected
        upstream nor answered (a server whose handshake never comes); the connections
        open keep forwarding."""
        self._hang_new = enabled

    def drop_in_handshake(self, connections: int) -> None:
        """The next `connections` new connections reach the server and get its greeting,
        then both sides are reset when the client first answers: a server that drops a
        connection during the handshake (overloaded, or its `connect_timeout` passed)."""
        with self._lock:
            self._drop_in_handshake = connections

    def limit_connections(self, open_at_most: int | None, errno: int = 1040) -> None:
        """While set, a new connection beyond `open_at_most` open ones gets the MySQL error
        packet a server at its connection limit sends instead of its greeting (`errno`
        1040: `max_connections`, 1203: the user's `max_user_connections`), then EOF.
        None: no limit."""
        self._limit = None if open_at_most is None else (open_at_most, errno)

    @property
    def black_hole(self) -> bool:
        return self._black_hole

    @property
    def connections(self) -> int:
        """Connections open now."""
        with self._lock:
            return len(self._links)

    def wait_for(self, condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
        """Poll `condition` every 10 ms until it is true (True) or `timeout_s` passed
        (False)."""
        end = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    # -- plumbing -------------------------------------------------------------------------
    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                ready, _, _ = select.select([listener], [], [], _POLL_S)
            except (OSError, ValueError):
                return
            if not ready:
                continue
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self.accepted += 1
            limit = self._limit
            if limit is not None and self.connections >= limit[0]:
                payload = b"\xff" + limit[1].to_bytes(2, "little") + b"Too many connections"
                with contextlib.suppress(OSError):
                    client.sendall(len(payload).to_bytes(3, "little") + b"\x00" + payload)
                client.close()
                self.refused += 1
                continue
            upstream: socket.socket | None = None
            if not self._black_hole and not self._hang_new:
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                    upstream.settimeout(None)
                except OSError:
                    _Link(client, None).close()  # the server is down: the client sees EOF
                    continue
            link = _Link(client, upstream)
            with self._lock:
                self._links.add(link)
                if upstream is not None and self._drop_in_handshake > 0:
                    self._drop_in_handshake -= 1
                    link.drop_at_client_bytes = True
            self._spawn(link, link.client, link.upstream)
            if upstream is not None:
                self._spawn(link, upstream, link.client)

    def _spawn(self, link: _Link, src: socket.socket, dst: socket.socket | None) -> None:
        threading.Thread(target=self._pump, args=(link, src, dst), daemon=True,
                         name=f"tcp-proxy-pump-{self._port}").start()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket | None) -> None:
        try:
            while not link.closed.is_set():
                data = src.recv(_CHUNK)
                if not data:
                    break
                if dst is None or self._black_hole:
                    continue  # read and dropped
                if src is link.client and link.drop_at_client_bytes:
                    break  # reset in the handshake (the finally closes the link)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._links.discard(link)
            link.close()


def proxied_mysql_url(server: Mapping[str, Any], proxy: TcpProxy) -> str:
    """The MySQL URL of `server` (:func:`pyflink_ndb.stores.mysql.parse_mysql_url`'s dict:
    its user and database, not its password) that goes through `proxy` on loopback."""
    return f"mysql://{server['user']}@127.0.0.1:{proxy.port}/{server['database']}"
