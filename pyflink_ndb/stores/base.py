"""The store contract and the SQL shared by every driver (row format 2, docs/protocol.md).

A store keeps, per namespace:

* `<ns>_state`: one row per (key group, state id, user key, version, chunk); `version` is
  `branch << 32 | epoch` (see :mod:`pyflink_ndb.stores.lineage`). Values larger than
  :data:`CHUNK_BYTES` are split over chunks `0..chunks-1` of the same version.
* `<ns>_branches`: one row per subtask attempt: its key groups and lineage.
* `<ns>_snapshots`: one row per restorable subtask snapshot (branch, epoch).
* `<ns>_operators`: the owner row of each operator (who owns which key groups, and the
  latest completed checkpoint that readers see).
* `<ns>_catalog`: one row per declared state.

All SQL is parameterised; identifiers are built only from a validated namespace. The SQL
is what NDB accepts: primary-key access first, READ COMMITTED, locking reads for fencing,
bounded transactions, BLOB columns for values. Every unit of work is one idempotent
transaction retried on transient faults (:mod:`pyflink_ndb.stores.retry`).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from pyflink_ndb.errors import (
    ConfigurationError,
    FencedError,
    StaleReadError,
    StateCompatibilityError,
    StoreUnavailableError,
    ValueTooLargeError,
)
from pyflink_ndb.stores.lineage import (
    Descriptor,
    Lineage,
    OwnerMap,
    Ranges,
    Token,
    claim_owners,
    is_current,
    owners_from_json,
    owners_to_json,
    owns,
)
from pyflink_ndb.stores.ndb import max_rows_per_delete
from pyflink_ndb.stores.retry import RetryPolicy, run_with_retries

T = TypeVar("T")

#: Version of the row layout written into every row and catalog entry.
FORMAT_VERSION = 2
#: Values are split into chunks of this many bytes (keeps statements well under
#: max_allowed_packet and NDB operations small).
CHUNK_BYTES = 256 * 1024
#: Longest encoded user key (bytes), bounded by the primary-key size limits of
#: InnoDB (3072 bytes) and NDB.
MAX_UKEY_BYTES = 2048
#: Cap on the bytes of one write transaction besides the row count.
MAX_BATCH_BYTES = 4 * 1024 * 1024

_IDENT_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")

#: Snapshot kinds and states (docs/protocol.md, "Tables").
KIND_CHECKPOINT, KIND_SAVEPOINT, KIND_FINAL = "checkpoint", "savepoint", "final"
PENDING, COMPLETED = "pending", "completed"


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """The newest visible version of one entry."""

    version: int
    tombstone: bool
    value: bytes | None
    expires_at_ms: int | None


class Deletion(NamedTuple):
    """Delete one version (all its chunks) of one entry. A named tuple: the collector makes
    one per superseded version, on the writer thread that shares the task threads' GIL."""

    key_group: int
    state_id: int
    ukey: bytes
    version: int


class WriteRow(NamedTuple):
    """One entry to write in an epoch: a value, or a tombstone when `tombstone` is True.

    A named tuple, not a frozen dataclass: the writer makes one per entry of every epoch,
    and a tuple is made in a third of the time (a frozen dataclass sets each field through
    `object.__setattr__`)."""

    key_group: int
    state_id: int
    ukey: bytes
    tombstone: bool
    value: bytes | None
    value_json: str | None
    expires_at_ms: int | None
    #: JSON of the Flink key (None when it does not map to JSON), for SQL readers.
    key_json: str | None = None


def row_params(version: int, row: WriteRow) -> Iterable[tuple[Any, ...]]:
    """The database rows of one entry written as `version`: the 12 columns (key_group,
    state_id, ukey, version, chunk, tombstone, chunks, expires_at_ms, fmt, vbytes, vjson,
    kjson) of each chunk of :data:`CHUNK_BYTES` (one row for a tombstone). The JSON of the
    value goes with a value of one chunk only; the key's JSON with chunk 0."""
    if row.tombstone or row.value is None:
        yield (row.key_group, row.state_id, row.ukey, version, 0, 1, 1, row.expires_at_ms,
               FORMAT_VERSION, None, None, row.key_json)
        return
    value = row.value
    chunks = max(1, -(-len(value) // CHUNK_BYTES))
    for chunk in range(chunks):
        part = value[chunk * CHUNK_BYTES:(chunk + 1) * CHUNK_BYTES]
        yield (row.key_group, row.state_id, row.ukey, version, chunk, 0, chunks,
               row.expires_at_ms, FORMAT_VERSION, part,
               row.value_json if chunk == 0 and chunks == 1 else None,
               row.key_json if chunk == 0 else None)


@dataclass(frozen=True, slots=True)
class Fence:
    """Who writes: the branch of a subtask attempt and the key groups it must still own."""

    operator: str
    branch: int
    kg_start: int
    kg_end: int


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    """One restorable subtask snapshot."""

    operator: str
    branch: int
    epoch: int
    kind: str
    status: str
    kg_start: int
    kg_end: int
    created_ms: int
    job_id: str

    @property
    def token(self) -> Token:
        return Token(self.branch, self.epoch, self.kg_start, self.kg_end)


@dataclass(frozen=True, slots=True)
class OperatorRow:
    """The owner row of one operator."""

    operator: str
    owners: OwnerMap
    committed: Descriptor | None


@dataclass(frozen=True, slots=True)
class BranchRow:
    lineage: Lineage
    operator: str
    origin: str
    job_id: str
    subtask: int
    attempt: int
    created_ms: int


class BranchOrigin(NamedTuple):
    """What a restore and retention need of one branch row's origin
    (:meth:`StateStore.branch_origins`)."""

    #: The job that made the branch.
    job_id: str
    #: The run of its job that the branch belongs to: a job started (fresh, resumed,
    #: truncated, or restored at submission) and its failovers. Jobs with a fixed job id
    #: (application mode with HA) have several runs under one id. Branches made before
    #: 2026-12-07 record none: their job id stands for it.
    run: str
    #: The snapshots (branch, epoch) it restored without claiming them: empty for a fresh
    #: start, `resume`, `truncate` and a restore in Flink's CLAIM mode.
    restored: tuple[tuple[int, int], ...]
    #: The snapshots it restored in Flink's CLAIM mode: the restoring job owns them.
    claimed: tuple[tuple[int, int], ...]
    #: The restore was of the retained checkpoint the job was submitted with
    #: (`execution.state-recovery.path`): a new run, also under the same job id.
    submitted: bool
    #: Its job keeps its checkpoints when it ends (`execution.checkpointing.externalized-
    #: checkpoint-retention` RETAIN_ON_CANCELLATION or DELETE_ON_CANCELLATION): Flink
    #: leaves them on disk for the user when it is cancelled (or fails). False:
    #: NO_EXTERNALIZED_CHECKPOINTS (Flink deletes them when the job ends), or a branch
    #: made before 2026-12-07 (not recorded).
    retains: bool
    #: The completed checkpoints its job retains (`checkpoints.retained`, by default
    #: Flink's `execution.checkpointing.num-retained`); 0: not recorded.
    retained: int
    #: The branch's random identity, which its snapshots' tokens carry (None: not
    #: recorded, before 2026-12-07).
    nonce: str | None
    #: The stop-with-savepoint that ended the branch's subtask: the checkpoint id of the
    #: synchronous savepoint that completed before it closed normally
    #: (:meth:`StateStore.record_end`; the job may still have failed while stopping);
    #: None: not ended so, or not recorded (a failure, a cancel, the end of its input, or
    #: a branch made before 2026-12-07).
    ended: int | None = None

    @staticmethod
    def parse(job_id: str, origin: str | None) -> BranchOrigin:
        """The origin JSON text of a branch row made by `job_id`."""
        data = json.loads(origin or "{}")
        restored = Descriptor.from_json(data.get("tokens")) \
            if data.get("kind") == "restore" else None
        keys = tuple((t.branch, t.epoch) for t in (restored.parts if restored else ()))
        claim = bool(data.get("claim"))
        return BranchOrigin(job_id, str(data.get("run") or job_id),
                            () if claim else keys, keys if claim else (),
                            bool(data.get("submission")), bool(data.get("retains")),
                            int(data.get("retained", 0)), data.get("nonce"),
                            None if data.get("ended") is None else int(data["ended"]))


def left_to_the_user(origins: Mapping[int, BranchOrigin], snapshots: Iterable[SnapshotRow],
                     run: str) -> set[tuple[int, int]]:
    """The snapshots (branch, epoch) of `snapshots` that the retention of run `run` (a
    :attr:`BranchOrigin.run`) must not drop, as it drops its own subsumed checkpoints:
    Flink never deletes them for that run, so they stay restorable until `pyflink-ndb
    release` (`CheckpointProtocol.protected_snapshots`; docs/protocol.md, "Garbage
    collection").

    * A snapshot that a job other than the one that took it restored, or a new run of the
      same job id restored at submission (:func:`restored_by_other_jobs`).
    * A checkpoint of another run whose job keeps its checkpoints when it ends
      (:func:`retained_by_other_runs`).

    :param origins: :meth:`StateStore.branch_origins` of the operator.
    :param snapshots: the operator's snapshot rows.
    :param run: the run whose retention asks.
    """
    snapshots = list(snapshots)
    return (restored_by_other_jobs(origins, snapshots)
            | retained_by_other_runs(origins, snapshots, run))


def restored_by_other_jobs(origins: Mapping[int, BranchOrigin],
                           snapshots: Iterable[SnapshotRow]) -> set[tuple[int, int]]:
    """Of :func:`left_to_the_user`: the snapshots that a job other than the one that took
    them, or a new run of a fixed job id, restored without claiming them: a savepoint's or
    a retained checkpoint's restore at job submission (`execution.savepoint.path`, `flink
    run -s`), as opposed to a failover, which restores the job's own checkpoint. Flink 1.20
    restores them in NO_CLAIM mode by default (`execution.state-recovery.claim-mode`,
    FLIP-193): the snapshot stays the user's and several jobs may start from it (found by
    a new user: a second restore of one retained checkpoint failed). A restore in CLAIM
    mode makes it the new job's (:attr:`BranchOrigin.claimed`)."""
    job_of = {(r.branch, r.epoch): r.job_id for r in snapshots}
    return {key for o in origins.values() for key in o.restored
            if key in job_of and (o.submitted or job_of[key] != o.job_id)}


def retained_by_other_runs(origins: Mapping[int, BranchOrigin],
                           snapshots: Iterable[SnapshotRow], run: str
                           ) -> set[tuple[int, int]]:
    """Of :func:`left_to_the_user`: the checkpoints of runs other than `run` whose job
    keeps its checkpoints when it ends (:attr:`BranchOrigin.retains`), as far as Flink
    keeps them: of each such run, its newest :attr:`BranchOrigin.retained` completed
    checkpoints and every snapshot newer than them (one whose completion the subtasks never
    heard of may be completed in Flink); not one a later job restored in CLAIM mode (Flink
    deletes it once that job subsumes it). Checkpoint ids are per job, so this is per run,
    not per key group; the one more that the run's own retention kept for readers goes.
    Found by a breaker: a later job that resumed or restored in a cancelled job's history
    subsumed the cancelled job's retained checkpoints, and restoring one of them failed.
    Also of a run whose subtasks recorded a stop-with-savepoint (:func:`stopped_runs`):
    the job may have failed while stopping, and Flink keeps them then."""
    by_run: dict[str, list[SnapshotRow]] = {}
    for r in snapshots:
        o = origins.get(r.branch)
        if o is not None and o.retains and o.run != run and r.kind != KIND_SAVEPOINT:
            by_run.setdefault(o.run, []).append(r)
    kept: set[tuple[int, int]] = set()
    for rows in by_run.values():
        keep = min(origins[r.branch].retained for r in rows)
        completed = sorted({r.epoch for r in rows if r.status == COMPLETED})
        bound = completed[-keep] if keep and len(completed) >= keep else 0
        kept |= {(r.branch, r.epoch) for r in rows if r.epoch >= bound}
    return kept - {key for o in origins.values() for key in o.claimed}


def stopped_runs(origins: Mapping[int, BranchOrigin]) -> set[str]:
    """The runs of `origins` whose subtasks recorded a stop-with-savepoint
    (:attr:`BranchOrigin.ended`): every branch of the run made after the first that
    recorded it recorded it too (a failover after the savepoint makes new branches, which
    record nothing).

    Used for the listing only (`pyflink-ndb savepoints --all`): Flink deletes a finished
    job's retained checkpoints (`CheckpointProperties` discards them on FINISHED), but a
    subtask cannot tell that its job reached FINISHED. A task that fails after the stop's
    savepoint completed ends the stop with `StopWithSavepointStoppingException` and the
    job FAILED, with no restart, and Flink keeps the checkpoints then (a breaker's find:
    deleting them on this record lost the job's retained checkpoints). So retention keeps
    them (:func:`retained_by_other_runs`) until `pyflink-ndb release`.
    """
    by_run: dict[str, list[int]] = {}
    for branch, o in origins.items():
        by_run.setdefault(o.run, []).append(branch)
    out = set()
    for run, branches in by_run.items():
        ended = [b for b in branches if origins[b].ended is not None]
        if ended and all(origins[b].ended is not None for b in branches if b > min(ended)):
            out.add(run)
    return out


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


def utc_text(ms: int) -> str:
    """A time in milliseconds since the epoch as `YYYY-MM-DD HH:MM:SSZ` (messages, CLI)."""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ms / 1000))


