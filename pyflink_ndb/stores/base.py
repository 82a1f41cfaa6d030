"""The store contract and the SQL shared by every driver.

A store keeps, per namespace, three tables:

* `<ns>_state`: one row per (key group, state id, user key, epoch, chunk) with the value
  bytes (`vbytes`), a JSON rendering (`vjson`), a tombstone flag, the TTL expiry and the
  row format version. Values larger than :data:`CHUNK_BYTES` are split over chunks
  `0..chunks-1` of the same version.
* `<ns>_epochs`: one commit marker per (operator, epoch) of a completed checkpoint.
* `<ns>_catalog`: one row per declared state (operator, name, kind, serializer, TTL,
  format version).

All SQL is parameterised; identifiers are built only from a validated namespace. The SQL
is kept to what NDB accepts: primary-key access first, READ COMMITTED, bounded
transactions (callers batch), BLOB columns for values.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyflink_ndb.errors import ConfigurationError, StateCompatibilityError, ValueTooLargeError

#: Version of the row layout written into every row and catalog entry.
FORMAT_VERSION = 1
#: Values are split into chunks of this many bytes (keeps statements well under
#: max_allowed_packet and NDB operations small).
CHUNK_BYTES = 256 * 1024
#: Longest encoded user key (bytes), bounded by the primary-key size limits of
#: InnoDB (3072 bytes) and NDB.
MAX_UKEY_BYTES = 2048
#: Cap on the bytes of one write transaction besides the row count.
MAX_BATCH_BYTES = 4 * 1024 * 1024

_IDENT_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """The newest stored version of one entry."""

    epoch: int
    tombstone: bool
    value: bytes | None
    expires_at_ms: int | None


@dataclass(frozen=True, slots=True)
class WriteRow:
    """One entry to write in an epoch: a value, or a tombstone when `tombstone` is True."""

    key_group: int
    state_id: int
    ukey: bytes
    tombstone: bool
    value: bytes | None
    value_json: str | None
    expires_at_ms: int | None
    #: JSON of the Flink key (None when it does not map to JSON), for SQL readers.
    key_json: str | None = None


def state_id_for(operator: str, name: str) -> int:
    """Deterministic 31-bit state id of (operator, state name), the same on every subtask."""
    digest = hashlib.sha1(f"{operator}\x00{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def prefix_upper_bound(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every string that starts with `prefix`."""
    data = bytearray(prefix)
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    return None


def now_ms() -> int:
    return int(time.time() * 1000)


