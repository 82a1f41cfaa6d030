"""SQLite driver: the embedded store for a laptop quick start (`sqlite:///path`).

Several subtasks (threads of one TaskManager) may share one file; each opens its own
connection, SQLite's WAL mode lets readers run beside the one writer and `busy_timeout`
makes writers wait for each other.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyflink_ndb.errors import StoreUnavailableError
from pyflink_ndb.stores.base import StateStore


class SqliteStateStore(StateStore):
    """Tier 3 on a SQLite file. `path` may be `:memory:` for tests."""

    placeholder = "?"
    #: One transaction per epoch: SQLite has one writer and no transaction-size limit, and
    #: each commit costs milliseconds.
    commit_each_batch = False
    #: SQLite limits an expression tree to a depth of 1000: an `OR` of 500 primary keys
    #: is too deep.
    max_or_terms = 100

    def __init__(self, path: str, namespace: str, write_batch_rows: int = 500) -> None:
        super().__init__(namespace, write_batch_rows)
        self.path = path

    def describe(self) -> str:
        return f"sqlite:///{self.path}"

    def fork(self) -> StateStore | None:
        """None for `:memory:` (a second connection would see another database)."""
        return None if self.path == ":memory:" else super().fork()

    def _connect(self) -> Any:
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=60.0, isolation_level="DEFERRED",
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=60000")
        except sqlite3.Error as err:
            raise StoreUnavailableError(
                f"Cannot open the SQLite store {self.path!r}: {err}. Check "
                "state.backend.ndb.url and that the folder is writable.") from err
        return conn

    def _insert_ignore(self) -> str:
        return "INSERT OR IGNORE"

    def _begin(self) -> None:
        # IMMEDIATE takes the write lock at once: the fence check and the writes after it
        # see no other writer in between (SQLite has one writer at a time).
        self._conn.execute("BEGIN IMMEDIATE")

    def _lock_shared(self) -> str:
        return ""

    def _lock_update(self) -> str:
        return ""

    def _delete_limited(self, table: str, where: str, params: Sequence[Any],
                        limit: int) -> int:
        cur = self._execute(
            f"DELETE FROM {table} WHERE (key_group, state_id, ukey, version, chunk) IN ("
            f"SELECT key_group, state_id, ukey, version, chunk FROM {table} WHERE {where} "
            f"LIMIT {int(limit)})", params)
        return max(cur.rowcount, 0)

    def _cleanup_index(self) -> str:
        return f" INDEXED BY {self.t_state}_cleanup"

    def _table_exists(self, table: str) -> bool:
        return bool(self._read("inspect tables", "SELECT 1 FROM sqlite_master WHERE "
                               "type = 'table' AND name = ?", (table,)))

    def _ddl(self) -> list[str]:
        return [
            f"CREATE TABLE IF NOT EXISTS {self.t_state} ("
            "key_group INTEGER NOT NULL, state_id INTEGER NOT NULL, ukey BLOB NOT NULL, "
            "version INTEGER NOT NULL, chunk INTEGER NOT NULL, tombstone INTEGER NOT NULL, "
            "chunks INTEGER NOT NULL, expires_at_ms INTEGER, fmt INTEGER NOT NULL, "
            "vbytes BLOB, vjson TEXT, kjson TEXT, "
            "PRIMARY KEY (key_group, state_id, ukey, version, chunk)) WITHOUT ROWID",
            f"CREATE INDEX IF NOT EXISTS {self.t_state}_cleanup ON {self.t_state} "
            "(state_id, version, key_group)",
            f"CREATE INDEX IF NOT EXISTS {self.t_state}_expiry ON {self.t_state} "
            "(expires_at_ms)",
            f"CREATE TABLE IF NOT EXISTS {self.t_branches} ("
            "branch_id INTEGER NOT NULL PRIMARY KEY, operator TEXT NOT NULL, "
            "kg_start INTEGER NOT NULL, kg_end INTEGER NOT NULL, lineage TEXT NOT NULL, "
            "origin TEXT NOT NULL, job_id TEXT NOT NULL, subtask INTEGER NOT NULL, "
            "attempt INTEGER NOT NULL, created_ms INTEGER NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.t_snapshots} ("
            "operator TEXT NOT NULL, branch_id INTEGER NOT NULL, epoch INTEGER NOT NULL, "
            "kind TEXT NOT NULL, status TEXT NOT NULL, kg_start INTEGER NOT NULL, "
            "kg_end INTEGER NOT NULL, created_ms INTEGER NOT NULL, job_id TEXT NOT NULL, "
            "PRIMARY KEY (operator, branch_id, epoch))",
            f"CREATE TABLE IF NOT EXISTS {self.t_operators} ("
            "operator TEXT NOT NULL PRIMARY KEY, owners TEXT NOT NULL, committed TEXT, "
            "committed_ckpt INTEGER NOT NULL, fmt INTEGER NOT NULL, "
            "updated_ms INTEGER NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.t_catalog} ("
            "state_id INTEGER NOT NULL PRIMARY KEY, operator TEXT NOT NULL, "
            "state_name TEXT NOT NULL, state_kind TEXT NOT NULL, serializer TEXT NOT NULL, "
            "ttl_ms INTEGER, format_version INTEGER NOT NULL, UNIQUE (operator, state_name))",
        ]

    def _is_duplicate_key(self, err: BaseException) -> bool:
        return isinstance(err, sqlite3.IntegrityError)

    def _translate_error(self, err: Exception) -> Exception | None:
        if isinstance(err, sqlite3.OperationalError):
            return StoreUnavailableError(f"SQLite store {self.path!r} failed: {err}")
        if isinstance(err, sqlite3.ProgrammingError) and not self._is_open():
            return StoreUnavailableError(f"SQLite store {self.path!r} is closed: {err}")
        return None

    def _is_open(self) -> bool:
        try:
            self._conn.total_changes  # noqa: B018 (raises on a closed connection)
        except sqlite3.ProgrammingError:
            return False
        return True