def visible(column: str, ranges: Ranges) -> tuple[str, list[int]]:
    """SQL predicate (and its parameters) for `column` inside any of `ranges`."""
    if not ranges:
        return "1 = 0", []
    params: list[int] = []
    for lo, hi in ranges:
        params += [lo, hi]
    return "(" + " OR ".join(f"{column} BETWEEN ? AND ?" for _ in ranges) + ")", params


#: Transactions :meth:`StateStore.allocate_branch` and :meth:`StateStore.claim_new_branch`
#: try before they give up on a branch id that other sessions keep taking.
BRANCH_ID_TRIES = 100


class _BranchIdTaken(Exception):
    """Inside :meth:`StateStore.allocate_branch` and :meth:`StateStore.claim_new_branch`:
    another session inserted the branch id this transaction chose; it rolls back and is
    tried again."""


class StateStore(ABC):
    """Tier 3 of the tiered state: versioned rows, branches, snapshots, owners, catalog.

    Life cycle: :meth:`open` (creates missing tables) before anything else, :meth:`close`
    last; nothing may be called after :meth:`close`. A store object belongs to one
    subtask (one thread); it is not thread-safe.
    """

    #: Placeholder of the DB-API driver ("?" or "%s").
    placeholder = "?"
    #: Commit every write batch (bounded transactions, for NDB) or once per epoch.
    commit_each_batch = True
    #: :meth:`write_versions` takes rows rendered as SQL literals (MySQL protocol).
    renders_literals = False
    #: Entries per statement that names entries one by one (`OR` of primary keys). 100:
    #: MariaDB 10.11 reads an `OR` of 300 primary keys as ranges but scans the table at
    #: 400-500 (EXPLAIN, measured with bench part 3); NDB's MySQL server likewise turns
    #: long `OR` lists into scans.
    max_or_terms = 100

    def __init__(self, namespace: str, write_batch_rows: int = 500,
                 retry: RetryPolicy | None = None) -> None:
        if not _IDENT_RE.match(namespace):
            raise ConfigurationError(f"Invalid namespace {namespace!r}.")
        self.namespace = namespace
        self.write_batch_rows = write_batch_rows
        self.retry_policy = retry or RetryPolicy()
        #: Rows one DELETE statement removes at most (NDB operation limits, BLOB parts
        #: counted: pyflink_ndb.stores.ndb).
        self.delete_limit_rows = min(write_batch_rows * 10, max_rows_per_delete(CHUNK_BYTES))
        self.retries = 0
        #: Called after each reconnect inside a retry (the write process reports its
        #: connections to the writer, :mod:`render_process`); None: nothing.
        self.on_reconnect: Callable[[], None] | None = None
        self.t_state = f"{namespace}_state"
        self.t_branches = f"{namespace}_branches"
        self.t_snapshots = f"{namespace}_snapshots"
        self.t_operators = f"{namespace}_operators"
        self.t_catalog = f"{namespace}_catalog"
        self.t_legacy_epochs = f"{namespace}_epochs"
        self._conn: Any = None
        self._closed = False

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

    @abstractmethod
    def _table_exists(self, table: str) -> bool: ...

    def _begin(self) -> None:
        """Start a transaction (explicit: sessions run in autocommit)."""
        self._conn.begin()

    def _lock_shared(self) -> str:
        """Suffix of a locking read that blocks writers of the row until commit."""
        return " LOCK IN SHARE MODE"

    def _lock_update(self) -> str:
        return " FOR UPDATE"

    def _delete_limited(self, table: str, where: str, params: Sequence[Any],
                        limit: int) -> int:
        cur = self._execute(f"DELETE FROM {table} WHERE {where} LIMIT {int(limit)}", params)
        return max(cur.rowcount, 0)

    def _point_index(self) -> str:
        """The hint (after the table name) of a read of given entries by primary key: the
        MySQL store names the primary key, so that the optimizer does not also estimate
        the `(state_id, version, key_group)` index with index dives (0.13 of a point
        read's 0.3–0.4 ms on MariaDB here)."""
        return ""

    def _cleanup_index(self) -> str:
        """The hint (after the table name) that makes a statement over a version range of
        one state use the `(state_id, version, key_group)` index: MariaDB otherwise
        range-scans the primary key over the key groups and rescans what it passed."""
        return ""

    def _is_transient(self, err: BaseException) -> bool:
        """True for faults worth retrying on a fresh connection."""
        return False

    def _is_lost_while_connecting(self, err: BaseException) -> bool:
        """True for a fault of :meth:`_connect` worth another try: the server took the
        connection and dropped it before it was ready. False for one that says the URL is
        wrong or nothing listens (see :meth:`_open_connection`)."""
        return False

    def _open_connection(self) -> Any:
        """A first connection (:meth:`_connect`), tried again under :attr:`retry_policy`
        when the server accepted it and dropped it before it was ready
        (:meth:`_is_lost_while_connecting`: a connection reset or lost during the
        handshake, as an overloaded server or its `connect_timeout` does). A refused
        connection, an unknown host or a wrong password fail at once, so a wrong URL is
        reported without waiting out the retry deadline; Flink's restart strategy then
        decides when the task tries again.

        :raises StoreUnavailableError: the database cannot be reached, or the retries of a
            dropped connection are spent.
        """
        return run_with_retries(self._connect, is_transient=self._is_lost_while_connecting,
                                recover=lambda: None, policy=self.retry_policy,
                                what="connect", where=self.describe(),
                                on_retry=self._count_retry)

    def _translate_error(self, err: Exception) -> Exception | None:
        """A pyflink-ndb error for a driver error, or None to re-raise it unchanged."""
        return None

    # -- plumbing -------------------------------------------------------------------------
    def open(self, create: bool = True) -> None:
        """Connect, create missing tables (when `create`) and check their layout.

        :param create: False for readers (the CLI): nothing is created.
        :raises StoreUnavailableError: the database cannot be reached.
        :raises StateCompatibilityError: the tables are missing (`create` False), have
            another layout, or hold row format 1 (the message names `pyflink-ndb migrate`).
        """
        self._conn = self._open_connection()
        self._closed = False
        try:
            self.check_format()
        except StateCompatibilityError:
            self.close()
            raise
        if create:
            def ddl() -> None:
                for statement in self._ddl():
                    self._execute(statement)
                self._conn.commit()
            self._retry("create tables", ddl)
        try:
            self._query(f"SELECT key_group, state_id, ukey, version, chunk, tombstone, chunks, "
                        f"expires_at_ms, fmt, vbytes, vjson, kjson FROM {self.t_state} "
                        "WHERE 1 = 0")
            self._query(f"SELECT operator, owners, committed FROM {self.t_operators} "
                        "WHERE 1 = 0")
            self._query(f"SELECT branch_id, lineage FROM {self.t_branches} WHERE 1 = 0")
            self._query(f"SELECT operator, branch_id, epoch, status FROM {self.t_snapshots} "
                        "WHERE 1 = 0")
            self._query(f"SELECT state_id, format_version FROM {self.t_catalog} WHERE 1 = 0")
        except Exception as err:
            with contextlib.suppress(Exception):
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

    def fork(self) -> StateStore | None:
        """A second store of the same place and settings, connected on a connection of
        its own (the background writer's: a store object is not thread-safe), or None when
        the store cannot be opened twice (an in-memory SQLite).

        :raises StoreUnavailableError: the database cannot be reached.
        """
        twin = copy.copy(self)
        twin._conn = None
        twin.retries = 0
        twin.connect()
        return twin

    def __getstate__(self) -> dict[str, Any]:
        """A pickle (and a copy) of a store holds its place and settings, never its
        connection: the write process (:mod:`pyflink_ndb.stores.render_process`)
        unpickles the writer's store and connects it with :meth:`connect`. It keeps one
        connection per distinct pickle, so the pickle holds no counter either
        (:attr:`retries` is 0 in it)."""
        state = self.__dict__.copy()
        state["_conn"] = None
        state["_closed"] = True
        state["retries"] = 0
        state["on_reconnect"] = None
        return state

    def connect(self) -> None:
        """Connect without creating or checking tables (for `pyflink-ndb migrate`).

        :raises StoreUnavailableError: the database cannot be reached
            (:meth:`_open_connection`).
        """
        self._conn = self._open_connection()
        self._closed = False

    def check_format(self) -> None:
        """:raises StateCompatibilityError: the namespace holds row format 1."""
        if self._table_exists(self.t_legacy_epochs):
            raise StateCompatibilityError(
                f"Namespace {self.namespace!r} in {self.describe()} holds pyflink-ndb row "
                "format 1 (it has the table "
                f"{self.t_legacy_epochs}); this version reads format {FORMAT_VERSION}. "
                f"Convert it once with: pyflink-ndb migrate --url URL --namespace "
                f"{self.namespace} (no job may run on it meanwhile), or use a new "
                "state.backend.ndb.namespace.")

    def all_tables(self) -> tuple[str, ...]:
        return (self.t_state, self.t_branches, self.t_snapshots, self.t_operators,
                self.t_catalog, self.t_legacy_epochs, f"{self.t_state}_v1")

    def drop_tables(self) -> None:
        """Drop the namespace's tables: all its state, history and catalog, for good.

        :raises StoreUnavailableError: the database cannot be reached.
        """
        if self._conn is None:
            self._conn = self._open_connection()

        def drop() -> None:
            for table in self.all_tables():
                self._execute(f"DROP TABLE IF EXISTS {table}")
            self._conn.commit()
        self._retry("drop tables", drop)

    def check_connection(self) -> str:
        """Connect once and disconnect; returns :meth:`describe` (for `doctor`).

        :raises StoreUnavailableError: the database cannot be reached.
        """
        self._conn = self._open_connection()
        try:
            return self.describe()
        finally:
            self.close()

    def close(self) -> None:
        conn = self._conn
        self._conn = None
        self._closed = True
        if conn is not None:
            with contextlib.suppress(Exception):  # the driver may have closed it already
                conn.close()

    def interrupt(self) -> None:
        """Close the store from another thread, ending a statement that is in flight on
        its connection now instead of when the server answers (a cancelled subtask's
        close, :meth:`BackgroundWriter.close`: Flink deploys the next attempt only once
        the cancelled one has closed). The thread that runs the statement gets the
        driver's error, which is no longer retried (the store is closed); a transaction
        in flight is rolled back by the server when it sees the connection go. Call
        :meth:`close` after, from any thread. The base store only marks itself closed:
        its statements run to their end (SQLite's are local and short)."""
        self._closed = True

    def server_thread(self) -> int | None:
        """The database server's id of this store's connection (MySQL's `CONNECTION_ID()`),
        or None: not connected, or an engine without one (SQLite)."""
        return None

    def kill_connection(self, server_thread: int) -> None:
        """Have the server end its connection `server_thread` and the statement it runs
        (an abandoned connection: this store's after :meth:`interrupt`, or another
        process's, the stopped write process's, :mod:`render_process`), without waiting
        for it. The base store does nothing (SQLite's statements are local)."""
        return None

    def _retry_pause(self, seconds: float) -> None:
        """The pause between two tries of :meth:`_retry`, cut short when the store is
        closed or interrupted meanwhile (:meth:`interrupt`: a closing subtask's writer
        then stops at once instead of after the pause and one more try)."""
        end = time.monotonic() + seconds
        while not self._closed:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.01))

    def _reconnect(self) -> None:
        old, self._conn = self._conn, None
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
        self._connect_again()

    def _connect_again(self) -> None:
        """A new connection for the retries of :meth:`_retry`, then :attr:`on_reconnect`."""
        self._conn = self._connect()
        if self.on_reconnect is not None:
            self.on_reconnect()

    def _sql(self, text: str) -> str:
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def _execute(self, text: str, params: Sequence[Any] = ()) -> Any:
        cur = self._conn.cursor()
        cur.execute(self._sql(text), tuple(params))
        return cur

    def _executemany(self, text: str, rows: Sequence[Sequence[Any]]) -> None:
        self._conn.cursor().executemany(self._sql(text), rows)

    def _versions_clause(self, part: Sequence[Any]) -> tuple[str, list[Any]]:
        """(WHERE clause, parameters) naming exactly the versions of `part` (each with
        `key_group`, `state_id`, `ukey`, `version`): OR-ed primary keys."""
        clause = " OR ".join("(key_group = ? AND state_id = ? AND ukey = ? AND version = ?)"
                             for _ in part)
        params: list[Any] = []
        for d in part:
            params += [d.key_group, d.state_id, d.ukey, d.version]
        return clause, params

    def _replace_state_rows(self, replace_into: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Run `replace_into` (`REPLACE INTO <state table> (...) VALUES `) for `rows` (the
        12 state-table columns of :meth:`_row_params`), inside the caller's transaction.
        Here: the driver's parameterised executemany."""
        self._executemany(replace_into + "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

    def _query(self, text: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return list(self._execute(text, params).fetchall())

    def _count_retry(self, attempt: int, err: BaseException, delay_ms: float) -> None:
        self.retries += 1

    def _retry(self, what: str, unit: Callable[[], T]) -> T:
        """Run one idempotent unit of work, retried on transient faults.

        :raises StoreUnavailableError: retries spent, or the database is unreachable.
        """
        def closed() -> StoreUnavailableError:
            return StoreUnavailableError(f"The store {self.describe()} is closed.")

        if self._closed:
            raise closed()

        def first_connect_then(unit: Callable[[], T] = unit) -> T:
            if self._closed:  # interrupted (closed) between two tries: no next one
                raise closed()
            if self._conn is None:  # a reconnect failed when the last retries ran out
                self._connect_again()
            return unit()

        def recover() -> None:
            if self._closed:  # a closed store opens no new connection
                raise closed()
            self._reconnect()
        try:
            return run_with_retries(first_connect_then,
                                    # an interrupted (closed) store's errors are final
                                    is_transient=lambda e: not self._closed
                                    and self._is_transient(e),
                                    recover=recover, policy=self.retry_policy,
                                    what=what, where=self.describe(),
                                    sleep=self._retry_pause, on_retry=self._count_retry)
        except StoreUnavailableError:
            raise
        except Exception as err:
            mapped = self._translate_error(err)
            if mapped is not None:
                raise mapped from err
            raise

    def _read(self, what: str, text: str, params: Sequence[Any] = ()
              ) -> list[tuple[Any, ...]]:
        return self._retry(what, lambda: self._query(text, params))

    def _txn(self, what: str, work: Callable[[], T], fence: Fence | None = None) -> T:
        """Run `work` in one transaction (after the fence check, when given), retried."""
        def unit() -> T:
            self._begin()
            try:
                if fence is not None:
                    self._check_fence(fence)
                out = work()
                self._conn.commit()
                return out
            except BaseException:
                with contextlib.suppress(Exception):
                    self._conn.rollback()
                raise
        return self._retry(what, unit)

    # -- fencing --------------------------------------------------------------------------
    def _check_fence(self, fence: Fence) -> None:
        """Inside a transaction: lock the owner row shared and check ownership.

        :raises FencedError: another attempt owns some of the fence's key groups.
        """
        rows = self._query(f"SELECT owners FROM {self.t_operators} WHERE operator = ?"
                           + self._lock_shared(), (fence.operator,))
        owners = owners_from_json(rows[0][0]) if rows else ()
        if not owns(owners, fence.kg_start, fence.kg_end, fence.branch):
            raise FencedError(
                f"Subtask attempt (branch {fence.branch}) of operator {fence.operator!r} no "
                f"longer owns key groups {fence.kg_start}-{fence.kg_end}: a newer attempt "
                f"claimed them (owners now: {owners_to_json(owners)}). This attempt was "
                "replaced by Flink and must stop; nothing it writes from now on is state.")

    # -- catalog --------------------------------------------------------------------------
    def register_state(self, operator: str, name: str, kind: str, serializer: str,
                       ttl_ms: int | None) -> int:
        """Record a state declaration and return its state id.

        :raises StateCompatibilityError: the state exists with another kind, serializer,
            format version, or with TTL switched on/off (as Flink's compatibility check).
        """
        state_id = state_id_for(operator, name)

        def insert() -> list[tuple[Any, ...]]:
            self._execute(
                f"{self._insert_ignore()} INTO {self.t_catalog} (state_id, operator, "
                "state_name, state_kind, serializer, ttl_ms, format_version) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (state_id, operator, name, kind, serializer, ttl_ms, FORMAT_VERSION))
            return self._query(
                f"SELECT operator, state_name, state_kind, serializer, ttl_ms, format_version "
                f"FROM {self.t_catalog} WHERE state_id = ?", (state_id,))
        rows = self._txn("register state", insert)
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
            self._txn("update TTL", lambda: self._execute(
                f"UPDATE {self.t_catalog} SET ttl_ms = ? WHERE state_id = ?",
                (ttl_ms, state_id)))
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
        return [dict(zip(cols, row, strict=True))
                for row in self._read("read catalog", sql + " ORDER BY state_id", params)]

    def state_ids(self, operator: str) -> list[int]:
        return [row["state_id"] for row in self.catalog(operator)]

    # -- reads ----------------------------------------------------------------------------
    def _join_chunks(self, key_group: int, state_id: int, ukey: bytes, version: int,
                     first: bytes | None, chunks: int) -> bytes | None:
        if chunks <= 1:
            return None if first is None else bytes(first)
        rows = self._query(
            f"SELECT chunk, vbytes FROM {self.t_state} WHERE key_group = ? AND state_id = ? "
            "AND ukey = ? AND version = ? AND chunk < ? ORDER BY chunk",
            (key_group, state_id, ukey, version, chunks))
        parts = [bytes(v) for c, v in rows]
        if len(parts) != chunks:
            raise StateCompatibilityError(
                f"Stored value of version {version} has {len(parts)} of {chunks} chunks.")
        return b"".join(parts)

    def _stored_version(self, key_group: int, state_id: int, ukey: bytes, version: Any,
                        tomb: Any, chunks: Any, expires: Any, first: Any) -> StoredVersion:
        """The :class:`StoredVersion` of a row read at chunk 0 (its value joined from
        every chunk; none for a tombstone)."""
        value = None if tomb else self._join_chunks(key_group, state_id, ukey, version,
                                                     first, chunks)
        return StoredVersion(int(version), bool(tomb), value,
                             None if expires is None else int(expires))

    def read_latest(self, state_id: int, key_group: int, ukey: bytes,
                    ranges: Ranges) -> StoredVersion | None:
        """The newest version of an entry inside `ranges` (what one branch or snapshot
        sees), or None."""
        where, vparams = visible("version", ranges)
        sql = (f"SELECT version, tombstone, chunks, expires_at_ms, vbytes FROM {self.t_state}"
               f"{self._point_index()} WHERE key_group = ? AND state_id = ? AND ukey = ? AND "
               f"chunk = 0 AND {where} ORDER BY version DESC LIMIT 1")

        def unit() -> StoredVersion | None:
            rows = self._query(sql, [key_group, state_id, ukey, *vparams])
            if not rows:
                return None
            return self._stored_version(key_group, state_id, ukey, *rows[0])
        return self._retry("read", unit)

    def read_latest_many(self, state_id: int, key_group: int, ukeys: Sequence[bytes],
                         ranges: Ranges) -> dict[bytes, StoredVersion]:
        """:meth:`read_latest` of several entries of one key group in one query per
        :attr:`max_or_terms` keys (the segments of a list that miss together); entries
        without a visible version are absent from the result."""
        where, vparams = visible("version", ranges)
        out: dict[bytes, StoredVersion] = {}
        for start in range(0, len(ukeys), self.max_or_terms):
            part = list(ukeys[start:start + self.max_or_terms])
            marks = ", ".join("?" for _ in part)
            sql = (f"SELECT ukey, version, tombstone, chunks, expires_at_ms, vbytes FROM "
                   f"{self.t_state}{self._point_index()} WHERE key_group = ? AND state_id = ? "
                   f"AND ukey IN ({marks}) "
                   f"AND chunk = 0 AND {where} ORDER BY ukey, version DESC")

            def unit(part: list[bytes] = part, sql: str = sql) -> dict[bytes, StoredVersion]:
                found: dict[bytes, StoredVersion] = {}
                for ukey, version, tomb, chunks, expires, vbytes in self._query(
                        sql, [key_group, state_id, *part, *vparams]):
                    ukey = bytes(ukey)
                    if ukey in found:
                        continue  # an older version of an entry already read
                    found[ukey] = self._stored_version(key_group, state_id, ukey, version,
                                                       tomb, chunks, expires, vbytes)
                return found
            out.update(self._retry("read", unit))
        return out

    def _latest_select(self, where: str) -> str:
        """The newest visible version of one entry (key group, state id, ukey are the
        parameters), with its state id and ukey: one member of :meth:`read_latest_batch`'s
        UNION ALL."""
        return (f"SELECT state_id, ukey, version, tombstone, chunks, expires_at_ms, vbytes "
                f"FROM {self.t_state}{self._point_index()} WHERE key_group = ? AND "
                "state_id = ? AND ukey = ? "
                f"AND chunk = 0 AND {where} ORDER BY version DESC LIMIT 1")

    def _latest_arm(self, where: str) -> str:
        """:meth:`_latest_select` as a UNION member: a derived table, because SQLite
        accepts ORDER BY and LIMIT in a compound member only there (MySQL and NDB accept it
        too; the MySQL store uses the parenthesised form, which MariaDB plans without a
        temporary table)."""
        return f"SELECT * FROM ({self._latest_select(where)}) r"

    def read_latest_batch(self, entries: Sequence[tuple[int, int, bytes]],
                          ranges_of: Callable[[int], Ranges]
                          ) -> dict[tuple[int, bytes], StoredVersion]:
        """:meth:`read_latest` of several entries of any states and key groups (the keys of
        a read-ahead bundle) in one query per :attr:`max_or_terms` entries: a UNION ALL of
        primary-key reads, each planned like :meth:`read_latest`'s (one index lookup).

        :param entries: (state id, key group, ukey) triples.
        :param ranges_of: the version ranges the branch sees in a key group.
        :returns: the newest visible version by (state id, ukey); entries without one are
            absent (tombstones are included).
        """
        out: dict[tuple[int, bytes], StoredVersion] = {}
        for start in range(0, len(entries), self.max_or_terms):
            part = entries[start:start + self.max_or_terms]
            arms: list[str] = []
            params: list[Any] = []
            for state_id, key_group, ukey in part:
                where, vparams = visible("version", ranges_of(key_group))
                arms.append(self._latest_arm(where))
                params += [key_group, state_id, ukey, *vparams]
            sql = " UNION ALL ".join(arms)
            groups = {(state_id, ukey): key_group for state_id, key_group, ukey in part}

            def unit(sql: str = sql, params: list[Any] = params,
                     groups: dict[tuple[int, bytes], int] = groups
                     ) -> dict[tuple[int, bytes], StoredVersion]:
                found: dict[tuple[int, bytes], StoredVersion] = {}
                for state_id, ukey, *row in self._query(sql, params):
                    eid = (int(state_id), bytes(ukey))
                    found[eid] = self._stored_version(groups[eid], *eid, *row)
                return found
            out.update(self._retry("read", unit))
        return out

    def scan_latest(self, state_id: int, key_group: int, prefix: bytes, after: bytes | None,
                    limit: int, ranges: Ranges) -> list[tuple[bytes, StoredVersion]]:
        """One page of the newest visible versions of the entries whose user key starts
        with `prefix`, in user-key order, strictly after `after`; tombstones included.

        At most `limit` entries; a shorter page means the scan is complete.
        """
        upper = prefix_upper_bound(prefix)
        outer, oparams = visible("s.version", ranges)
        inner, iparams = visible("t.version", ranges)
        sql = (f"SELECT s.ukey, s.version, s.tombstone, s.chunks, s.expires_at_ms, s.vbytes "
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
        sql += (f" AND {outer} AND s.version = (SELECT MAX(t.version) FROM {self.t_state} t "
                "WHERE t.key_group = s.key_group AND t.state_id = s.state_id AND "
                f"t.ukey = s.ukey AND t.chunk = 0 AND {inner}) ORDER BY s.ukey LIMIT ?")
        params += [*oparams, *iparams, limit]

        def unit() -> list[tuple[bytes, StoredVersion]]:
            out = []
            for ukey, *row in self._query(sql, params):
                ukey = bytes(ukey)
                out.append((ukey, self._stored_version(key_group, state_id, ukey, *row)))
            return out
        return self._retry("scan", unit)

    def scan_key_groups(self, state_ids: Sequence[int], kg_start: int, kg_end: int,
                        ranges_of: Callable[[int], Ranges], page_rows: int = 1000
                        ) -> Iterator[tuple[int, int, bytes, StoredVersion]]:
        """Newest visible versions of every entry of `state_ids` in key groups
        `kg_start..kg_end` (inclusive; `ranges_of(key_group)` gives what is visible),
        paged by `page_rows` (for eager restore). Tombstones included."""
        for state_id in state_ids:
            for key_group in range(kg_start, kg_end + 1):
                ranges = ranges_of(key_group)
                after: bytes | None = None
                while True:
                    page = self.scan_latest(state_id, key_group, b"", after, page_rows, ranges)
                    for ukey, version in page:
                        yield state_id, key_group, ukey, version
                    if len(page) < page_rows:
                        break
                    after = page[-1][0]

    def scan_versions(self, state_ids: Sequence[int],
                      after: tuple[int, int, bytes, int] | None, limit: int
                      ) -> list[tuple[int, int, bytes, int, bool]]:
        """(key_group, state_id, ukey, version, tombstone) of at most `limit` stored
        versions of `state_ids`, in primary-key order, strictly after `after` (the
        offline garbage collection's full scan)."""
        if not state_ids:
            return []
        marks = ", ".join("?" for _ in state_ids)
        where = f"chunk = 0 AND state_id IN ({marks})"
        params: list[Any] = list(state_ids)
        if after is not None:
            kg, sid, ukey, version = after
            where += (" AND (key_group > ? OR (key_group = ? AND (state_id > ? OR (state_id = ? "
                      "AND (ukey > ? OR (ukey = ? AND version > ?))))))")
            params += [kg, kg, sid, sid, ukey, ukey, version]
        rows = self._read("scan versions", f"SELECT key_group, state_id, ukey, version, "
                          f"tombstone FROM {self.t_state} WHERE {where} ORDER BY key_group, "
                          "state_id, ukey, version LIMIT ?", [*params, limit])
        return [(int(kg), int(sid), bytes(u), int(v), bool(t)) for kg, sid, u, v, t in rows]

    def read_versions(self, refs: Sequence[tuple[int, int, bytes]]
                      ) -> dict[tuple[int, int, bytes], list[tuple[int, bool]]]:
        """Every stored version (with its tombstone flag) of each entry, ascending; batched
        by `write.batch-size` entries per query."""
        out: dict[tuple[int, int, bytes], list[tuple[int, bool]]] = {r: [] for r in refs}
        step = min(self.write_batch_rows, self.max_or_terms)
        for start in range(0, len(refs), step):
            rows = self._read("read versions", *self._versions_query(refs[start:start + step]))
            for kg, sid, ukey, version, tomb in rows:
                out[(int(kg), int(sid), bytes(ukey))].append((int(version), bool(tomb)))
        return out

    def _versions_query(self, part: Sequence[tuple[int, int, bytes]]
                        ) -> tuple[str, list[Any]]:
        """(SQL, parameters) of one batch of :meth:`read_versions`: `key_group, state_id,
        ukey, version, tombstone` of every chunk-0 version of the entries `part` names (each
        once), ascending by version."""
        clause = " OR ".join("(key_group = ? AND state_id = ? AND ukey = ?)" for _ in part)
        params: list[Any] = []
        for kg, sid, ukey in part:
            params += [kg, sid, ukey]
        return (f"SELECT key_group, state_id, ukey, version, tombstone FROM {self.t_state} "
                f"WHERE chunk = 0 AND ({clause}) ORDER BY version", params)

    def scan_entries(self, state_id: int, kg_start: int, kg_end: int, lo: int, hi: int,
                     after: tuple[int, int, bytes] | None, limit: int
                     ) -> list[tuple[int, int, bytes]]:
        """(version, key_group, ukey) of at most `limit` rows of one state in key groups
        `kg_start..kg_end` with `lo <= version <= hi`, in that order, strictly after
        `after`: the entries an earlier attempt wrote (for garbage collection), through the
        `(state_id, version, key_group)` index."""
        where = ("state_id = ? AND chunk = 0 AND version BETWEEN ? AND ? AND key_group "
                 "BETWEEN ? AND ?")
        params: list[Any] = [state_id, lo, hi, kg_start, kg_end]
        if after is not None:
            where += (" AND (version > ? OR (version = ? AND (key_group > ? OR (key_group = ? "
                      "AND ukey > ?))))")
            params += [after[0], after[0], after[1], after[1], after[2]]
        rows = self._read("scan entries", f"SELECT version, key_group, ukey FROM {self.t_state}"
                          f"{self._cleanup_index()} WHERE {where} ORDER BY version, key_group, "
                          "ukey LIMIT ?", [*params, limit])
        return [(int(v), int(kg), bytes(u)) for v, kg, u in rows]

    # -- writes ---------------------------------------------------------------------------
    def _row_params(self, version: int, row: WriteRow) -> Iterable[tuple[Any, ...]]:
        return row_params(version, row)

    @staticmethod
    def check_sizes(rows: Iterable[WriteRow], value_max_bytes: int | None,
                    what: str) -> None:
        """:raises ValueTooLargeError: a key over :data:`MAX_UKEY_BYTES` or a value over
        `value_max_bytes` (None: no limit)."""
        for row in rows:
            if len(row.ukey) > MAX_UKEY_BYTES:
                raise ValueTooLargeError(
                    f"An encoded key of {len(row.ukey)} bytes (state id {row.state_id}) "
                    f"exceeds the limit of {MAX_UKEY_BYTES} bytes (primary-key size of "
                    f"InnoDB/NDB); {what} wrote nothing. Use a shorter key.")
            if (value_max_bytes is not None and row.value is not None
                    and len(row.value) > value_max_bytes):
                raise ValueTooLargeError(
                    f"A value of {len(row.value)} bytes (state id {row.state_id}) exceeds "
                    f"state.backend.ndb.value.max-bytes={value_max_bytes}; {what} "
                    "wrote nothing. Store smaller values or raise the limit.")

    def write_versions(self, fence: Fence, version: int, rows: Iterable[WriteRow],
                       value_max_bytes: int | None = None,
                       between: Callable[[], None] | None = None,
                       rendered: Iterable[Sequence[bytes]] | None = None) -> int:
        """Write entries as `version` (idempotent upserts), fenced, and commit.

        Every row is checked first (:meth:`check_sizes`) before anything is written. Rows
        go in transactions of at most `write_batch_rows` rows and :data:`MAX_BATCH_BYTES`
        bytes, each of which first checks the fence; each transaction is sent as soon as
        its rows are rendered (the epoch's rendered rows are never all held at once).
        Returns the number of database rows written; returns only when every row is
        committed. `between()` is called before each transaction (the background
        writer's cancellation point; it may raise).

        `rendered` (stores with :attr:`renders_literals` only): per row of `rows`, in
        order, its database rows already rendered as SQL literals (:func:`row_params` and
        `render_state_row`, by the render process), consumed as the rows are written (an
        iterator lets the render process render the next rows meanwhile); None: rendered
        here. A rendered row counts half its characters against :data:`MAX_BATCH_BYTES`
        (hex literals).

        :raises FencedError: the branch no longer owns its key groups.
        :raises ValueTooLargeError: see :meth:`check_sizes`.
        :raises StoreUnavailableError: retries spent.
        :raises ValueError: `rendered` has fewer or more rows than `rows`.
        """
        written = 0
        for batch in self.version_batches(version, rows, value_max_bytes, rendered):
            written += self.write_batch(fence, batch, between)
        return written

    def version_batches(self, version: int, rows: Iterable[WriteRow],
                        value_max_bytes: int | None = None,
                        rendered: Iterable[Sequence[bytes]] | None = None
                        ) -> Iterator[list[Any]]:
        """The transactions of :meth:`write_versions`, in order, for :meth:`write_batch`:
        each a list of at most `write_batch_rows` rows and :data:`MAX_BATCH_BYTES` bytes
        (one list for all when the store does not commit each batch). Every row is
        checked (:meth:`check_sizes`) before the first batch is produced; `rendered` as
        for :meth:`write_versions`, consumed as the batches are taken.

        :raises ValueTooLargeError: see :meth:`check_sizes`.
        :raises ValueError: `rendered` has fewer or more rows than `rows`.
        """
        if not isinstance(rows, Sequence):
            rows = list(rows)  # checked in full before the first write
        self.check_sizes(rows, value_max_bytes, f"version {version}")
        if rendered is not None and not self.renders_literals:
            raise TypeError(f"{type(self).__name__} does not take rows rendered as literals")
        literals = None if rendered is None else iter(rendered)
        batch: list[Any] = []
        batch_bytes = 0
        for row in rows:
            items: Iterable[Any]
            if literals is None:
                items = self._row_params(version, row)
            else:
                items = next(literals, None)  # type: ignore[arg-type]
                if items is None:
                    raise ValueError(f"version {version}: fewer rendered rows than rows")
            for params in items:
                size = (len(params) // 2 if literals is not None else
                        len(params[2]) + len(params[9] or b"") + len(params[10] or "")
                        + len(params[11] or ""))
                if batch and self.commit_each_batch and (
                        len(batch) >= self.write_batch_rows
                        or batch_bytes + size > MAX_BATCH_BYTES):
                    yield batch
                    batch = []
                    batch_bytes = 0
                batch.append(params)
                batch_bytes += size
        if literals is not None and next(literals, None) is not None:
            raise ValueError(f"version {version}: more rendered rows than rows")
        if batch:
            yield batch

    def write_batch(self, fence: Fence, batch: list[Any],
                    between: Callable[[], None] | None = None) -> int:
        """One fenced transaction of :meth:`write_versions` (a batch of
        :meth:`version_batches`), in statements of at most `write_batch_rows` rows;
        returns the rows written. `between()` is called first (it may raise).

        :raises FencedError, StoreUnavailableError: as :meth:`write_versions`."""
        if between is not None:
            between()
        sql = (f"REPLACE INTO {self.t_state} (key_group, state_id, ukey, version, chunk, "
               "tombstone, chunks, expires_at_ms, fmt, vbytes, vjson, kjson) VALUES ")

        def work() -> None:
            for start in range(0, len(batch), self.write_batch_rows):
                self._replace_state_rows(sql, batch[start:start + self.write_batch_rows])
        self._txn("write versions", work, fence)
        return len(batch)

    def delete_exact(self, fence: Fence | None, deletions: Sequence[Any]) -> int:
        """Delete whole versions: each deletion names (key_group, state_id, ukey, version);
        statements of at most `write.batch-size` (and :attr:`max_or_terms`) versions and
        :attr:`delete_limit_rows` rows (chunks), fenced (None: not fenced, for the
        offline garbage collection of `pyflink-ndb gc`, which decides safely without).
        With `commit_each_batch` each statement is its own transaction (NDB); otherwise
        all go in one (SQLite, where every commit costs milliseconds)."""
        step = min(self.write_batch_rows, self.max_or_terms)
        parts = [deletions[start:start + step] for start in range(0, len(deletions), step)]

        def run(todo: Sequence[Sequence[Any]]) -> int:
            total = 0
            for part in todo:
                while True:
                    n = self._delete_versions(part, self.delete_limit_rows)
                    total += n
                    if n < self.delete_limit_rows:
                        break
            return total
        if not parts:
            return 0
        if not self.commit_each_batch:
            return self._txn("delete versions", lambda: run(parts), fence)
        total = 0
        for part in parts:
            def one(part: Sequence[Any] = part) -> int:
                return run([part])
            total += self._txn("delete versions", one, fence)
        return total

    def _delete_versions(self, part: Sequence[Any], limit: int) -> int:
        """One statement of :meth:`delete_exact`: delete at most `limit` rows (chunks) of
        the versions `part` names; returns the rows deleted (the caller repeats it while
        that is `limit`)."""
        clause, params = self._versions_clause(part)
        return self._delete_limited(self.t_state, clause, params, limit)

    def delete_range(self, fence: Fence, state_id: int, kg_start: int, kg_end: int, lo: int,
                     hi: int, limit: int) -> int:
        """Delete at most `limit` rows of one state in key groups `kg_start..kg_end` with
        `lo <= version <= hi` (background cleanup of abandoned versions), fenced; returns
        rows deleted. The rows are found through the `(state_id, version, key_group)`
        index (so a statement touches only rows of that version range) and deleted by
        primary key."""
        def unit() -> int:
            rows = self._query(
                f"SELECT key_group, state_id, ukey, version, chunk FROM {self.t_state}"
                f"{self._cleanup_index()} WHERE state_id = ? AND version BETWEEN ? AND ? "
                "AND key_group BETWEEN ? AND ? LIMIT ?",
                (state_id, lo, hi, kg_start, kg_end, limit))
            deleted = 0
            for start in range(0, len(rows), self.max_or_terms):
                deleted += self._delete_rows(rows[start:start + self.max_or_terms])
            return deleted
        return self._txn("clean up", unit, fence)

    def _delete_rows(self, rows: Sequence[tuple[Any, ...]]) -> int:
        """Delete the state-table rows named by their whole primary key (key_group,
        state_id, ukey, version, chunk); returns the rows deleted."""
        clause = " OR ".join("(key_group = ? AND state_id = ? AND ukey = ? AND version = ? "
                             "AND chunk = ?)" for _ in rows)
        return max(self._execute(f"DELETE FROM {self.t_state} WHERE {clause}",
                                 [v for r in rows for v in r]).rowcount, 0)

    def delete_expired(self, fence: Fence, state_ids: Sequence[int], kg_start: int,
                       kg_end: int, ranges: Ranges, now: int) -> int:
        """Delete the visible versions whose TTL expired before `now` (ms since the Unix
        epoch) in key groups `kg_start..kg_end` that all see `ranges`.

        A version is deleted only when no older visible version of its entry is still live,
        so an older value can never re-appear (it could after a TTL was shortened). Work
        goes in batches of `write.batch-size` versions.
        """
        if not state_ids:
            return 0
        marks = ", ".join("?" for _ in state_ids)
        svis, sparams = visible("s.version", ranges)
        tvis, tparams = visible("t.version", ranges)
        sql = (f"SELECT s.key_group, s.state_id, s.ukey, s.version FROM {self.t_state} s "
               "WHERE s.chunk = 0 AND s.expires_at_ms IS NOT NULL AND s.expires_at_ms < ? "
               f"AND s.key_group BETWEEN ? AND ? AND s.state_id IN ({marks}) AND {svis} "
               f"AND NOT EXISTS (SELECT 1 FROM {self.t_state} t WHERE t.key_group = "
               "s.key_group AND t.state_id = s.state_id AND t.ukey = s.ukey AND "
               f"t.version < s.version AND {tvis} AND t.chunk = 0 AND t.tombstone = 0 AND "
               "(t.expires_at_ms IS NULL OR t.expires_at_ms >= ?)) LIMIT ?")
        total = 0
        while True:
            rows = self._read("find expired", sql, (now, kg_start, kg_end, *state_ids,
                                                     *sparams, *tparams, now,
                                                     self.write_batch_rows))
            if not rows:
                return total
            total += self.delete_exact(fence, [Deletion(int(kg), int(sid), bytes(ukey),
                                                        int(version))
                                               for kg, sid, ukey, version in rows])
            if len(rows) < self.write_batch_rows:
                return total

    # -- branches -------------------------------------------------------------------------
    def allocate_branch(self, operator: str, kg_start: int, kg_end: int, lineage_json: str,
                        origin: dict[str, Any], job_id: str, subtask: int,
                        attempt: int) -> int:
        """A new branch id, larger than every existing one (`MAX + 1` under the primary
        key, retried on a duplicate: NDB's AUTO_INCREMENT is not monotonic across MySQL
        servers), in a transaction of its own. A subtask's open allocates its branch
        inside its claim instead (:meth:`claim_new_branch`).

        :raises StoreUnavailableError: 100 tries found the id taken (heavy contention).
        """
        origin_json = json.dumps(origin, separators=(",", ":"))
        for _ in range(BRANCH_ID_TRIES):
            with contextlib.suppress(_BranchIdTaken):
                return self._txn("allocate branch", lambda: self._insert_branch(
                    operator, kg_start, kg_end, lineage_json, origin_json, job_id, subtask,
                    attempt))
        raise self._branch_contention()

    def _insert_branch(self, operator: str, kg_start: int, kg_end: int, lineage_json: str,
                       origin_json: str, job_id: str, subtask: int, attempt: int) -> int:
        """Inside a transaction: insert a branch row with id `MAX + 1` and return the id.

        :raises _BranchIdTaken: another session inserted that id meanwhile (the insert
            inserted nothing, or the engine reported the duplicate key, as NDB may for an
            id another transaction inserted and had not committed when this one looked):
            roll back and try again in a new transaction.
        """
        rows = self._query(f"SELECT MAX(branch_id) FROM {self.t_branches}")
        branch = int(rows[0][0] or 0) + 1
        try:
            cur = self._execute(
                f"{self._insert_ignore()} INTO {self.t_branches} (branch_id, operator, "
                "kg_start, kg_end, lineage, origin, job_id, subtask, attempt, created_ms) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (branch, operator, kg_start, kg_end, lineage_json, origin_json, job_id,
                 subtask, attempt, now_ms()))
        except Exception as err:
            if self._is_duplicate_key(err):
                raise _BranchIdTaken from err
            raise
        if cur.rowcount != 1:
            raise _BranchIdTaken
        return branch

    def _is_duplicate_key(self, err: BaseException) -> bool:
        """True for the engine's duplicate-key error (a unique key's value exists)."""
        return False

    def _branch_contention(self) -> StoreUnavailableError:
        return StoreUnavailableError(f"Could not allocate a branch id in {self.describe()} "
                                     f"after {BRANCH_ID_TRIES} tries (heavy contention).")

    def load_branches(self, branch_ids: Iterable[int]) -> dict[int, BranchRow]:
        ids = sorted(set(branch_ids))
        out: dict[int, BranchRow] = {}
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            marks = ", ".join("?" for _ in part)
            for (bid, op, a, b, lineage, origin, job, sub, att, created) in self._read(
                    "read branches", f"SELECT branch_id, operator, kg_start, kg_end, lineage, "
                    f"origin, job_id, subtask, attempt, created_ms FROM {self.t_branches} "
                    f"WHERE branch_id IN ({marks})", part):
                out[int(bid)] = BranchRow(Lineage.from_json(int(bid), int(a), int(b), lineage),
                                          op, origin, job, int(sub), int(att), int(created))
        return out

    def branch_origins(self, operator: str, branch_ids: Iterable[int] | None = None
                       ) -> dict[int, BranchOrigin]:
        """Per branch of `operator` (or of `branch_ids` only), what a restore and
        retention need of its origin (:class:`BranchOrigin`). Reads the branch rows' job id
        and origin only (not their lineages)."""
        out: dict[int, BranchOrigin] = {}
        rows: list[tuple[Any, ...]]
        if branch_ids is None:
            rows = self._read(
                "read branch origins", f"SELECT branch_id, job_id, origin FROM "
                f"{self.t_branches} WHERE operator = ?", (operator,))
        else:
            ids = sorted(set(branch_ids))
            rows = []
            for start in range(0, len(ids), 500):
                part = ids[start:start + 500]
                rows += self._read(
                    "read branch origins", f"SELECT branch_id, job_id, origin FROM "
                    f"{self.t_branches} WHERE branch_id IN ({', '.join('?' for _ in part)})",
                    part)
        for bid, job, origin in rows:
            out[int(bid)] = BranchOrigin.parse(job, origin)
        return out

    def branches_of(self, operator: str) -> list[int]:
        return [int(b) for (b,) in self._read(
            "list branches", f"SELECT branch_id FROM {self.t_branches} WHERE operator = ? "
            "ORDER BY branch_id", (operator,))]

    def record_end(self, fence: Fence, savepoint_id: int) -> None:
        """Record in the fence's branch row that a stop-with-savepoint ended its subtask:
        `savepoint_id`, the synchronous savepoint that completed before the subtask closed
        normally (:attr:`BranchOrigin.ended`; the origin's `ended`), fenced. The listing
        then says that Flink deleted the run's checkpoints unless the job failed while
        stopping (:func:`stopped_runs`)."""
        def work() -> None:
            rows = self._query(f"SELECT origin FROM {self.t_branches} WHERE branch_id = ?",
                               (fence.branch,))
            if not rows:
                return
            origin = json.loads(rows[0][0] or "{}")
            origin["ended"] = int(savepoint_id)
            self._execute(f"UPDATE {self.t_branches} SET origin = ? WHERE branch_id = ?",
                          (json.dumps(origin, separators=(",", ":")), fence.branch))

        self._txn("record the stop", work, fence)

    # -- snapshots ------------------------------------------------------------------------
    def insert_snapshot(self, fence: Fence, epoch: int, kind: str, job_id: str) -> None:
        """Record the fence's snapshot at `epoch` as pending (idempotent), fenced."""
        self._txn("record snapshot", lambda: self._execute(
            f"{self._insert_ignore()} INTO {self.t_snapshots} (operator, branch_id, epoch, "
            "kind, status, kg_start, kg_end, created_ms, job_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (fence.operator, fence.branch, epoch, kind, PENDING, fence.kg_start,
             fence.kg_end, now_ms(), job_id)), fence)

    def mark_completed(self, operator: str, keys: Sequence[tuple[int, int]],
                       fence: Fence | None = None) -> None:
        """Mark snapshots (branch, epoch) completed."""
        if not keys:
            return

        self._txn("mark completed", lambda: self._set_completed(operator, keys), fence)

    def _set_completed(self, operator: str, keys: Iterable[tuple[int, int]]) -> None:
        """Inside a transaction: mark snapshots (branch, epoch) completed."""
        for branch, epoch in keys:
            self._execute(f"UPDATE {self.t_snapshots} SET status = ? WHERE operator = ? "
                          "AND branch_id = ? AND epoch = ?", (COMPLETED, operator, branch, epoch))

    def _snapshot_rows(self, operator: str | None) -> list[SnapshotRow]:
        sql = (f"SELECT operator, branch_id, epoch, kind, status, kg_start, kg_end, "
               f"created_ms, job_id FROM {self.t_snapshots}")
        params: tuple[Any, ...] = ()
        if operator is not None:
            sql += " WHERE operator = ?"
            params = (operator,)
        return [SnapshotRow(op, int(b), int(e), k, s, int(a), int(z), int(c), j)
                for op, b, e, k, s, a, z, c, j in self._query(
                    sql + " ORDER BY branch_id, epoch", params)]

    def list_snapshots(self, operator: str | None = None) -> list[SnapshotRow]:
        """The restorable snapshots (of one operator when given)."""
        return self._retry("list snapshots", lambda: self._snapshot_rows(operator))

    def delete_snapshots(self, operator: str, keys: Sequence[tuple[int, int]],
                         fence: Fence | None = None) -> int:
        """Forget snapshots (branch, epoch): they can no longer be restored and GC may
        reclaim what only they needed. Returns the rows deleted."""
        if not keys:
            return 0

        return self._txn("delete snapshots",
                         lambda: self._delete_snapshot_rows(operator, keys), fence)

    def _delete_snapshot_rows(self, operator: str, keys: Sequence[tuple[int, int]]) -> int:
        """Inside a transaction: delete the snapshot rows (branch, epoch) of `operator`."""
        total = 0
        for branch, epoch in keys:
            total += max(self._execute(
                f"DELETE FROM {self.t_snapshots} WHERE operator = ? AND branch_id = ? "
                "AND epoch = ?", (operator, branch, epoch)).rowcount, 0)
        return total

    # -- owner row ------------------------------------------------------------------------
    def read_operator(self, operator: str) -> OperatorRow | None:
        rows = self._read("read owner row", f"SELECT owners, committed FROM "
                          f"{self.t_operators} WHERE operator = ?", (operator,))
        if not rows:
            return None
        return OperatorRow(operator, owners_from_json(rows[0][0]),
                           Descriptor.from_json(rows[0][1]))

    def latest_committed_checkpoint(self, operator: str) -> int | None:
        """The checkpoint id that readers of `operator` see, or None before any."""
        row = self.read_operator(operator)
        return None if row is None or row.committed is None else row.committed.checkpoint_id

    def operators(self) -> list[OperatorRow]:
        return [OperatorRow(op, owners_from_json(o), Descriptor.from_json(c))
                for op, o, c in self._read("read owner rows", f"SELECT operator, owners, "
                                           f"committed FROM {self.t_operators} ORDER BY operator")]

    def _lock_operator(self, operator: str) -> tuple[OwnerMap, Descriptor | None]:
        """Inside a transaction: lock the owner row exclusively (created when missing).

        The row is locked first and inserted only when it does not exist: an `INSERT
        IGNORE` of an existing row takes a shared lock, and two sessions that then both ask
        for the exclusive one deadlock (InnoDB error 1213; every two subtasks completing
        the same checkpoint did, found by the fault injection of tests/faults)."""
        select = (f"SELECT owners, committed FROM {self.t_operators} WHERE operator = ?"
                  + self._lock_update())
        rows = self._query(select, (operator,))
        if not rows:
            self._execute(f"{self._insert_ignore()} INTO {self.t_operators} (operator, "
                          "owners, committed, committed_ckpt, fmt, updated_ms) VALUES "
                          "(?, ?, NULL, 0, ?, ?)", (operator, "[]", FORMAT_VERSION, now_ms()))
            rows = self._query(select, (operator,))
        return owners_from_json(rows[0][0]), Descriptor.from_json(rows[0][1])

    def _write_operator(self, operator: str, owners: OwnerMap,
                        committed: Descriptor | None) -> None:
        self._execute(f"UPDATE {self.t_operators} SET owners = ?, committed = ?, "
                      "committed_ckpt = ?, updated_ms = ? WHERE operator = ?",
                      (owners_to_json(owners), None if committed is None else
                       committed.to_json(), 0 if committed is None else
                       committed.checkpoint_id, now_ms(), operator))

    def claim(self, fence: Fence, restored: Descriptor | None, reset: bool = False,
              check: Callable[[list[SnapshotRow]], None] | None = None
              ) -> tuple[OwnerMap, Descriptor | None]:
        """Make the fence's branch the owner of its key groups (one transaction on the
        owner row, exclusively locked: in-flight writes of the old owner finish first,
        later ones fail their fence check).

        :param restored: the descriptor of the restored snapshot: becomes what readers see
            unless `committed` is already a snapshot of the attempts running now.
        :param reset: readers see nothing until a checkpoint completes (truncate).
        :param check: called with the operator's snapshot rows under the lock; an
            exception rolls the claim back (the restored snapshot must still exist). The
            restored snapshots are then marked completed in the same transaction (Flink
            restores only completed ones; their notification may have been lost).
        :returns: (the owners before the claim, committed after it).
        """
        def unit() -> tuple[OwnerMap, Descriptor | None]:
            before, committed = self._lock_operator(fence.operator)
            if check is not None:
                self._check_restored(fence.operator, restored, check,
                                     self._snapshot_rows(fence.operator))
            return before, self._take_key_groups(fence, before, committed, restored, reset)
        return self._txn("claim key groups", unit)

    def claim_new_branch(self, operator: str, kg_start: int, kg_end: int, lineage_json: str,
                         origin: dict[str, Any], job_id: str, subtask: int, attempt: int,
                         restored: Descriptor | None, reset: bool = False,
                         check: Callable[[list[SnapshotRow]], None] | None = None,
                         abandoned: Callable[[OwnerMap, int, list[SnapshotRow]],
                                             Sequence[tuple[int, int]]] | None = None
                         ) -> tuple[int, OwnerMap, Descriptor | None]:
        """A subtask attempt's open: :meth:`allocate_branch`, :meth:`claim` and
        :meth:`delete_snapshots` of the snapshots the claim abandons, in one transaction
        (one commit instead of three: each waits for the database's log flush, 10-40 ms
        apiece on a MariaDB still flushing the gigabyte a job just wrote, bench part 8).
        All or nothing: a failed check leaves no branch row behind either. (A commit
        whose acknowledgement is lost is tried again: that try allocates another branch,
        and the first one's row stays, unused, as with :meth:`allocate_branch`.)

        The owner row is locked before the branch id is chosen: two subtasks of one
        operator allocate one after the other; subtasks of other operators may take the
        same id meanwhile, and the transaction is then tried again whole.

        :param operator, kg_start, kg_end, lineage_json, origin, job_id, subtask, attempt:
            the branch row (:meth:`allocate_branch`).
        :param restored, reset, check: as :meth:`claim`.
        :param abandoned: called under the lock with (the owners before the claim, the new
            branch id, the operator's snapshot rows read under the lock); returns the
            snapshots (branch, epoch) to forget. None: none.
        :returns: (the new branch id, the owners before the claim, committed after it).
        :raises CheckpointError: from `check` (rolled back).
        :raises StoreUnavailableError: the database cannot be reached, or 100 tries found
            the branch id taken.
        """
        origin_json = json.dumps(origin, separators=(",", ":"))

        def unit() -> tuple[int, OwnerMap, Descriptor | None]:
            before, committed = self._lock_operator(operator)
            rows = (self._snapshot_rows(operator)
                    if check is not None or abandoned is not None else [])
            if check is not None:
                self._check_restored(operator, restored, check, rows)
            branch = self._insert_branch(operator, kg_start, kg_end, lineage_json,
                                         origin_json, job_id, subtask, attempt)
            fence = Fence(operator, branch, kg_start, kg_end)
            committed = self._take_key_groups(fence, before, committed, restored, reset)
            if abandoned is not None:
                self._delete_snapshot_rows(operator, abandoned(before, branch, rows))
            return branch, before, committed
        for _ in range(BRANCH_ID_TRIES):
            with contextlib.suppress(_BranchIdTaken):
                return self._txn("claim key groups", unit)
        raise self._branch_contention()

    def _check_restored(self, operator: str, restored: Descriptor | None,
                        check: Callable[[list[SnapshotRow]], None],
                        rows: list[SnapshotRow]) -> None:
        """Inside the claim's transaction, the owner row locked: run `check` on the
        operator's snapshot `rows` (read under the lock), then mark the restored snapshots
        completed."""
        check(rows)
        if restored is not None:
            self._set_completed(operator, [(t.branch, t.epoch) for t in restored.parts])

    def _take_key_groups(self, fence: Fence, before: OwnerMap, committed: Descriptor | None,
                         restored: Descriptor | None, reset: bool) -> Descriptor | None:
        """Inside the claim's transaction: write the owner row with the fence's branch
        owning its key groups; returns what readers see after it."""
        after = claim_owners(before, fence.kg_start, fence.kg_end, fence.branch)
        if reset and not is_current(committed, after):
            committed = None
        elif restored is not None and not is_current(committed, after):
            committed = restored
        self._write_operator(fence.operator, after, committed)
        return committed

    def advance_committed(self, fence: Fence, epoch: int) -> Descriptor | None:
        """Move what readers see to checkpoint `epoch` of the attempts running now, when
        every key group's owner has a snapshot at `epoch`; forward only.

        :returns: the new descriptor, or None when it did not move.
        :raises FencedError: the fence's branch no longer owns its key groups.
        """
        def unit() -> Descriptor | None:
            owners, committed = self._lock_operator(fence.operator)
            if not owns(owners, fence.kg_start, fence.kg_end, fence.branch):
                self._check_fence(fence)  # raises FencedError with the details
            if is_current(committed, owners) and committed is not None and all(
                    t.epoch >= epoch for t in committed.parts):
                return None
            branches = sorted({br for _, _, br in owners})
            marks = ", ".join("?" for _ in branches)
            have = {int(b) for (b,) in self._query(
                f"SELECT branch_id FROM {self.t_snapshots} WHERE operator = ? AND epoch = ? "
                f"AND branch_id IN ({marks})", (fence.operator, epoch, *branches))}
            if not set(branches) <= have:
                return None
            new = Descriptor(tuple(Token(br, epoch, a, b) for a, b, br in owners))
            self._write_operator(fence.operator, owners, new)
            return new
        return self._txn("advance committed", unit)

    # -- readers --------------------------------------------------------------------------
    def count_rows(self, state_ids: Sequence[int] | None = None) -> int:
        """Number of rows in the state table (of `state_ids` when given)."""
        if state_ids is None:
            return int(self._read("count", f"SELECT COUNT(*) FROM {self.t_state}")[0][0])
        if not state_ids:
            return 0
        marks = ", ".join("?" for _ in state_ids)
        return int(self._read("count", f"SELECT COUNT(*) FROM {self.t_state} WHERE "
                              f"state_id IN ({marks})", tuple(state_ids))[0][0])

    def committed_segments(self, descriptor: Descriptor
                           ) -> list[tuple[int, int, Ranges, Token]]:
        """(kg_start, kg_end, ranges, part) for each key-group segment of a descriptor:
        what a reader of that snapshot sees where."""
        branches = self.load_branches(t.branch for t in descriptor.parts)
        out = []
        for part in descriptor.parts:
            row = branches.get(part.branch)
            if row is None:
                raise StateCompatibilityError(f"Branch {part.branch} of the committed "
                                              "checkpoint is missing from the store.")
            for seg in row.lineage.segments:
                a, b = max(part.kg_start, seg.kg_start), min(part.kg_end, seg.kg_end)
                if a <= b:
                    out.append((a, b, row.lineage.at(a, part.epoch), part))
        return out

    def committed_sql(self, operator: str) -> tuple[str, list[Any]]:
        """A SELECT (and its parameters) of the committed state of `operator` as of now:
        the newest visible version per entry, tombstones and chunks > 0 left out. The
        version ranges are literals: valid until `committed` moves (see docs/protocol.md).

        :raises StateCompatibilityError: the operator has no completed checkpoint.
        """
        row = self.read_operator(operator)
        if row is None or row.committed is None:
            raise StateCompatibilityError(f"Operator {operator!r} has no completed "
                                          f"checkpoint in namespace {self.namespace!r}.")
        clauses, params = [], []
        for a, b, ranges, _ in self.committed_segments(row.committed):
            svis, sp = visible("s.version", ranges)
            tvis, tp = visible("t.version", ranges)
            clauses.append(f"(s.key_group BETWEEN ? AND ? AND {svis} AND s.version = ("
                           f"SELECT MAX(t.version) FROM {self.t_state} t WHERE t.key_group = "
                           "s.key_group AND t.state_id = s.state_id AND t.ukey = s.ukey AND "
                           f"t.chunk = 0 AND {tvis}))")
            params += [a, b, *sp, *tp]
        sql = (f"SELECT c.operator, c.state_name, s.key_group, s.ukey, s.kjson, s.version, "
               f"s.vjson, s.vbytes, s.chunks, s.expires_at_ms FROM {self.t_state} s JOIN "
               f"{self.t_catalog} c ON c.state_id = s.state_id WHERE c.operator = ? AND "
               "s.chunk = 0 AND s.tombstone = 0 AND (" + " OR ".join(clauses) + ")")
        return sql, [operator, *params]

    def iter_committed(self, operator: str, state_name: str | None = None,
                       page_rows: int = 1000) -> Iterator[dict[str, Any]]:
        """The committed entries of `operator` (of one state when given), paged in
        primary-key order, values joined from all their chunks. Only what is consumed is
        read. After each page the checkpoint being read is checked to be still retained
        (docs/protocol.md, P4).

        :raises StaleReadError: garbage collection overtook the read.
        """
        row = self.read_operator(operator)
        if row is None or row.committed is None:
            return
        states = {r["state_id"]: r["state_name"] for r in self.catalog(operator)
                  if state_name is None or r["state_name"] == state_name}
        if not states:
            return
        marks = ", ".join("?" for _ in states)
        cols = ("key_group", "state_id", "ukey", "kjson", "version", "vjson", "vbytes",
                "chunks", "expires_at_ms")
        for a, b, ranges, part in self.committed_segments(row.committed):
            svis, sp = visible("s.version", ranges)
            tvis, tp = visible("t.version", ranges)
            after: tuple[int, int, bytes] | None = None
            while True:
                cursor_sql, cursor_params = "", []
                if after is not None:
                    cursor_sql = (" AND (s.key_group > ? OR (s.key_group = ? AND (s.state_id "
                                  "> ? OR (s.state_id = ? AND s.ukey > ?))))")
                    cursor_params = [after[0], after[0], after[1], after[1], after[2]]
                rows = self._read(
                    "read committed",
                    f"SELECT s.key_group, s.state_id, s.ukey, s.kjson, s.version, s.vjson, "
                    f"s.vbytes, s.chunks, s.expires_at_ms FROM {self.t_state} s WHERE "
                    f"s.key_group BETWEEN ? AND ? AND s.state_id IN ({marks}) AND "
                    f"s.chunk = 0 AND s.tombstone = 0 AND {svis}{cursor_sql} AND s.version = "
                    f"(SELECT MAX(t.version) FROM {self.t_state} t WHERE t.key_group = "
                    "s.key_group AND t.state_id = s.state_id AND t.ukey = s.ukey AND "
                    f"t.chunk = 0 AND {tvis}) ORDER BY s.key_group, s.state_id, s.ukey "
                    "LIMIT ?", [a, b, *states, *sp, *cursor_params, *tp, page_rows])
                page = []
                for r in rows:
                    rec = dict(zip(cols, r, strict=True))
                    rec["ukey"] = bytes(rec["ukey"])
                    rec["operator"] = operator
                    rec["state_name"] = states[int(rec["state_id"])]
                    rec["checkpoint"] = part.epoch

                    def join(rec: dict[str, Any] = rec) -> bytes | None:
                        return self._join_chunks(int(rec["key_group"]), int(rec["state_id"]),
                                                 rec["ukey"], int(rec["version"]),
                                                 rec["vbytes"], int(rec["chunks"]))
                    rec["vbytes"] = self._retry("read chunks", join)
                    page.append(rec)
                # Read in full, then checked: what is yielded belongs to the checkpoint.
                self._check_still_restorable(operator, row.committed)
                yield from page
                if len(rows) < page_rows:
                    break
                last = rows[-1]
                after = (int(last[0]), int(last[1]), bytes(last[2]))

    def _check_still_restorable(self, operator: str, descriptor: Descriptor) -> None:
        """:raises StaleReadError: a snapshot of `descriptor` was subsumed meanwhile, so
        garbage collection may have removed versions the read still needs."""
        have = {(r.branch, r.epoch) for r in self.list_snapshots(operator)}
        missing = [t for t in descriptor.parts if (t.branch, t.epoch) not in have]
        if missing:
            raise StaleReadError(
                f"Checkpoint {descriptor.checkpoint_id} of operator {operator!r} was "
                "subsumed while it was being read (the job completed newer checkpoints and "
                "collected its versions): the entries read so far are exact, the read is "
                "incomplete. Read again, read less at a time (--limit), or raise "
                "state.backend.ndb.checkpoints.retained.")

    def query_committed(self, operator: str | None = None, state_name: str | None = None,
                        attempts: int = 3) -> list[dict[str, Any]]:
        """Every committed entry (of all operators, or one; of one state when given); a
        read overtaken by garbage collection is started again, at most `attempts` times.

        :raises StaleReadError: every attempt was overtaken.
        """
        ops = [operator] if operator is not None else [o.operator for o in self.operators()]
        out: list[dict[str, Any]] = []
        for op in ops:
            for attempt in range(attempts):
                try:
                    out.extend(list(self.iter_committed(op, state_name)))
                    break
                except StaleReadError:
                    if attempt == attempts - 1:
                        raise
        return out
