"""MySQL-protocol driver: RonDB's MySQL server in production, MySQL 8 or MariaDB otherwise.

Where the server has the NDB engine (`information_schema.ENGINES`), tables are created
with `ENGINE=NDBCLUSTER` and `PARTITION BY KEY (key_group)`; elsewhere with InnoDB.
Sessions run in autocommit at READ COMMITTED, the only isolation level NDB offers: every
statement is its own bounded transaction, and no read keeps a transaction (or a metadata
lock) open, so a running job never blocks DDL. Driver errors are mapped by error number
or class (PEP 249 / pymysql), never by message text.
"""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import unquote, urlparse

import pymysql

from pyflink_ndb.config import redact_url
from pyflink_ndb.errors import ConfigurationError, StoreUnavailableError, ValueTooLargeError
from pyflink_ndb.stores.base import StateStore

#: Client error numbers meaning "the server cannot be reached or went away".
_UNREACHABLE = {2002, 2003, 2005, 2006, 2013, 2055}
_ACCESS_DENIED = {1044, 1045, 1698}
_PACKET_TOO_LARGE = {1153, 1301}
_UNKNOWN_DATABASE = 1049
_UNKNOWN_HOST = 2005


def parse_mysql_url(url: str) -> dict[str, Any]:
    """Split `mysql://user[:password]@host[:port]/database` into pymysql arguments."""
    parsed = urlparse(url)
    if parsed.scheme != "mysql" or not parsed.hostname or not parsed.path.strip("/"):
        raise ConfigurationError(
            f"state.backend.ndb.url={redact_url(url)!r} is not of the form "
            "mysql://user@host:port/database.")
    return {
        "host": parsed.hostname,
        "port": parsed.port or 3306,
        "user": unquote(parsed.username) if parsed.username else "root",
        "password": unquote(parsed.password) if parsed.password else None,
        "database": parsed.path.strip("/"),
    }


class MysqlStateStore(StateStore):
    """Tier 3 on a MySQL-protocol server (RonDB/NDB, MySQL, MariaDB)."""

    placeholder = "%s"

    def __init__(self, url: str, namespace: str, write_batch_rows: int = 500,
                 user: str | None = None, password: str | None = None,
                 connect_timeout_s: int = 10) -> None:
        super().__init__(namespace, write_batch_rows)
        self._args = parse_mysql_url(url)
        if user:
            self._args["user"] = user
        if password is not None:
            self._args["password"] = password
        self._connect_timeout_s = connect_timeout_s
        self.engine = "InnoDB"

    def describe(self) -> str:
        a = self._args
        return f"mysql://{a['user']}@{a['host']}:{a['port']}/{a['database']} ({self.engine})"

    def _connect(self) -> Any:
        a = self._args
        try:
            conn = pymysql.connect(
                host=a["host"], port=a["port"], user=a["user"], password=a["password"] or "",
                database=a["database"], charset="utf8mb4", autocommit=True,
                binary_prefix=True, connect_timeout=self._connect_timeout_s)
        except pymysql.err.OperationalError as err:
            code = err.args[0] if err.args else None
            where = f"{a['host']}:{a['port']}"
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
                    "state.backend.ndb.user and the password (state.backend.ndb.password, "
                    "password-file or password-env).") from err
            raise StoreUnavailableError(
                f"Cannot reach the database at {where} (error {code}). Start the MySQL "
                "server there or fix state.backend.ndb.url.") from err
        with conn.cursor() as cur:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            cur.execute("SELECT SUPPORT FROM information_schema.ENGINES "
                        "WHERE ENGINE = 'ndbcluster'")
            row = cur.fetchone()
        self.engine = "NDBCLUSTER" if row and row[0] in ("YES", "DEFAULT") else "InnoDB"
        conn.commit()
        return conn

    def _insert_ignore(self) -> str:
        return "INSERT IGNORE"

    def _delete_limit(self) -> str:
        return f"LIMIT {self.write_batch_rows * 10}"

    def _ddl(self) -> list[str]:
        ndb = self.engine == "NDBCLUSTER"
        engine = "ENGINE=NDBCLUSTER" if ndb else "ENGINE=InnoDB"
        partition = " PARTITION BY KEY (key_group)" if ndb else ""
        return [
            f"CREATE TABLE IF NOT EXISTS {self.t_state} ("
            "key_group SMALLINT NOT NULL, state_id INT NOT NULL, "
            "ukey VARBINARY(2048) NOT NULL, epoch BIGINT NOT NULL, chunk SMALLINT NOT NULL, "
            "tombstone TINYINT NOT NULL, chunks SMALLINT NOT NULL, expires_at_ms BIGINT NULL, "
            "fmt TINYINT NOT NULL, vbytes LONGBLOB NULL, vjson JSON NULL, kjson JSON NULL, "
            "PRIMARY KEY (key_group, state_id, ukey, epoch, chunk), "
            "KEY ix_expiry (expires_at_ms)"
            f") {engine} DEFAULT CHARSET=utf8mb4{partition}",
            f"CREATE TABLE IF NOT EXISTS {self.t_epochs} ("
            "operator VARCHAR(255) NOT NULL, epoch BIGINT NOT NULL, "
            "is_savepoint TINYINT NOT NULL, committed_at_ms BIGINT NOT NULL, "
            "job_id VARCHAR(64) NOT NULL, "
            f"PRIMARY KEY (operator, epoch, is_savepoint)) {engine} DEFAULT CHARSET=utf8mb4",
            f"CREATE TABLE IF NOT EXISTS {self.t_catalog} ("
            "state_id INT NOT NULL PRIMARY KEY, operator VARCHAR(255) NOT NULL, "
            "state_name VARCHAR(255) NOT NULL, state_kind VARCHAR(32) NOT NULL, "
            "serializer VARCHAR(64) NOT NULL, ttl_ms BIGINT NULL, format_version INT NOT NULL, "
            f"UNIQUE KEY uq_state (operator, state_name)) {engine} DEFAULT CHARSET=utf8mb4",
        ]

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
