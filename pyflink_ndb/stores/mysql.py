"""MySQL-protocol driver: RonDB's MySQL server in production, MySQL 8 or MariaDB otherwise.

Where the server has the NDB engine (`information_schema.ENGINES`), tables are created
with `ENGINE=NDBCLUSTER` and `PARTITION BY KEY (key_group)`; elsewhere with InnoDB.
Sessions run in autocommit at READ COMMITTED, the only isolation level NDB offers: every
statement is its own bounded transaction, and no read keeps a transaction (or a metadata
lock) open, so a running job never blocks DDL. Driver errors are mapped by error number
or class (PEP 249 / pymysql), never by message text; the one exception is the NDB error
code, which NDB passes only inside the text of MySQL errors 1296/1297 (see
:func:`ndb_error_code`). Every socket operation has a timeout (connect, read, write).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pymysql
import pymysql.connections

from pyflink_ndb.config import redact_url
from pyflink_ndb.errors import ConfigurationError, StoreUnavailableError, ValueTooLargeError
from pyflink_ndb.stores.base import StateStore, StoredVersion
from pyflink_ndb.stores.lineage import Ranges
from pyflink_ndb.stores.retry import (
    DEFAULT_RETRY_POLICY,
    RetriesExhaustedError,
    RetryPolicy,
    describe_error,
)

_log = logging.getLogger(__name__)

#: Client error numbers meaning "the server cannot be reached or went away".
_UNREACHABLE = {2002, 2003, 2005, 2006, 2013, 2055}
_ACCESS_DENIED = {1044, 1045, 1698}
#: Connection refused for the server's or the user's connection limit:
#: ER_CON_COUNT_ERROR, ER_TOO_MANY_USER_CONNECTIONS, ER_USER_LIMIT_REACHED.
TOO_MANY_CONNECTIONS = frozenset({1040, 1203, 1226})
_PACKET_TOO_LARGE = {1153, 1301}
#: ER_DUP_ENTRY: a unique key's value exists.
ER_DUP_ENTRY = 1062
_UNKNOWN_DATABASE = 1049
_UNKNOWN_HOST = 2005
_CR_SSL_CONNECTION_ERROR = 2026

#: Client errors (CR_*) of a connection that failed or died: 2002/2003 cannot connect
#: (2003 is also what a server restart gives), 2006 server gone away, 2013 lost during a
#: query (pymysql's read timeout too), 2055 lost (MySQL 8 client).
TRANSIENT_CLIENT_ERRORS = frozenset({2002, 2003, 2006, 2013, 2055})
#: Client errors of a connection nobody took: 2002 CR_CONNECTION_ERROR (socket),
#: 2003 CR_CONN_HOST_ERROR (TCP refused, or no answer within the connect timeout).
_NOT_LISTENING = frozenset({2002, 2003})
#: Server errors worth a retry of the whole transaction: 1053 ER_SERVER_SHUTDOWN, 1205
#: ER_LOCK_WAIT_TIMEOUT (InnoDB; NDB's 266/274 "Time-out in NDB, probably caused by
#: deadlock" reach the client as 1205 too), 1213 ER_LOCK_DEADLOCK, 1297
#: ER_GET_TEMPORARY_ERRMSG (an NDB error whose status is "temporary"), 1927 MariaDB's
#: ER_CONNECTION_KILLED, 4031 MySQL 8's ER_CLIENT_INTERACTION_TIMEOUT (disconnected idle).
TRANSIENT_SERVER_ERRORS = frozenset({1053, 1205, 1213, 1297, 1927, 4031})
#: ER_GET_ERRMSG "Got error %d '%s' from %s", ER_GET_TEMPORARY_ERRMSG "Got temporary error
#: %d '%s' from %s", ER_ERROR_DURING_COMMIT "Got error %d - '%s' during COMMIT": the `%d`
#: is the storage engine's own code (NDB's error code for NDB).
_ER_GET_ERRMSG = 1296
_ER_GET_TEMPORARY_ERRMSG = 1297
_ER_ERROR_DURING_COMMIT = 1180
#: NDB error codes of status "temporary" (classes TR temporary resource, NR node
#: recovery, OL overload, TO timeout, NS node shutdown, IT internal temporary) and
#: "unknown result" (UR: retried because the work is idempotent), from the MySQL NDB
#: Cluster API Developer Guide, "NDB Error Codes" (dev.mysql.com/doc/ndbapi/en/
#: ndb-error-codes.html; the source of truth is storage/ndb/src/ndbapi/ndberror.cpp).
#: E.g. 233 "Out of operation records in transaction coordinator", 266 "Time-out in NDB,
#: probably caused by deadlock", 274 (TO), 410 "REDO log files overloaded", 4006 "Connect
#: failure - out of connection objects", 4010 "Node failure caused abort of transaction".
#: A 1297 is transient whatever its code; the set decides 1296, 1180 and warnings.
NDB_TRANSIENT_CODES = frozenset({
    233, 266, 274, 410, 4006, 4010,                        # named in the requirement
    1217, 1218, 1220, 1222, 1234,                          # TR
    250, 286, 1204, 4002, 4007, 4013, 4025, 4027, 4028,    # NR
    677, 711, 891, 1221, 1518,                             # OL
    270, 280, 1223, 4023, 4030, 4034,                      # NS
    1703, 1705,                                            # IT
    4008, 4012,                                            # UR
})
#: The NDB code at the start of a 1296/1297/1180 message, nothing else of the text: the
#: server prints "Got [temporary ]error N ..." (N may be negative for some engines).
#: Localized messages (lc_messages) do not match; then 1297 is still transient by its
#: number and 1296/1180 are not.
_ENGINE_CODE_RE = re.compile(r"^Got (?:temporary )?error (-?\d{1,6})\b")


def ndb_error_code(number: int, message: str) -> int | None:
    """The storage engine's error code inside a MySQL error 1296, 1297 or 1180, or None.

    NDB passes its own error code to a MySQL client only inside the message of these
    errors (MySQL error 1297 ER_GET_TEMPORARY_ERRMSG "Got temporary error %d '%s' from %s",
    1296 ER_GET_ERRMSG, 1180 ER_ERROR_DURING_COMMIT) and of the warning of the same number
    that ha_ndbcluster pushes with every NDB error (SHOW WARNINGS); there is no
    separate field for it in the protocol. Only the leading number is read.

    :param number: the MySQL error number (pymysql `err.args[0]`, or a warning's Code).
    :param message: its message (pymysql `err.args[1]`, or the warning's Message).
    """
    if number not in (_ER_GET_ERRMSG, _ER_GET_TEMPORARY_ERRMSG, _ER_ERROR_DURING_COMMIT):
        return None
    match = _ENGINE_CODE_RE.match(message)
    return int(match.group(1)) if match else None


def is_transient_warning(number: int, message: str) -> bool:
    """True when a SHOW WARNINGS row (Code, Message) reports a temporary NDB error.

    With NDB the statement's error can be a generic one (1205 for NDB 266, 1296, 1180);
    ha_ndbcluster also pushes a warning 1297 (temporary) or 1296 carrying the NDB code.

    :param number: the warning's Code.
    :param message: the warning's Message.
    """
    if number == _ER_GET_TEMPORARY_ERRMSG:
        return True
    code = ndb_error_code(number, message)
    return code is not None and code in NDB_TRANSIENT_CODES


def is_transient_error(err: BaseException) -> bool:
    """True when `err` is worth re-running the whole (idempotent) transaction on a fresh
    connection: the connection was lost or refused, a lock wait timed out, a deadlock,
    or a temporary NDB error.

    By error number (pymysql `err.args[0]`): :data:`TRANSIENT_CLIENT_ERRORS`,
    :data:`TRANSIENT_SERVER_ERRORS`; 1296 and 1180 when the NDB code in the message (see
    :func:`ndb_error_code`) is in :data:`NDB_TRANSIENT_CODES`. By class: pymysql
    `InterfaceError` (the connection is closed), :class:`TimeoutError` (socket timeout)
    and :class:`ConnectionError`. A :class:`StoreUnavailableError` is transient when its
    `__cause__` is (this package wraps lost connections in it), except
    :class:`~pyflink_ndb.stores.retry.RetriesExhaustedError`: spent retries are final.
    A 2003 caused by a failed name lookup (a wrong host) or by a server certificate that
    TLS verification refused is not transient.

    :param err: any exception.
    """
    if isinstance(err, RetriesExhaustedError):
        return False
    if isinstance(err, StoreUnavailableError):
        return err.__cause__ is not None and is_transient_error(err.__cause__)
    if isinstance(err, pymysql.err.InterfaceError):
        return True
    if isinstance(err, pymysql.err.MySQLError):
        number = err.args[0] if err.args else None
        if not isinstance(number, int):
            return False
        if number in TRANSIENT_CLIENT_ERRORS:  # not a wrong host, not a refused certificate
            return not isinstance(err.__context__, socket.gaierror | ssl.SSLCertVerificationError)
        if number in TRANSIENT_SERVER_ERRORS:
            return True
        message = err.args[1] if len(err.args) > 1 and isinstance(err.args[1], str) else ""
        code = ndb_error_code(number, message)
        return code is not None and code in NDB_TRANSIENT_CODES
    return isinstance(err, TimeoutError | ConnectionError)


def is_lost_while_connecting(err: BaseException) -> bool:
    """True when a first connection failed after the server accepted it: lost or reset
    during the handshake or the session set-up (2006, 2013, 2055, a reset socket), which
    an overloaded server or its `connect_timeout` causes; worth another connect
    (:meth:`StateStore._open_connection <pyflink_ndb.stores.base.StateStore._open_connection>`).
    False for 2002/2003 (nothing listens, or no answer within the connect timeout), an
    unknown host, a refused certificate or login, and every server error but the
    transient ones of :func:`is_transient_error`.

    :param err: what connecting raised (this package's :class:`StoreUnavailableError`
        is judged by its `__cause__`).
    """
    cause = err.__cause__ if isinstance(err, StoreUnavailableError) else err
    if isinstance(cause, pymysql.err.OperationalError) and cause.args and \
            cause.args[0] in _NOT_LISTENING:
        return False
    return is_transient_error(err)


#: TLS modes of `?ssl_mode=` (the values of the MySQL client's `--ssl-mode`).
TLS_MODES = ("disabled", "preferred", "required", "verify_ca", "verify_identity")
#: Query parameters a mysql:// URL may carry (all about TLS).
URL_PARAMETERS = ("ssl_mode", "ssl_ca", "ssl_cert", "ssl_key")


def parse_mysql_url(url: str) -> dict[str, Any]:
    """Split `mysql://user[:password]@host[:port]/database[?ssl_mode=M&ssl_ca=PATH&...]`
    into pymysql arguments plus the TLS settings.

    The query parameters are TLS settings, named as the MySQL client names them:

    * `ssl_mode`: one of :data:`TLS_MODES`. `disabled`: plain TCP; `preferred` (the default
      without any `ssl_*` parameter): pymysql's default (PyMySQL 1.2.4 tries TLS without
      verifying the server and falls back to plain TCP); `required`: TLS or fail, the
      server's certificate is not verified; `verify_ca` (the default when `ssl_ca` is
      given): the certificate must be signed by `ssl_ca` (else by the system's CAs);
      `verify_identity`: also the host name of the URL must match the certificate.
    * `ssl_ca`: PEM file of the CA that signed the server's certificate.
    * `ssl_cert`, `ssl_key`: PEM files of a client certificate and its unencrypted private
      key (both or neither); without `ssl_mode` they imply `required`.

    Paths are read when a connection is made, on the machine that makes it (each
    TaskManager, and the client when it checks the store).

    :param url: the `state.backend.ndb.url` value.
    :returns: `host`, `port` (default 3306), `user` (default `root`), `password` (None: no
        password in the URL), `database`, and `tls`: a dict with `mode` and, when given,
        `ca`, `cert`, `key` (empty: no `ssl_*` parameter, pymysql's default).
    :raises ConfigurationError: the URL is not of that form, a query parameter is unknown,
        repeated or empty, `ssl_mode` is not one of :data:`TLS_MODES`, only one of
        `ssl_cert` and `ssl_key` is given, or files are given with `ssl_mode=disabled` or
        `preferred`. The message never shows the password.
    """
    parsed = urlparse(url)
    shown = redact_url(url)
    if parsed.scheme != "mysql" or not parsed.hostname or not parsed.path.strip("/"):
        raise ConfigurationError(
            f"state.backend.ndb.url={shown!r} is not of the form "
            "mysql://user@host:port/database[?ssl_mode=...&ssl_ca=...].")
    try:
        port = parsed.port or 3306
    except ValueError as err:
        raise ConfigurationError(
            f"state.backend.ndb.url={shown!r} has an invalid port ({err}).") from err
    return {
        "host": parsed.hostname,
        "port": port,
        "user": unquote(parsed.username) if parsed.username else "root",
        "password": unquote(parsed.password) if parsed.password else None,
        "database": parsed.path.strip("/"),
        "tls": _parse_tls(parsed.query, shown),
    }


def _parse_tls(query: str, shown: str) -> dict[str, str]:
    """The TLS settings of a URL's query (see :func:`parse_mysql_url`)."""
    if not query:
        return {}
    try:
        values = parse_qs(query, keep_blank_values=True, strict_parsing=True)
    except ValueError as err:
        raise ConfigurationError(
            f"state.backend.ndb.url={shown!r} has a malformed query ({err}).") from err
    unknown = sorted(set(values) - set(URL_PARAMETERS))
    if unknown:
        raise ConfigurationError(
            f"state.backend.ndb.url={shown!r} has unknown parameters {', '.join(unknown)}; "
            f"known: {', '.join(URL_PARAMETERS)}.")
    for name, given in values.items():
        if len(given) != 1 or not given[0].strip():
            raise ConfigurationError(
                f"state.backend.ndb.url={shown!r}: give {name} once, with a value.")
    tls = {name[len("ssl_"):]: given[0] for name, given in values.items()}
    if ("cert" in tls) != ("key" in tls):
        raise ConfigurationError(
            f"state.backend.ndb.url={shown!r}: ssl_cert and ssl_key go together (a client "
            "certificate and its private key).")
    files = sorted(f"ssl_{k}" for k in ("ca", "cert", "key") if k in tls)
    default = "verify_ca" if "ca" in tls else ("required" if files else "preferred")
    mode = tls.setdefault("mode", default).lower()
    tls["mode"] = mode
    if mode not in TLS_MODES:
        raise ConfigurationError(
            f"state.backend.ndb.url={shown!r}: ssl_mode={mode!r} is not one of "
            f"{', '.join(TLS_MODES)}.")
    if files and mode in ("disabled", "preferred"):
        raise ConfigurationError(
            f"state.backend.ndb.url={shown!r}: {', '.join(files)} need ssl_mode=required, "
            f"verify_ca or verify_identity (got {mode}).")
    return tls


def tls_connect_args(tls: dict[str, str]) -> dict[str, Any]:
    """pymysql.connect arguments for the TLS settings of :func:`parse_mysql_url`.

    :param tls: the `tls` entry of :func:`parse_mysql_url` (empty: pymysql's default).
    :returns: `{}` (pymysql's default), `{"ssl_disabled": True}`, or `{"ssl": context}`
        with an :class:`ssl.SSLContext` whose verification follows the mode (see
        :func:`parse_mysql_url`). The context is made once per process for the same
        settings and files (a file whose modification time changes gives a new one):
        loading certificates costs tens of milliseconds, and every connection (two per
        subtask that opens, and each reconnection) asks for it.
    :raises ConfigurationError: a CA, certificate or key file cannot be read or is not PEM
        (the message names the parameter and the path).
    """
    mode = tls.get("mode", "preferred")
    if mode == "preferred":
        return {}
    if mode == "disabled":
        return {"ssl_disabled": True}
    files = (tls.get("ca"), tls.get("cert"), tls.get("key"))
    return {"ssl": _tls_context(mode, *files, stamp=tuple(map(_modified_ns, files)))}


def _modified_ns(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None  # the context's load names the file and the error


@functools.lru_cache(maxsize=16)
def _tls_context(mode: str, ca: str | None, cert: str | None, key: str | None, *,
                 stamp: tuple[int | None, ...]) -> ssl.SSLContext:
    """The context of :func:`tls_connect_args` (`stamp`: the files' modification times,
    part of the cache key only). A refused file raises and is not remembered."""
    name = "ssl_ca"
    try:
        context = ssl.create_default_context(cafile=ca)
        # Python 3.13 turns on strict X.509 checks, which the certificates that MySQL and
        # RonDB servers generate for themselves fail (pymysql clears the flag too).
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
        context.check_hostname = mode == "verify_identity"
        context.verify_mode = ssl.CERT_NONE if mode == "required" else ssl.CERT_REQUIRED
        if cert is not None:
            name = "ssl_cert/ssl_key"
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:  # FileNotFoundError, PermissionError, bad PEM
        paths = ca if name == "ssl_ca" else f"{cert}, {key}"
        raise ConfigurationError(
            f"Cannot use the TLS file(s) of {name} in state.backend.ndb.url ({paths}): {err}. "
            "Give PEM files readable on every TaskManager (and on the client).") from err
    return context


_preferred_context: ssl.SSLContext | None = None
_preferred_context_lock = threading.Lock()


class _Connection(pymysql.connections.Connection):  # type: ignore[misc]
    """pymysql's connection, whose default ("preferred") TLS context is made once per
    process instead of once per connection.

    pymysql 1.2 tries TLS on every connection without TLS settings and builds for it an
    `ssl.create_default_context()`, which loads the system's CA certificates: 26 ms of CPU
    here, 40-90 ms on a loaded TaskManager, twice per subtask that opens (its store and
    the background writer's), on the way from a failure to the next attempt's first
    record, and for nothing, since that context verifies no certificate. An
    :class:`ssl.SSLContext` is safe to share between connections and threads.
    """

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if sslp:  # a context or TLS settings of the caller's: pymysql's own handling
            return super()._create_ssl_ctx(sslp)  # type: ignore[no-any-return]
        global _preferred_context
        with _preferred_context_lock:
            if _preferred_context is None:
                _preferred_context = super()._create_ssl_ctx(sslp)
            return _preferred_context


def connect_driver(**kwargs: Any) -> Any:
    """A pymysql connection (`pymysql.connect`'s arguments), with the TLS context of
    pymysql's default mode shared (:class:`_Connection`)."""
    return _Connection(**kwargs)


#: Seconds :meth:`MysqlStateStore.interrupt`'s `KILL CONNECTION` may take to connect (and to
#: wait for each answer).
KILL_CONNECT_TIMEOUT_S = 5

#: Characters per rendered multi-row statement: pymysql's own executemany limit
#: (`Cursor.max_stmt_length`), far below `max_allowed_packet` (16 MB on MariaDB 10.11,
#: 64 MB on MySQL 8 / RonDB).
MAX_STATEMENT_CHARS = 1_024_000


def text_literal(text: str) -> str:
    """`text` as a character-string literal: its UTF-8 bytes in hex with the `_utf8mb4`
    introducer, e.g. `_utf8mb4 X'7b7d'` for `{}` (MySQL, MariaDB, RonDB: "Character Set
    Introducers"). Independent of `sql_mode` (`NO_BACKSLASH_ESCAPES`) and of the
    connection's character set, and 15 times cheaper than quoting through pymysql's
    `escape_string` (0.8 against 12 us for a 311-character JSON text here): hex is
    built in C, escaping translates every character.

    :raises UnicodeEncodeError: `text` is not valid Unicode (a lone surrogate); the JSON
        renderers never give such text (:func:`~pyflink_ndb.serialization.values.value_json`).
    """
    return "_utf8mb4 X'" + text.encode("utf-8").hex() + "'"


def render_state_row(row: tuple[Any, ...]) -> str:
    """One row of the state table as SQL literals, `(kg, state_id, X'ukey', ...)`.

    The background writer renders every row of an epoch; pymysql's executemany escapes
    each parameter through a type dispatch and costs about twice as much Python time
    (it shares the task threads' GIL: docs/protocol.md, "Asynchronous flush"). The
    column types are fixed, so each is rendered directly: integers with `:d` (a float or
    a string raises `ValueError`/`TypeError` instead of being written), bytes as hex
    literals (as pymysql 1.1+ renders them), text (the JSON columns) as
    :func:`text_literal`, None as NULL.

    :param row: the 12 columns of `StateStore._row_params`.
    """
    kg, state_id, ukey, version, chunk, tombstone, chunks, expires, fmt, vbytes, vjson, \
        kjson = row
    expires_sql = "NULL" if expires is None else format(expires, "d")
    vbytes_sql = "NULL" if vbytes is None else "X'" + bytes(vbytes).hex() + "'"
    vjson_sql = "NULL" if vjson is None else text_literal(vjson)
    kjson_sql = "NULL" if kjson is None else text_literal(kjson)
    return (f"({kg:d},{state_id:d},X'{bytes(ukey).hex()}',{version:d},{chunk:d},"
            f"{tombstone:d},{chunks:d},{expires_sql},{fmt:d},{vbytes_sql},{vjson_sql},"
            f"{kjson_sql})")


def derived_table(names: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """`SELECT v AS name, ... UNION ALL SELECT v, ...`: a derived table of literal rows
    (each value already rendered as SQL), the first row naming the columns (MySQL 8,
    MariaDB and NDB accept it; a column list after the alias is MySQL 8.0.19+ only)."""
    first = ", ".join(f"{v} AS {name}" for v, name in zip(rows[0], names, strict=True))
    return " UNION ALL ".join([f"SELECT {first}", *("SELECT " + ", ".join(r)
                                                    for r in rows[1:])])


def _entry_literals(key_group: int, state_id: int, ukey: bytes) -> list[str]:
    """An entry's primary-key prefix as literals: integers with `:d`, the key as hex (as
    :func:`render_state_row` does; no parameters to escape)."""
    return [format(key_group, "d"), format(state_id, "d"), f"X'{bytes(ukey).hex()}'"]


#: Version ranges per key group beyond which a bundle read goes as the base class's UNION
#: ALL instead of :func:`keys_join_query` (each range is two columns of the derived table;
#: MySQL 8 allows 4,096 columns, and a lineage gains a range per restore).
MAX_JOIN_RANGES = 64

#: How the state table `s` joins the derived table `k` of entries (`kg`, `sid`, `uk`):
#: by its primary key's prefix, read with `ref` from the derived table's rows.
_ON_ENTRY = "s.key_group = k.kg AND s.state_id = k.sid AND s.ukey = k.uk"


def keys_join_query(t_state: str, entries: Sequence[tuple[int, int, bytes]],
                    ranges_of: Callable[[int], Ranges]) -> str:
    """Every visible chunk-0 version of `entries` ((state id, key group, ukey) triples)
    in one statement: a derived table of the entries (`i`: the position in `entries`,
    the key, and the version ranges its key group sees as `lo<j>, hi<j>` columns, padded
    with the empty range 1..0) joined to the state table by its primary key
    (`STRAIGHT_JOIN`: the derived table first, one `ref` lookup per entry).

    Rows: `i, version, tombstone, chunks, expires_at_ms, vbytes`, any order, one per
    visible version (an entry without one has no row). Values are literals
    (:func:`_entry_literals`): no parameters.
    """
    ranges = [ranges_of(key_group) for _, key_group, _ in entries]
    width = max(1, max(len(r) for r in ranges))
    names = ["i", "kg", "sid", "uk"] + [f"{b}{j}" for j in range(width) for b in ("lo", "hi")]
    rows = []
    for i, ((state_id, key_group, ukey), seen) in enumerate(zip(entries, ranges,
                                                                  strict=True)):
        bounds = [b for lo_hi in seen for b in lo_hi] + [1, 0] * (width - len(seen))
        rows.append([format(i, "d"), *_entry_literals(key_group, state_id, ukey),
                     *(format(b, "d") for b in bounds)])
    visible_sql = " OR ".join(f"s.version BETWEEN k.lo{j} AND k.hi{j}" for j in range(width))
    return (f"SELECT k.i, s.version, s.tombstone, s.chunks, s.expires_at_ms, s.vbytes "
            f"FROM ({derived_table(names, rows)}) k STRAIGHT_JOIN {t_state} s "
            f"ON {_ON_ENTRY} AND s.chunk = 0 AND ({visible_sql})")


def versions_join_query(t_state: str, refs: Sequence[tuple[int, int, bytes]]) -> str:
    """Every stored chunk-0 version of `refs` ((key group, state id, ukey) triples) with
    its tombstone flag, ascending by version: `key_group, state_id, ukey, version,
    tombstone` (the join of :func:`keys_join_query`, without ranges)."""
    rows = [_entry_literals(kg, sid, ukey) for kg, sid, ukey in refs]
    return (f"SELECT s.key_group, s.state_id, s.ukey, s.version, s.tombstone FROM "
            f"({derived_table(('kg', 'sid', 'uk'), rows)}) k STRAIGHT_JOIN {t_state} s "
            f"ON {_ON_ENTRY} AND s.chunk = 0 ORDER BY s.version")


def delete_versions_join(t_state: str, part: Sequence[Any]) -> str:
    """A multi-table DELETE of every row (chunk) of the versions `part` names (each with
    `key_group`, `state_id`, `ukey`, `version`), joined from a derived table of them by
    the primary key's first four columns."""
    rows = [[*_entry_literals(d.key_group, d.state_id, d.ukey), format(d.version, "d")]
            for d in part]
    return (f"DELETE s FROM ({derived_table(('kg', 'sid', 'uk', 'v'), rows)}) k "
            f"STRAIGHT_JOIN {t_state} s ON {_ON_ENTRY} AND s.version = k.v")


def delete_rows_join(t_state: str, keys: Sequence[tuple[Any, ...]]) -> str:
    """A multi-table DELETE of the rows whose whole primary key (key_group, state_id,
    ukey, version, chunk) `keys` name, joined from a derived table of them."""
    rows = [[*_entry_literals(kg, sid, ukey), format(version, "d"), format(chunk, "d")]
            for kg, sid, ukey, version, chunk in keys]
    return (f"DELETE s FROM ({derived_table(('kg', 'sid', 'uk', 'v', 'c'), rows)}) k "
            f"STRAIGHT_JOIN {t_state} s ON {_ON_ENTRY} AND s.version = k.v AND "
            "s.chunk = k.c")


def render_statements(prefix: str, rows: Any,
                      max_chars: int = MAX_STATEMENT_CHARS) -> list[Any]:
    """`prefix` + rendered rows, split into statements of at most `max_chars` characters
    (a single longer row gets a statement of its own). `rows`: column tuples
    (:func:`render_state_row`; the statements are str), or rows the render process
    rendered (ASCII bytes; the statements are bytes, which pymysql sends unchanged)."""
    statements: list[Any] = []
    current: list[Any] = []
    rendered = None
    size = len(prefix)
    for row in rows:
        if rendered is None:
            rendered = type(row) is bytes
        text = row if rendered else render_state_row(row)
        if current and size + len(text) + 1 > max_chars:
            statements.append(_statement(prefix, current, rendered))
            current, size = [], len(prefix)
        current.append(text)
        size += len(text) + 1
    if current:
        statements.append(_statement(prefix, current, bool(rendered)))
    return statements


def _statement(prefix: str, rows: list[Any], rendered: bool) -> Any:
    if rendered:
        return prefix.encode("ascii") + b",".join(rows)
    return prefix + ",".join(rows)


class MysqlStateStore(StateStore):
    """Tier 3 on a MySQL-protocol server (RonDB/NDB, MySQL, MariaDB)."""

    placeholder = "%s"
    renders_literals = True

    def __init__(self, url: str, namespace: str, write_batch_rows: int = 500,
                 user: str | None = None, password: str | None = None,
                 connect_timeout_s: int = 10, read_timeout_s: float = 30.0,
                 write_timeout_s: float = 30.0, retry: RetryPolicy = DEFAULT_RETRY_POLICY) -> None:
        """A store on the server of `url`, not yet connected.

        :param url: `mysql://user[:password]@host[:port]/database`, optionally with TLS
            parameters `?ssl_mode=...&ssl_ca=...` (see :func:`parse_mysql_url`).
        :param namespace: the table prefix.
        :param write_batch_rows: rows per write batch. Default 500.
        :param user: overrides the URL's user (None: keep it).
        :param password: overrides the URL's password (None: keep it).
        :param connect_timeout_s: seconds for the TCP connect. Default 10.
        :param read_timeout_s: seconds a socket read may wait (also the server's handshake;
            pymysql's default is none: a black-holed connection would block forever),
            > 0. Default 30.
        :param write_timeout_s: seconds a socket write may wait, > 0. Default 30.
        :param retry: the retry policy of the store's units of work (default
            `RetryPolicy()`: 10 attempts, 50 ms to 5 s backoff, 90 s deadline), kept as
            :attr:`retry_policy` (applied by the caller with
            :func:`~pyflink_ndb.stores.retry.run_with_retries`).
        :raises ConfigurationError: the URL is not a valid mysql:// URL (see
            :func:`parse_mysql_url`), or a timeout is <= 0.
        """
        super().__init__(namespace, write_batch_rows)
        self._args = parse_mysql_url(url)
        if user:
            self._args["user"] = user
        if password is not None:
            self._args["password"] = password
        for name, value in (("connect_timeout_s", connect_timeout_s),
                            ("read_timeout_s", read_timeout_s),
                            ("write_timeout_s", write_timeout_s)):
            if not value > 0:
                raise ConfigurationError(f"MysqlStateStore: {name} must be > 0 (got {value}).")
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._write_timeout_s = write_timeout_s
        self.retry_policy = retry
        self.engine = "InnoDB"

    def _versions_clause(self, part: Any) -> tuple[str, list[Any]]:
        """The same OR-ed primary keys as the base class, rendered as literals (integers
        with `:d`, keys as hex): the garbage collector names every version it deletes,
        and pymysql's per-parameter escaping would cost the writer thread's GIL time."""
        return " OR ".join(
            f"(key_group = {d.key_group:d} AND state_id = {d.state_id:d} AND "
            f"ukey = X'{bytes(d.ukey).hex()}' AND version = {d.version:d})"
            for d in part), []

    def _delete_versions(self, part: Sequence[Any], limit: int) -> int:
        """On InnoDB a multi-table DELETE joined from a derived table of the versions
        (:func:`delete_versions_join`): the OR-ed primary keys cost a range analysis with
        index dives (13–20 ms per 100 versions on this machine's MariaDB; the join 3–6 ms:
        server CPU that every checkpoint's garbage collection takes from the records). A
        multi-table DELETE has no LIMIT: the rows are those of `part`'s versions (one per
        chunk). NDB keeps the base class's bounded `DELETE ... LIMIT` (its transactions
        must stay small)."""
        if self.is_ndb:
            return super()._delete_versions(part, limit)
        return max(self._execute(delete_versions_join(self.t_state, part)).rowcount, 0)

    def _delete_rows(self, rows: Sequence[tuple[Any, ...]]) -> int:
        """On InnoDB the cleanup's delete by whole primary keys as a join
        (:func:`delete_rows_join`, for the reason of :meth:`_delete_versions`); NDB keeps
        the OR-ed primary keys."""
        if self.is_ndb:
            return super()._delete_rows(rows)
        return max(self._execute(delete_rows_join(self.t_state, rows)).rowcount, 0)

    def _versions_query(self, part: Sequence[tuple[int, int, bytes]]
                        ) -> tuple[str, list[Any]]:
        """On InnoDB one join (:func:`versions_join_query`, each entry once; OR-ed key
        prefixes cost 7 ms per 100 entries in range analysis here, the join 2 ms), on NDB
        the base class's OR-ed prefixes."""
        if self.is_ndb:
            return super()._versions_query(part)
        return versions_join_query(self.t_state, list(dict.fromkeys(part))), []

    def _replace_state_rows(self, replace_into: str, rows: Any) -> None:
        """The rows rendered as literals (:func:`render_state_row`), in statements of at
        most :data:`MAX_STATEMENT_CHARS`, in the caller's transaction."""
        cur = self._conn.cursor()
        for statement in render_statements(replace_into, rows):
            cur.execute(statement)

    def _latest_arm(self, where: str) -> str:
        """A parenthesised UNION member (MySQL, MariaDB and NDB accept ORDER BY and LIMIT
        there), planned as one primary-key lookup without a temporary table."""
        return f"({self._latest_select(where)})"

    def read_latest_batch(self, entries: Sequence[tuple[int, int, bytes]],
                          ranges_of: Callable[[int], Ranges]
                          ) -> dict[tuple[int, bytes], StoredVersion]:
        """:meth:`StateStore.read_latest_batch`; on InnoDB one join per
        :attr:`max_or_terms` entries (:func:`keys_join_query`), on NDB the base class's
        UNION ALL of primary-key reads.

        Why a join: the UNION ALL's arms, and a row-constructor `IN` list alike, each cost
        InnoDB a range analysis with index dives (MariaDB 10.11's profile: 17 ms of
        "Statistics" for 100 keys); a join from a derived table of the keys reads each by
        `ref` on the primary key, planned once from the index statistics. Measured on this
        machine's MariaDB (100,000 keys, random bundles of 100): 12–17 ms per bundle as a
        UNION ALL, 3.7–5.2 ms as the join (bench part 6 reads the same bundles both
        ways). The join returns every visible version of an entry; the newest is kept
        here. NDB keeps the UNION ALL, whose plan its data nodes are known to run (not
        measured here: no NDB cluster on this machine)."""
        if self.is_ndb:
            return super().read_latest_batch(entries, ranges_of)
        out: dict[tuple[int, bytes], StoredVersion] = {}
        for start in range(0, len(entries), self.max_or_terms):
            part = entries[start:start + self.max_or_terms]
            if max(len(ranges_of(kg)) for _, kg, _ in part) > MAX_JOIN_RANGES:
                out.update(super().read_latest_batch(part, ranges_of))
                continue
            sql = keys_join_query(self.t_state, part, ranges_of)

            def unit(sql: str = sql, part: Sequence[tuple[int, int, bytes]] = part
                     ) -> dict[tuple[int, bytes], StoredVersion]:
                newest: dict[int, tuple[Any, ...]] = {}
                for row in self._query(sql):
                    held = newest.get(row[0])
                    if held is None or row[1] > held[1]:
                        newest[row[0]] = row
                found: dict[tuple[int, bytes], StoredVersion] = {}
                for i, version, tomb, chunks, expires, vbytes in newest.values():
                    state_id, key_group, ukey = part[i]
                    found[(state_id, ukey)] = self._stored_version(
                        key_group, state_id, ukey, version, tomb, chunks, expires, vbytes)
                return found
            out.update(self._retry("read", unit))
        return out

    @property
    def is_ndb(self) -> bool:
        """True when the tables are NDB's (`engine` detected at open): NDB keeps the
        OR-ed and UNION ALL statements and bounded deletes; InnoDB gets the joins."""
        return self.engine == "NDBCLUSTER"

    @property
    def address(self) -> str:
        """`host:port` of the server (for messages and `run_with_retries(where=...)`)."""
        return f"{self._args['host']}:{self._args['port']}"

    def interrupt(self) -> None:
        """See :meth:`StateStore.interrupt`: shuts the connection's socket down in both
        directions, which wakes the thread blocked in its read of the server's answer
        (pymysql raises "Lost connection", error 2013). A plain close of the socket would
        not wake it: the driver's file object keeps the descriptor open.

        The server notices a closed connection only when its statement ends, and keeps
        the statement's locks until then (a fenced write holds the owner row's shared
        lock, which the next attempt's claim waits for): so a thread of its own then
        sends `KILL CONNECTION` for the connection's server thread on a new connection
        (:data:`KILL_CONNECT_TIMEOUT_S` to connect; failures are logged at DEBUG, the close
        never waits for it)."""
        conn = self._conn
        server_thread = self.server_thread()
        super().interrupt()
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if server_thread:
            self.kill_connection(server_thread)

    def server_thread(self) -> int | None:
        """See :meth:`StateStore.server_thread` (pymysql's `thread_id()`)."""
        conn = self._conn
        thread = conn.thread_id() if conn is not None else None
        return int(thread) if thread else None

    def kill_connection(self, server_thread: int) -> None:
        """`KILL CONNECTION` of `server_thread` from a daemon thread on a short-lived
        connection of its own (:data:`KILL_CONNECT_TIMEOUT_S` to connect; failures are
        logged at DEBUG, the statement then ends on its own); returns at once.

        A connection, not only its statement (`KILL QUERY`): a statement the client sent
        just before it was stopped can reach the server after the kill, and a `KILL QUERY`
        of a connection between two statements is cleared when its next statement starts,
        which then runs with its locks (found by a breaker with a proxy that held the
        write process's packets for 300 ms: the next attempt's claim waited for that
        statement). Every connection this kills is abandoned anyway: the closed store's,
        the stopped write process's."""
        threading.Thread(target=self._kill_connection, args=(int(server_thread),),
                         name=f"pyflink-ndb-kill-{server_thread}", daemon=True).start()

    def _kill_connection(self, server_thread: int) -> None:
        """`KILL CONNECTION` of `server_thread` on a short-lived connection of its own."""
        try:
            conn = connect_driver(**self._driver_args(
                KILL_CONNECT_TIMEOUT_S, KILL_CONNECT_TIMEOUT_S, KILL_CONNECT_TIMEOUT_S))
            try:
                with conn.cursor() as cur:
                    cur.execute("KILL CONNECTION %s", (server_thread,))
            finally:
                conn.close()
        except Exception as err:  # the statement then ends on its own
            _log.debug("KILL CONNECTION %d at %s failed: %s", server_thread, self.address,
                       describe_error(err))

    def _is_transient(self, err: BaseException) -> bool:
        """See :func:`is_transient_error`."""
        return is_transient_error(err)

    def _is_duplicate_key(self, err: BaseException) -> bool:
        """MySQL error 1062 (ER_DUP_ENTRY; NDB's 630 "tuple already existed" reaches the
        client as it)."""
        return isinstance(err, pymysql.err.MySQLError) and bool(err.args) \
            and err.args[0] == ER_DUP_ENTRY

    def _is_lost_while_connecting(self, err: BaseException) -> bool:
        """See :func:`is_lost_while_connecting`."""
        return is_lost_while_connecting(err)

    def describe(self) -> str:
        a = self._args
        mode = a["tls"].get("mode")
        tls = f", TLS {mode}" if mode and mode != "preferred" else ""
        return (f"mysql://{a['user']}@{a['host']}:{a['port']}/{a['database']} "
                f"({self.engine}{tls})")

    def _driver_args(self, connect_timeout: float, read_timeout: float,
                     write_timeout: float) -> dict[str, Any]:
        """:func:`connect_driver`'s arguments for this store's server, user, database and
        TLS (autocommit, utf8mb4, binary prefix), with these timeouts (seconds)."""
        a = self._args
        return dict(host=a["host"], port=a["port"], user=a["user"],
                    password=a["password"] or "", database=a["database"], charset="utf8mb4",
                    autocommit=True, binary_prefix=True, connect_timeout=connect_timeout,
                    read_timeout=read_timeout, write_timeout=write_timeout,
                    **tls_connect_args(a["tls"]))

    def _connect(self) -> Any:
        """A new connection with the session settings applied (autocommit, READ COMMITTED)
        and :attr:`engine` detected; called again for every reconnection.

        :raises StoreUnavailableError: cannot connect (raised from the driver's error, so
            :func:`is_transient_error` tells a refused connection from a wrong password).
        """
        a = self._args
        args = self._driver_args(self._connect_timeout_s, self._read_timeout_s,
                                 self._write_timeout_s)
        try:
            conn = connect_driver(**args)
        except pymysql.err.OperationalError as err:
            code = err.args[0] if err.args else None
            where = f"{a['host']}:{a['port']}"
            if code == _CR_SSL_CONNECTION_ERROR or (
                    args.get("ssl") and isinstance(err.__context__, ssl.SSLError)):
                reason = err.__context__ if isinstance(err.__context__, ssl.SSLError) else (
                    err.args[1] if len(err.args) > 1 else err)
                raise StoreUnavailableError(
                    f"TLS with the database at {where} failed (error {code}: {reason}; "
                    f"ssl_mode={a['tls']['mode']}). Check that the server has TLS on, and "
                    "ssl_mode, ssl_ca, ssl_cert and ssl_key in state.backend.ndb.url.") from err
            if code == _UNKNOWN_DATABASE:
                raise StoreUnavailableError(
                    f"The server at {where} has no database {a['database']!r} (error {code}). "
                    "Create it (CREATE DATABASE) or fix the database in "
                    "state.backend.ndb.url.") from err
            if code == _UNKNOWN_HOST or isinstance(err.__context__, socket.gaierror):
                raise StoreUnavailableError(
                    f"Cannot resolve the database host {a['host']!r} (error {code}). Fix the "
                    "host in state.backend.ndb.url.") from err
            if code in _ACCESS_DENIED:
                raise StoreUnavailableError(
                    f"The database at {where} refused user {a['user']!r} (error {code}). Fix "
                    "the user (in state.backend.ndb.url, `mysql://USER@host:port/db`, or "
                    "state.backend.ndb.user) and the password (state.backend.ndb.password, "
                    "password-file or password-env).") from err
            if code in TOO_MANY_CONNECTIONS:
                raise StoreUnavailableError(
                    f"The database at {where} refused a new connection: too many "
                    f"connections (error {code}). Raise the server's max_connections (or "
                    f"the user's limit), or open fewer: each subtask opens two, plus "
                    "state.backend.ndb.write.process-connections (default 2) with "
                    "state.backend.ndb.write.process on (its default with 2 CPUs or "
                    "more; set it to false, or the connections to 1).") from err
            raise StoreUnavailableError(
                f"Cannot reach the database at {where} (error {code}). Start the MySQL "
                "server there or fix state.backend.ndb.url.") from err
        try:
            with conn.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                cur.execute("SELECT SUPPORT FROM information_schema.ENGINES "
                            "WHERE ENGINE = 'ndbcluster'")
                row = cur.fetchone()
            conn.commit()
        except Exception as err:
            with contextlib.suppress(Exception):  # pymysql may have closed it already
                conn.close()
            mapped = self._translate_error(err)
            if mapped is not None:
                raise mapped from err
            raise
        self.engine = "NDBCLUSTER" if row and row[0] in ("YES", "DEFAULT") else "InnoDB"
        return conn

    def _insert_ignore(self) -> str:
        return "INSERT IGNORE"

    def _table_exists(self, table: str) -> bool:
        rows = self._read("inspect tables", "SELECT COUNT(*) FROM information_schema.TABLES "
                          "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", (table,))
        return bool(rows and int(rows[0][0]))

    def _ddl(self) -> list[str]:
        return mysql_ddl(self, ndb=self.is_ndb)

    def _point_index(self) -> str:
        return " FORCE INDEX (PRIMARY)"

    def _cleanup_index(self) -> str:
        return " FORCE INDEX (ix_cleanup)"

    def _translate_error(self, err: Exception) -> Exception | None:
        if not isinstance(err, pymysql.err.MySQLError):
            return None
        code = err.args[0] if err.args else None
        a = self._args
        if code in _UNREACHABLE or isinstance(err, pymysql.err.InterfaceError):
            return StoreUnavailableError(
                f"Lost the database at {a['host']}:{a['port']} (error {code}).")
        if code in _PACKET_TOO_LARGE:
            return ValueTooLargeError(
                f"The server rejected a statement as too large (error {code}); raise the "
                "server's max_allowed_packet or lower state.backend.ndb.write.batch-size.")
        return None


#: Characters of a key's JSON (`kjson`) that the indexed `kjson_key` column holds (768
#: utf8mb4 characters: InnoDB's largest index key, 3,072 bytes); a key whose JSON is
#: longer has NULL there, and in the views' `kjson` (their `key_text` and `ukey` name it).
KJSON_KEY_CHARS = 768
#: The `kjson_key` column of the state table (InnoDB): `kjson` where it has at most
#: :data:`KJSON_KEY_CHARS` characters, else NULL. VIRTUAL: nothing more is stored in the
#: row, only the index `ix_kjson` holds the values; adding it to an existing table is
#: in place and instant. NDB indexes no virtual column (and no JSON column, nor a prefix):
#: NDB tables do not get it, their `kjson` lookups read the table (README, "SQL views").
KJSON_KEY_COLUMN = (
    f"kjson_key VARCHAR({KJSON_KEY_CHARS}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin "
    f"GENERATED ALWAYS AS (IF(CHAR_LENGTH(kjson) <= {KJSON_KEY_CHARS}, kjson, NULL)) VIRTUAL")


def kjson_index_ddl(tables: StateStore) -> list[str]:
    """The statements that give an InnoDB state table created before `kjson_key` existed
    the column and its index, both online (`ALGORITHM=INPLACE, LOCK=NONE`: the running
    job goes on writing; MariaDB adds a virtual column only in a statement of its own).
    Run by `pyflink-ndb views create` (:func:`pyflink_ndb.stores.views.ensure_kjson_index`)
    where the column is missing; new tables have it from :func:`mysql_ddl`."""
    return [f"ALTER TABLE {tables.t_state} ADD COLUMN {KJSON_KEY_COLUMN}, "
            "ALGORITHM=INPLACE, LOCK=NONE",
            f"ALTER TABLE {tables.t_state} ADD KEY ix_kjson (kjson_key), "
            "ALGORITHM=INPLACE, LOCK=NONE"]


def mysql_ddl(tables: StateStore, ndb: bool) -> list[str]:
    """The CREATE TABLE statements of a namespace (row format 2).

    With `ndb`: `ENGINE=NDBCLUSTER` and `PARTITION BY KEY (key_group)` for the state table
    (rows of one key group share a partition: a subtask's reads and cleanup prune to its
    partitions), InnoDB otherwise. Values are LONGBLOB (NDB stores BLOB parts outside the
    ~30 KB row), JSON documents of the protocol are ASCII TEXT. An InnoDB state table also
    has the virtual column `kjson_key` and its index `ix_kjson`, for SQL lookups by key
    (:data:`KJSON_KEY_COLUMN`; the package itself never reads or writes it).
    """
    engine = "ENGINE=NDBCLUSTER" if ndb else "ENGINE=InnoDB"
    partition = " PARTITION BY KEY (key_group)" if ndb else ""
    text = "TEXT CHARACTER SET ascii"
    kjson_key = "" if ndb else f", {KJSON_KEY_COLUMN}, KEY ix_kjson (kjson_key)"
    return [
        f"CREATE TABLE IF NOT EXISTS {tables.t_state} ("
        "key_group SMALLINT NOT NULL, state_id INT NOT NULL, "
        "ukey VARBINARY(2048) NOT NULL, version BIGINT NOT NULL, chunk SMALLINT NOT NULL, "
        "tombstone TINYINT NOT NULL, chunks SMALLINT NOT NULL, expires_at_ms BIGINT NULL, "
        "fmt TINYINT NOT NULL, vbytes LONGBLOB NULL, vjson JSON NULL, kjson JSON NULL, "
        "PRIMARY KEY (key_group, state_id, ukey, version, chunk), "
        "KEY ix_cleanup (state_id, version, key_group), KEY ix_expiry (expires_at_ms)"
        f"{kjson_key}) {engine} DEFAULT CHARSET=utf8mb4{partition}",
        f"CREATE TABLE IF NOT EXISTS {tables.t_branches} ("
        "branch_id BIGINT NOT NULL PRIMARY KEY, operator VARCHAR(255) NOT NULL, "
        f"kg_start SMALLINT NOT NULL, kg_end SMALLINT NOT NULL, lineage {text} NOT NULL, "
        f"origin {text} NOT NULL, job_id VARCHAR(64) NOT NULL, subtask INT NOT NULL, "
        "attempt INT NOT NULL, created_ms BIGINT NOT NULL, KEY ix_operator (operator)"
        f") {engine} DEFAULT CHARSET=utf8mb4",
        f"CREATE TABLE IF NOT EXISTS {tables.t_snapshots} ("
        "operator VARCHAR(255) NOT NULL, branch_id BIGINT NOT NULL, epoch BIGINT NOT NULL, "
        "kind VARCHAR(16) NOT NULL, status VARCHAR(16) NOT NULL, kg_start SMALLINT NOT NULL, "
        "kg_end SMALLINT NOT NULL, created_ms BIGINT NOT NULL, job_id VARCHAR(64) NOT NULL, "
        f"PRIMARY KEY (operator, branch_id, epoch)) {engine} DEFAULT CHARSET=utf8mb4",
        f"CREATE TABLE IF NOT EXISTS {tables.t_operators} ("
        f"operator VARCHAR(255) NOT NULL PRIMARY KEY, owners {text} NOT NULL, "
        f"committed {text} NULL, committed_ckpt BIGINT NOT NULL, fmt TINYINT NOT NULL, "
        f"updated_ms BIGINT NOT NULL) {engine} DEFAULT CHARSET=utf8mb4",
        f"CREATE TABLE IF NOT EXISTS {tables.t_catalog} ("
        "state_id INT NOT NULL PRIMARY KEY, operator VARCHAR(255) NOT NULL, "
        "state_name VARCHAR(255) NOT NULL, state_kind VARCHAR(32) NOT NULL, "
        "serializer VARCHAR(64) NOT NULL, ttl_ms BIGINT NULL, format_version INT NOT NULL, "
        f"UNIQUE KEY uq_state (operator, state_name)) {engine} DEFAULT CHARSET=utf8mb4",
    ]