class StateStore(ABC):
    """Tier 3 of the tiered state: versioned rows, commit markers and the catalog.

    Life cycle: :meth:`open` (creates missing tables) before anything else, :meth:`close`
    last; nothing may be called after :meth:`close`. A store object belongs to one
    subtask (one thread); it is not thread-safe.
    """

    #: Placeholder of the DB-API driver ("?" or "%s").
    placeholder = "?"
    #: Commit every write batch (bounded transactions, for NDB) or once per epoch.
    commit_each_batch = True

    def __init__(self, namespace: str, write_batch_rows: int = 500) -> None:
        if not _IDENT_RE.match(namespace):
            raise ConfigurationError(f"Invalid namespace {namespace!r}.")
        self.namespace = namespace
        self.write_batch_rows = write_batch_rows
        self.t_state = f"{namespace}_state"
        self.t_epochs = f"{namespace}_epochs"
        self.t_catalog = f"{namespace}_catalog"

    # -- driver hooks ---------------------------------------------------------------------
    @abstractmethod
    def _connect(self) -> Any: ...

    @abstractmethod
    def _ddl(self) -> list[str]: ...

    @abstractmethod
    def _insert_ignore(self) -> str:
        """`INSERT IGNORE` or its dialect equivalent."""

    @abstractmethod
    def describe(self) -> str:
        """Where the state is, without secrets (for logs and messages)."""

    def _translate_error(self, err: Exception) -> Exception | None:
        """A pyflink-ndb error for a driver error, or None to re-raise it unchanged."""
        return None

    # -- plumbing -------------------------------------------------------------------------
    def open(self, create: bool = True) -> None:
        """Connect, create missing tables (when `create`) and check their layout.

        :param create: False for readers (the CLI): nothing is created.
        :raises StoreUnavailableError: the database cannot be reached.
        :raises StateCompatibilityError: the tables are missing (`create` False) or have
            another layout (created by another format version).
        """
        self._conn = self._connect()
        if create:
            for statement in self._ddl():
                self._execute(statement)
            self._conn.commit()
        try:
            self._query(f"SELECT key_group, state_id, ukey, epoch, chunk, tombstone, chunks, "
                        f"expires_at_ms, fmt, vbytes, vjson, kjson FROM {self.t_state} "
                        "WHERE 1 = 0")
            self._query(f"SELECT operator, epoch, is_savepoint, job_id FROM {self.t_epochs} "
                        "WHERE 1 = 0")
            self._query(f"SELECT state_id, format_version FROM {self.t_catalog} WHERE 1 = 0")
        except Exception as err:
            self._conn.rollback()
            if not create:
                raise StateCompatibilityError(
                    f"Namespace {self.namespace!r} in {self.describe()} has no pyflink-ndb "
                    f"tables ({err}). Check --url and --namespace: the namespace is the "
                    "prefix of the <namespace>_state table.") from err
            raise StateCompatibilityError(
                f"Namespace {self.namespace!r} in {self.describe()} has tables of another "
                f"layout (another pyflink-ndb format version): {err}. Use a new "
                "state.backend.ndb.namespace, or drop that namespace's tables.") from err

    def drop_tables(self) -> None:
        """Drop the namespace's three tables: all its state, markers and catalog, for good.

        :raises StoreUnavailableError: the database cannot be reached.
        """
        if getattr(self, "_conn", None) is None:
            self._conn = self._connect()
        for table in (self.t_state, self.t_epochs, self.t_catalog):
            self._execute(f"DROP TABLE IF EXISTS {table}")
        self._commit()

    def check_connection(self) -> str:
        """Connect once and disconnect; returns :meth:`describe` (for `doctor`).

        :raises StoreUnavailableError: the database cannot be reached.
        """
        self._conn = self._connect()
        try:
            return self.describe()
        finally:
            self.close()

    def close(self) -> None:
        conn = getattr(self, "_conn", None)
        self._conn = None
        if conn is not None:
            with contextlib.suppress(Exception):  # the driver may have closed it already
                conn.close()

    def _sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def _execute(self, text: str, params: Sequence[Any] = ()) -> Any:
        cur = self._conn.cursor()
        try:
            cur.execute(self._sql(text), tuple(params))
        except Exception as err:
            mapped = self._translate_error(err)
            if mapped is not None:
                raise mapped from err
            raise
        return cur

    def _executemany(self, text: str, rows: Sequence[Sequence[Any]]) -> None:
        cur = self._conn.cursor()
        try:
            cur.executemany(self._sql(text), rows)
        except Exception as err:
            mapped = self._translate_error(err)
            if mapped is not None:
                raise mapped from err
            raise

    def _query(self, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self._execute(text, params).fetchall())

    def _commit(self) -> None:
        try:
            self._conn.commit()
        except Exception as err:
            mapped = self._translate_error(err)
            if mapped is not None:
                raise mapped from err
            raise

    # -- catalog --------------------------------------------------------------------------
    def register_state(self, operator: str, name: str, kind: str, serializer: str,
                       ttl_ms: int | None) -> int:
        """Record a state declaration and return its state id.

        :raises StateCompatibilityError: the state exists with another kind, serializer,
            format version, or with TTL switched on/off (as Flink's compatibility check).
        """
        state_id = state_id_for(operator, name)
        self._execute(
            f"{self._insert_ignore()} INTO {self.t_catalog} (state_id, operator, state_name, "
            "state_kind, serializer, ttl_ms, format_version) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (state_id, operator, name, kind, serializer, ttl_ms, FORMAT_VERSION))
        self._commit()
        rows = self._query(
            f"SELECT operator, state_name, state_kind, serializer, ttl_ms, format_version "
            f"FROM {self.t_catalog} WHERE state_id = ?", (state_id,))
        if not rows:
            raise StateCompatibilityError(f"Catalog entry for state {name!r} vanished.")
        op, sname, skind, sser, sttl, sfmt = rows[0]
        if (op, sname) != (operator, name):
            raise StateCompatibilityError(
                f"State id collision between {operator}/{name} and {op}/{sname}; rename one.")
        problems = []
        if skind != kind:
            problems.append(f"it was declared as {skind}, now as {kind}")
        if sser != serializer:
            problems.append(f"serializer {sser} differs from {serializer}")
        if int(sfmt) != FORMAT_VERSION:
            problems.append(f"row format {sfmt} differs from {FORMAT_VERSION}")
        if (sttl is None) != (ttl_ms is None):
            problems.append("TTL was " + ("enabled" if sttl is not None else "disabled")
                            + " and is now " + ("enabled" if ttl_ms is not None else "disabled"))
        if problems:
            raise StateCompatibilityError(
                f"State {name!r} of operator {operator!r} in namespace {self.namespace!r} is "
                f"incompatible with the stored state: {'; '.join(problems)}. Give the state "
                "a new name, or start on an empty namespace (on-fresh-start: truncate).")
        if sttl != ttl_ms:
            self._execute(f"UPDATE {self.t_catalog} SET ttl_ms = ? WHERE state_id = ?",
                          (ttl_ms, state_id))
            self._commit()
        return state_id

    def catalog(self, operator: str | None = None) -> list[dict[str, Any]]:
        """Catalog rows (all, or those of one operator) as dicts."""
        sql = (f"SELECT state_id, operator, state_name, state_kind, serializer, ttl_ms, "
               f"format_version FROM {self.t_catalog}")
        params: tuple[Any, ...] = ()
        if operator is not None:
            sql += " WHERE operator = ?"
            params = (operator,)
        cols = ("state_id", "operator", "state_name", "state_kind", "serializer", "ttl_ms",
                "format_version")
        return [dict(zip(cols, row, strict=True)) for row in self._query(sql + " ORDER BY state_id",
                                                                         params)]

    def state_ids(self, operator: str) -> list[int]:
        return [row["state_id"] for row in self.catalog(operator)]

    # -- reads ----------------------------------------------------------------------------
    def _join_chunks(self, key_group: int, state_id: int, ukey: bytes, epoch: int,
                     first: bytes | None, chunks: int) -> bytes | None:
        if chunks <= 1:
            return None if first is None else bytes(first)
        rows = self._query(
            f"SELECT chunk, vbytes FROM {self.t_state} WHERE key_group = ? AND state_id = ? "
            "AND ukey = ? AND epoch = ? AND chunk < ? ORDER BY chunk",
            (key_group, state_id, ukey, epoch, chunks))
        parts = [bytes(v) for c, v in rows]
        if len(parts) != chunks:
            raise StateCompatibilityError(
                f"Stored value of epoch {epoch} has {len(parts)} of {chunks} chunks.")
        return b"".join(parts)

    def read_latest(self, state_id: int, key_group: int, ukey: bytes,
                    max_epoch: int | None = None) -> StoredVersion | None:
        """The newest version of an entry (at or below `max_epoch` when given), or None."""
        sql = (f"SELECT epoch, tombstone, chunks, expires_at_ms, vbytes FROM {self.t_state} "
               "WHERE key_group = ? AND state_id = ? AND ukey = ? AND chunk = 0")
        params: list[Any] = [key_group, state_id, ukey]
        if max_epoch is not None:
            sql += " AND epoch <= ?"
            params.append(max_epoch)
        rows = self._query(sql + " ORDER BY epoch DESC LIMIT 1", params)
        if not rows:
            return None
        epoch, tomb, chunks, expires, vbytes = rows[0]
        value = None if tomb else self._join_chunks(key_group, state_id, ukey, epoch, vbytes,
                                                     chunks)
        return StoredVersion(int(epoch), bool(tomb), value,
                             None if expires is None else int(expires))

    def scan_latest(self, state_id: int, key_group: int, prefix: bytes, after: bytes | None,
                    limit: int) -> list[tuple[bytes, StoredVersion]]:
        """One page of the newest versions of the entries whose user key starts with
        `prefix`, in user-key order, strictly after `after`; tombstones included.

        At most `limit` entries; a shorter page means the scan is complete.
        """
        upper = prefix_upper_bound(prefix)
        sql = (f"SELECT s.ukey, s.epoch, s.tombstone, s.chunks, s.expires_at_ms, s.vbytes "
               f"FROM {self.t_state} s WHERE s.key_group = ? AND s.state_id = ? "
               "AND s.chunk = 0")
        # One lower bound only: SQLite's planner seeks on the first of two and would re-read
        # every earlier row of the prefix for each page (quadratic iteration).
        params: list[Any] = [key_group, state_id]
        if after is not None and after >= prefix:
            sql += " AND s.ukey > ?"
            params.append(after)
        else:
            sql += " AND s.ukey >= ?"
            params.append(prefix)
        if upper is not None:
            sql += " AND s.ukey < ?"
            params.append(upper)
        sql += (f" AND s.epoch = (SELECT MAX(t.epoch) FROM {self.t_state} t WHERE "
                "t.key_group = s.key_group AND t.state_id = s.state_id AND t.ukey = s.ukey "
                "AND t.chunk = 0) ORDER BY s.ukey LIMIT ?")
        params.append(limit)
        out = []
        for ukey, epoch, tomb, chunks, expires, vbytes in self._query(sql, params):
            ukey = bytes(ukey)
            value = None if tomb else self._join_chunks(key_group, state_id, ukey, epoch,
                                                         vbytes, chunks)
            out.append((ukey, StoredVersion(int(epoch), bool(tomb), value,
                                            None if expires is None else int(expires))))
        return out

    def scan_key_groups(self, state_ids: Sequence[int], kg_start: int, kg_end: int,
                        page_rows: int = 1000) -> Iterator[tuple[int, int, bytes,
                                                                 StoredVersion]]:
        """Newest versions of every live entry of `state_ids` in key groups
        `kg_start..kg_end` (inclusive), paged by `page_rows` (for eager restore)."""
        for state_id in state_ids:
            for key_group in range(kg_start, kg_end + 1):
                after: bytes | None = None
                while True:
                    page = self.scan_latest(state_id, key_group, b"", after, page_rows)
                    for ukey, version in page:
                        yield state_id, key_group, ukey, version
                    if len(page) < page_rows:
                        break
                    after = page[-1][0]

    # -- writes ---------------------------------------------------------------------------
    def _row_params(self, epoch: int, row: WriteRow) -> Iterable[tuple[Any, ...]]:
        if row.tombstone or row.value is None:
            yield (row.key_group, row.state_id, row.ukey, epoch, 0, 1, 1, row.expires_at_ms,
                   FORMAT_VERSION, None, None, row.key_json)
            return
        value = row.value
        chunks = max(1, -(-len(value) // CHUNK_BYTES))
        for chunk in range(chunks):
            part = value[chunk * CHUNK_BYTES:(chunk + 1) * CHUNK_BYTES]
            yield (row.key_group, row.state_id, row.ukey, epoch, chunk, 0, chunks,
                   row.expires_at_ms, FORMAT_VERSION, part,
                   row.value_json if chunk == 0 and chunks == 1 else None,
                   row.key_json if chunk == 0 else None)

    def write_epoch(self, epoch: int, rows: Iterable[WriteRow],
                    value_max_bytes: int | None = None) -> int:
        """Write entries as versions of `epoch` (idempotent upserts) and commit.

        Every row is checked first: an encoded key over :data:`MAX_UKEY_BYTES` or a value
        over `value_max_bytes` (None: no limit) raises :class:`ValueTooLargeError` before
        anything is written. Rows are sent in transactions of at most `write_batch_rows`
        rows and :data:`MAX_BATCH_BYTES` bytes. Returns the number of database rows written;
        returns only when every row is committed.
        """
        if not isinstance(rows, Sequence):
            rows = list(rows)  # checked in full before the first write
        for row in rows:
            if len(row.ukey) > MAX_UKEY_BYTES:
                raise ValueTooLargeError(
                    f"An encoded key of {len(row.ukey)} bytes (state id {row.state_id}) "
                    f"exceeds the limit of {MAX_UKEY_BYTES} bytes (primary-key size of "
                    f"InnoDB/NDB); epoch {epoch} wrote nothing. Use a shorter key.")
            if (value_max_bytes is not None and row.value is not None
                    and len(row.value) > value_max_bytes):
                raise ValueTooLargeError(
                    f"A value of {len(row.value)} bytes (state id {row.state_id}) exceeds "
                    f"state.backend.ndb.value.max-bytes={value_max_bytes}; epoch {epoch} "
                    "wrote nothing. Store smaller values or raise the limit.")
        sql = (f"REPLACE INTO {self.t_state} (key_group, state_id, ukey, epoch, chunk, "
               "tombstone, chunks, expires_at_ms, fmt, vbytes, vjson, kjson) "
               "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
        batch: list[tuple[Any, ...]] = []
        batch_bytes = 0
        written = 0
        for row in rows:
            for params in self._row_params(epoch, row):
                size = (len(params[2]) + len(params[9] or b"") + len(params[10] or "")
                        + len(params[11] or ""))
                if batch and (len(batch) >= self.write_batch_rows
                              or batch_bytes + size > MAX_BATCH_BYTES):
                    self._executemany(sql, batch)
                    if self.commit_each_batch:
                        self._commit()
                    written += len(batch)
                    batch, batch_bytes = [], 0
                batch.append(params)
                batch_bytes += size
        if batch:
            self._executemany(sql, batch)
            self._commit()
            written += len(batch)
        return written

    # -- epochs ---------------------------------------------------------------------------
    def commit_epoch(self, operator: str, epoch: int, is_savepoint: bool = False,
                     job_id: str = "") -> None:
        """Write a marker (idempotent): with `is_savepoint` False the commit marker of a
        completed checkpoint; with True the pin of a savepoint's epoch (written when the
        savepoint is taken: Flink sends no completion for most savepoints), which garbage
        collection keeps until it is released. `job_id` is the Flink job that wrote it."""
        self._execute(
            f"{self._insert_ignore()} INTO {self.t_epochs} (operator, epoch, is_savepoint, "
            "committed_at_ms, job_id) VALUES (?, ?, ?, ?, ?)",
            (operator, epoch, 1 if is_savepoint else 0, now_ms(), job_id))
        self._commit()

    def committed_epochs(self, operator: str) -> list[tuple[int, bool]]:
        """(epoch, is_savepoint) of every commit marker and live savepoint pin of
        `operator`, oldest first."""
        return [(int(e), bool(s)) for e, s in self._query(
            f"SELECT epoch, is_savepoint FROM {self.t_epochs} WHERE operator = ? "
            f"AND is_savepoint IN (0, 1) ORDER BY epoch, is_savepoint", (operator,))]

    def invalidate_savepoints_after(self, operator: str, epoch: int) -> list[int]:
        """Turn the pins of savepoints newer than `epoch` into invalidation marks (their
        rows are being rolled back); returns their epochs."""
        rows = self._query(f"SELECT epoch FROM {self.t_epochs} WHERE operator = ? AND "
                           "epoch > ? AND is_savepoint = 1", (operator, epoch))
        for (pinned,) in rows:
            self._execute(f"{self._insert_ignore()} INTO {self.t_epochs} (operator, epoch, "
                          "is_savepoint, committed_at_ms, job_id) VALUES (?, ?, 2, ?, '')",
                          (operator, pinned, now_ms()))
            self._execute(f"DELETE FROM {self.t_epochs} WHERE operator = ? AND epoch = ? "
                          "AND is_savepoint = 1", (operator, pinned))
        self._commit()
        return [int(e) for (e,) in rows]

    def invalidated_epochs(self, operator: str) -> list[int]:
        """Epochs of savepoints whose rows a restore rolled back."""
        return [int(e) for (e,) in self._query(
            f"SELECT epoch FROM {self.t_epochs} WHERE operator = ? AND is_savepoint = 2",
            (operator,))]

    def clear_invalidation(self, operator: str, epoch: int) -> None:
        """Forget the invalidation mark of `epoch`: a new checkpoint re-uses the epoch."""
        self._execute(f"DELETE FROM {self.t_epochs} WHERE operator = ? AND epoch = ? AND "
                      "is_savepoint = 2", (operator, epoch))
        self._commit()

    def highest_marked_epoch(self, operator: str) -> int | None:
        """The highest epoch of any marker, pin or invalidation mark of `operator`."""
        rows = self._query(f"SELECT MAX(epoch) FROM {self.t_epochs} WHERE operator = ?",
                           (operator,))
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def is_invalidated(self, operator: str, epoch: int) -> bool:
        """True when `epoch` was a savepoint whose rows a later restore rolled back."""
        return bool(self._query(f"SELECT 1 FROM {self.t_epochs} WHERE operator = ? AND "
                                "epoch = ? AND is_savepoint = 2", (operator, epoch)))

    def latest_committed_epoch(self, operator: str,
                               exclude_job: str | None = None) -> int | None:
        """The newest completed checkpoint's epoch (savepoint pins do not count), leaving
        out the markers of job `exclude_job` when given."""
        sql = (f"SELECT MAX(epoch) FROM {self.t_epochs} WHERE operator = ? "
               "AND is_savepoint = 0")
        params: list[Any] = [operator]
        if exclude_job is not None:
            sql += " AND job_id <> ?"
            params.append(exclude_job)
        rows = self._query(sql, params)
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    def delete_job_markers(self, operator: str, job_id: str) -> None:
        """Remove the commit markers that job `job_id` wrote for `operator`."""
        self._execute(f"DELETE FROM {self.t_epochs} WHERE operator = ? AND job_id = ? "
                      "AND is_savepoint = 0", (operator, job_id))
        self._commit()

    def prune_commit_markers(self, operator: str, before_epoch: int) -> None:
        """Remove checkpoint commit markers older than `before_epoch` (pins stay)."""
        self._execute(f"DELETE FROM {self.t_epochs} WHERE operator = ? AND epoch < ? "
                      "AND is_savepoint = 0", (operator, before_epoch))
        self._commit()

    def release_savepoint(self, operator: str, epoch: int) -> int:
        """Remove a savepoint pin so that garbage collection may reclaim its versions."""
        cur = self._execute(f"DELETE FROM {self.t_epochs} WHERE operator = ? AND epoch = ? "
                            "AND is_savepoint = 1", (operator, epoch))
        self._commit()
        return max(cur.rowcount, 0)

    def delete_commit_markers(self, operator: str, after_epoch: int = -1) -> None:
        """Remove commit markers and pins of `operator` newer than `after_epoch` (all by
        default); invalidation marks stay."""
        self._execute(f"DELETE FROM {self.t_epochs} WHERE operator = ? AND epoch > ? "
                      "AND is_savepoint IN (0, 1)", (operator, after_epoch))
        self._commit()

    # -- roll-back and garbage collection ------------------------------------------------
    def _delete_in_batches(self, where: str, params: Sequence[Any]) -> int:
        """Delete matching rows in bounded transactions (NDB fails huge ones)."""
        total = 0
        while True:
            cur = self._execute(
                f"DELETE FROM {self.t_state} WHERE {where} {self._delete_limit()}", params)
            count = cur.rowcount
            self._commit()
            total += max(count, 0)
            if not self._delete_limit() or count < self.write_batch_rows * 10:
                return total

    def _delete_limit(self) -> str:
        return ""

    def rollback_after(self, state_ids: Sequence[int], kg_start: int, kg_end: int,
                       epoch: int) -> int:
        """Delete every version newer than `epoch` of `state_ids` in key groups
        `kg_start..kg_end`: what a checkpoint that never completed left behind."""
        total = 0
        for state_id in state_ids:
            total += self._delete_in_batches(
                "key_group BETWEEN ? AND ? AND state_id = ? AND epoch > ?",
                (kg_start, kg_end, state_id, epoch))
        return total

    def delete_versions(self, deletions: Sequence[Any]) -> int:
        """Garbage-collect: each deletion (key_group, state_id, ukey, op, epoch) removes the
        entry's versions with `epoch < bound` (op "<") or `epoch == bound` (op "=")."""
        total = 0
        for start in range(0, len(deletions), self.write_batch_rows):
            part = deletions[start:start + self.write_batch_rows]
            clauses = []
            params: list[Any] = []
            for d in part:
                op = "<" if d.op == "<" else "="
                clauses.append(f"(key_group = ? AND state_id = ? AND ukey = ? AND epoch {op} ?)")
                params += [d.key_group, d.state_id, d.ukey, d.epoch]
            cur = self._execute(f"DELETE FROM {self.t_state} WHERE " + " OR ".join(clauses),
                                params)
            total += max(cur.rowcount, 0)
            self._commit()
        return total

    def delete_expired(self, state_ids: Sequence[int], kg_start: int, kg_end: int,
                       now: int) -> int:
        """Delete the versions whose TTL expired before `now` (ms since the Unix epoch).

        A version is deleted only when no older version of its entry is still live, so an
        older value can never re-appear (it could after a TTL was shortened). Work goes in
        batches of `write.batch-size` versions.
        """
        if not state_ids:
            return 0
        marks = ", ".join("?" for _ in state_ids)
        sql = (f"SELECT s.key_group, s.state_id, s.ukey, s.epoch FROM {self.t_state} s "
               "WHERE s.chunk = 0 AND s.expires_at_ms IS NOT NULL AND s.expires_at_ms < ? "
               f"AND s.key_group BETWEEN ? AND ? AND s.state_id IN ({marks}) AND NOT EXISTS ("
               f"SELECT 1 FROM {self.t_state} t WHERE t.key_group = s.key_group AND "
               "t.state_id = s.state_id AND t.ukey = s.ukey AND t.epoch < s.epoch AND "
               "t.chunk = 0 AND t.tombstone = 0 AND (t.expires_at_ms IS NULL OR "
               "t.expires_at_ms >= ?)) LIMIT ?")
        total = 0
        while True:
            rows = self._query(sql, (now, kg_start, kg_end, *state_ids, now,
                                     self.write_batch_rows))
            if not rows:
                return total
            from pyflink_ndb.checkpoint.gc import Deletion

            total += self.delete_versions([Deletion(int(kg), int(sid), bytes(ukey), "=",
                                                    int(epoch))
                                           for kg, sid, ukey, epoch in rows])
            if len(rows) < self.write_batch_rows:
                return total

    def delete_all(self, state_ids: Sequence[int], kg_start: int, kg_end: int) -> int:
        """Delete every version of `state_ids` in key groups `kg_start..kg_end`."""
        return self.rollback_after(state_ids, kg_start, kg_end, -1)

    def count_rows(self, state_ids: Sequence[int] | None = None) -> int:
        """Number of rows in the state table (of `state_ids` when given)."""
        if state_ids is None:
            return int(self._query(f"SELECT COUNT(*) FROM {self.t_state}")[0][0])
        if not state_ids:
            return 0
        marks = ", ".join("?" for _ in state_ids)
        return int(self._query(
            f"SELECT COUNT(*) FROM {self.t_state} WHERE state_id IN ({marks})",
            tuple(state_ids))[0][0])

    def committed_view_sql(self) -> str:
        """A SELECT of the committed state: newest version at or below the latest commit
        marker of its operator, tombstones and chunks > 0 left out."""
        return (
            f"SELECT c.operator, c.state_name, s.key_group, s.ukey, s.kjson, s.epoch, s.vjson, "
            f"s.vbytes, s.expires_at_ms FROM {self.t_state} s JOIN {self.t_catalog} c ON "
            "c.state_id = s.state_id WHERE s.chunk = 0 AND s.tombstone = 0 AND s.epoch = ("
            f"SELECT MAX(t.epoch) FROM {self.t_state} t WHERE t.key_group = s.key_group AND "
            "t.state_id = s.state_id AND t.ukey = s.ukey AND t.chunk = 0 AND t.epoch <= ("
            f"SELECT MAX(e.epoch) FROM {self.t_epochs} e WHERE e.operator = c.operator "
            "AND e.is_savepoint = 0))")

    def query_committed(self, operator: str | None = None,
                        state_name: str | None = None) -> list[dict[str, Any]]:
        """Rows of :meth:`committed_view_sql`, optionally for one operator and state."""
        sql = "SELECT * FROM (" + self.committed_view_sql() + ") q WHERE 1 = 1"
        params: list[Any] = []
        if operator is not None:
            sql += " AND q.operator = ?"
            params.append(operator)
        if state_name is not None:
            sql += " AND q.state_name = ?"
            params.append(state_name)
        cols = ("operator", "state_name", "key_group", "ukey", "kjson", "epoch", "vjson",
                "vbytes", "expires_at_ms")
        out = []
        for row in self._query(sql, params):
            rec = dict(zip(cols, row, strict=True))
            rec["ukey"] = bytes(rec["ukey"])
            rec["vbytes"] = None if rec["vbytes"] is None else bytes(rec["vbytes"])
            out.append(rec)
        return out
