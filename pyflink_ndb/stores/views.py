"""SQL views of the committed state for any MySQL client (`pyflink-ndb views create`).

Per namespace `ns`, three views on the MySQL-protocol server (MariaDB 10.6+, MySQL 8.0+,
RonDB's MySQL server):

* `ns_committed_ranges`: per operator and key-group segment, the version ranges that the
  latest completed checkpoint (`ns_operators.committed`) sees, computed from that JSON
  descriptor and the branches' lineage (`ns_branches.lineage`) with `JSON_TABLE`;
* `ns_committed_rows`: the newest visible version of every stored entry row
  (tombstones, chunks > 0 and TTL-expired rows left out);
* `ns_committed`: one row per state and key — a map state one per map key (`mkey`), a
  list state one per list with its elements as one JSON array.

No helper table and nothing in the checkpoint protocol maintains them: they read the
owner rows, branch rows and state rows the job writes anyway, so they are exact at every
moment. Why a reader never sees a value of a checkpoint that has not completed:

* `committed` names completed checkpoints only and is one row per operator, written in
  one transaction with the claim or the completion that moves it (docs/protocol.md, P4);
  a branch's lineage never changes after the branch row is inserted. The ranges of a
  descriptor contain no version of a later, pending or aborted epoch of its branches.
* On InnoDB (MariaDB, MySQL) a SELECT is one consistent read: it sees `committed` and the
  state rows of one moment, so it returns exactly one completed checkpoint per operator,
  whatever garbage collection deletes meanwhile (the deleted rows stay in its snapshot).
* On NDB, READ COMMITTED reads each row's latest committed version, not one snapshot of
  the statement: a SELECT that runs while `committed` moves may show some entries at the
  previous completed checkpoint, or miss an entry that the move changed. Every value it
  returns is still the value of a completed checkpoint. Read with `pyflink-ndb scan` (it
  checks each page) where that matters.

Limits (documented in the README): `vjson` is NULL where the value has no JSON form
(bytes, NaN, deeper than 32 levels) or is larger than one chunk (256 KiB: read it with
`pyflink-ndb get`); `mkey` is decoded for scalar Flink keys (str, bytes, int, float,
bool, None) and str, int (up to 7 bytes), bool or None map keys, else NULL (`ukey` holds
the encoded bytes); a list's `vjson` is NULL when one of its segments has none or when the
concatenation exceeds `group_concat_max_len` (1 MiB by default on MariaDB, 1,024 bytes on
MySQL and RonDB: raise it for the session or globally); list elements expire per segment
(the segment's latest element) in the view, per element in `pyflink-ndb scan`; `kjson`
is NULL for a key whose JSON is longer than 768 characters where the state table has the
`kjson_key` index (below).

Point reads (README, "SQL views"; measured by bench part `reads`): none of the views has
a UNION, GROUP BY or DISTINCT, so the server merges them into the reading statement and
a condition on `key_group` and `ukey`, or on `kjson`, reaches an index of the state table
(the primary key; `ix_kjson` on the virtual column `kjson_key`, which InnoDB state tables
have, see :func:`pyflink_ndb.stores.mysql.mysql_ddl` and :func:`ensure_kjson_index`).
What such a read costs is the server parsing and optimizing the views' text (JSON_TABLE,
the newest-version subquery, the list subqueries) in every statement, about 10× a plain
primary-key read; :func:`point_read_query` is that plain read, with the version ranges
read once and checked in the statement.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import pymysql

from pyflink_ndb.errors import ConfigurationError
from pyflink_ndb.stores.base import StateStore

_log = logging.getLogger(__name__)

#: 2**32: `version = branch << 32 | epoch`.
_EPOCH_SPAN = 1 << 32


def view_names(namespace: str) -> tuple[str, str, str]:
    """(`ns_committed`, `ns_committed_rows`, `ns_committed_ranges`), in drop order."""
    return (f"{namespace}_committed", f"{namespace}_committed_rows",
            f"{namespace}_committed_ranges")


def _require_mysql(store: StateStore) -> None:
    from pyflink_ndb.stores.mysql import MysqlStateStore

    if not isinstance(store, MysqlStateStore):
        raise ConfigurationError(
            f"SQL views need a MySQL-protocol server (MariaDB 10.6+, MySQL 8.0+, RonDB); "
            f"{store.describe()} is SQLite: read it with `pyflink-ndb scan` or `query`.")


def check_server(store: StateStore) -> str:
    """The server's version text, when it has what the views need (`JSON_TABLE`: MariaDB
    10.6 or later, MySQL 8.0.4 or later, which RonDB 21.04+ is).

    :raises ConfigurationError: SQLite, or an older server.
    """
    _require_mysql(store)
    version = str(store._read("server version", "SELECT VERSION()")[0][0])
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return version
    major, minor, patch = int(match[1]), int(match[2]), int(match[3] or 0)
    if "mariadb" in version.lower():
        if (major, minor) < (10, 6):
            raise ConfigurationError(
                f"The server is MariaDB {version}: the views use JSON_TABLE, which MariaDB "
                "has since 10.6. Upgrade the server, or read with `pyflink-ndb scan`.")
    elif (major, minor, patch) < (8, 0, 4):
        raise ConfigurationError(
            f"The server is MySQL {version}: the views use JSON_TABLE, which MySQL has since "
            "8.0.4. Upgrade the server, or read with `pyflink-ndb scan`.")
    return version


def _byte(expr: str, pos: str) -> str:
    """SQL: the byte at 1-based position `pos` of binary `expr` (0 past the end)."""
    return f"ASCII(SUBSTRING({expr}, {pos}, 1))"


def _scalar_length(u: str) -> str:
    """SQL: the length of the encoded scalar key at the start of `u` (NULL for a
    composite key), after pyflink_ndb.serialization.keys: tags N/T/F (1 byte), f (9), and
    s/b/a/i/p with a varint length (< 16,384: at most 2 bytes, as keys are <= 2,048)."""
    b1, b2 = _byte(u, "2"), _byte(u, "3")
    return (f"(CASE WHEN ASCII({u}) IN (78, 84, 70) THEN 1 WHEN ASCII({u}) = 102 THEN 9 "
            f"WHEN ASCII({u}) IN (115, 98, 97, 105, 112) THEN "
            f"IF({b1} < 128, 2 + {b1}, 3 + ({b1} - 128) + 128 * {b2}) END)")


def _map_key_json(m: str) -> str:
    """SQL: JSON text of the encoded map key `m` (the rest of the ukey) for str, int (up
    to 7 bytes), bool and None; NULL otherwise. `m` should be a column: it is repeated."""
    raw = f"SUBSTRING({m}, IF({_byte(m, '2')} < 128, 3, 4))"
    integer = (f"IF(LENGTH({raw}) BETWEEN 1 AND 7, CAST(CAST(CONV(HEX({raw}), 16, 10) AS "
               f"SIGNED) - IF(ASCII({raw}) >= 128, CAST(1 << (8 * LENGTH({raw})) AS SIGNED), "
               "0) AS CHAR), NULL)")
    return (f"(CASE ASCII({m}) WHEN 78 THEN 'null' WHEN 84 THEN 'true' "
            f"WHEN 70 THEN 'false' WHEN 115 THEN JSON_QUOTE(CONVERT({raw} USING utf8mb4)) "
            f"WHEN 105 THEN {integer} END)")


def views_sql(store: StateStore, indexed: bool | None = None) -> list[str]:
    """The `CREATE OR REPLACE VIEW` statements of the store's namespace, in creation order.

    Identifiers come only from the validated namespace; the statements take no
    parameters.

    :param indexed: the state table has the indexed `kjson_key` column (see
        :data:`pyflink_ndb.stores.mysql.KJSON_KEY_COLUMN`): the view's `kjson` is that
        column, so that `WHERE kjson = ...` is an index lookup (NULL for a key whose JSON
        is longer than :data:`~pyflink_ndb.stores.mysql.KJSON_KEY_CHARS` characters);
        without it `kjson` is the JSON column (such lookups read the table). None: ask the
        store (:func:`has_kjson_index`).
    """
    if indexed is None:
        indexed = has_kjson_index(store)
    committed, rows, ranges = view_names(store.namespace)
    o, b, s, c = store.t_operators, store.t_branches, store.t_state, store.t_catalog
    part = ("JSON_TABLE(o.committed, '$[*]' COLUMNS (kg_start INT PATH '$[0]', "
            "kg_end INT PATH '$[1]', branch BIGINT PATH '$[2]', epoch BIGINT PATH '$[3]')) p")
    # The committed snapshot's own range of each segment is appended to its branch's
    # lineage, so that one JSON_TABLE yields every range and the view has no UNION: the
    # server merges it into the statements that use it instead of materializing it.
    own = (f"JSON_ARRAY(p.kg_start, p.kg_end, JSON_ARRAY(JSON_ARRAY(p.branch * {_EPOCH_SPAN}, "
           f"p.branch * {_EPOCH_SPAN} + p.epoch)))")
    ranges_sql = (
        f"CREATE OR REPLACE VIEW {ranges} AS "
        f"SELECT o.operator, GREATEST(p.kg_start, l.kg_start) AS kg_start, "
        "LEAST(p.kg_end, l.kg_end) AS kg_end, l.lo, l.hi, p.epoch AS checkpoint, "
        f"o.committed FROM {o} o, {part}, {b} br, "
        f"JSON_TABLE(JSON_ARRAY_APPEND(br.lineage, '$', {own}), '$[*]' COLUMNS ("
        "kg_start INT PATH '$[0]', kg_end INT PATH '$[1]', "
        "NESTED PATH '$[2][*]' COLUMNS (lo BIGINT PATH '$[0]', hi BIGINT PATH '$[1]'))) l "
        "WHERE br.branch_id = p.branch AND l.kg_start <= p.kg_end AND "
        "l.kg_end >= p.kg_start AND l.lo IS NOT NULL")
    now_ms = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
    key = "s.kjson_key" if indexed else "NULL"
    rows_sql = (
        f"CREATE OR REPLACE VIEW {rows} AS "
        "SELECT c.operator, c.state_name AS state, c.state_kind AS kind, s.key_group, "
        "s.state_id, s.ukey, s.version, r.checkpoint, s.kjson, s.vjson, s.chunks, "
        f"s.expires_at_ms, {key} AS kjson_key, "
        f"SUBSTRING(s.ukey, {_scalar_length('s.ukey')} + 1) AS ktail "
        f"FROM {s} s JOIN {c} c ON c.state_id = s.state_id "
        f"JOIN {ranges} r ON r.operator = c.operator AND s.key_group BETWEEN r.kg_start "
        "AND r.kg_end AND s.version BETWEEN r.lo AND r.hi "
        "WHERE s.chunk = 0 AND s.tombstone = 0 AND (s.expires_at_ms IS NULL OR "
        f"s.expires_at_ms > {now_ms}) AND NOT EXISTS (SELECT 1 FROM {s} t JOIN {ranges} q "
        "ON q.operator = c.operator AND t.key_group BETWEEN q.kg_start AND q.kg_end AND "
        "t.version BETWEEN q.lo AND q.hi WHERE t.key_group = s.key_group AND "
        "t.state_id = s.state_id AND t.ukey = s.ukey AND t.chunk = 0 AND "
        "t.version > s.version)")
    mkey = _map_key_json("v.ktail")
    inner = "SUBSTRING(CAST(g.vjson AS CHAR), 2, CHAR_LENGTH(CAST(g.vjson AS CHAR)) - 2)"
    concat = f"GROUP_CONCAT({inner} ORDER BY g.ukey SEPARATOR ',')"
    # A list is its head row (no JSON) and its segment rows (ukey = head + `i 01 n`).
    segments = (f"FROM {rows} g WHERE g.key_group = v.key_group AND g.state_id = v.state_id "
                "AND g.ukey BETWEEN CONCAT(v.ukey, X'690100') AND CONCAT(v.ukey, X'6901FF') "
                "AND LENGTH(g.ukey) = LENGTH(v.ukey) + 3")
    list_json = (f"(SELECT IF(COUNT(*) = COUNT(g.vjson) AND LENGTH({concat}) = "
                 f"SUM(LENGTH({inner})) + COUNT(*) - 1, CONCAT('[', {concat}, ']'), NULL) "
                 f"{segments})")
    columns = ("operator, state, kind, key_group, kjson, key_text, mkey, vjson, checkpoint, "
               "version, expires_at_ms, chunks, ukey")
    # One SELECT, no UNION, GROUP BY or DISTINCT: the server merges the view into the
    # statement that reads it (no temporary table), and conditions on its columns reach
    # the state table's indexes. `kjson` is the indexed `kjson_key` where the state table
    # has it (NULL for a key whose JSON is longer than KJSON_KEY_CHARS; `key_text` and
    # `ukey` still name it). A list shows only when one of its segments is visible and live.
    kjson = "v.kjson_key" if indexed else "v.kjson"
    committed_sql = (
        f"CREATE OR REPLACE VIEW {committed} ({columns}) AS "
        f"SELECT v.operator, v.state, v.kind, v.key_group, {kjson}, JSON_UNQUOTE(v.kjson), "
        f"CASE WHEN v.kind = 'map' THEN {mkey} END, "
        f"CASE WHEN v.kind = 'list' THEN {list_json} ELSE v.vjson END, v.checkpoint, "
        f"v.version, v.expires_at_ms, v.chunks, v.ukey FROM {rows} v WHERE v.kind <> 'list' "
        f"OR (v.vjson IS NULL AND EXISTS (SELECT 1 {segments}))")
    return [ranges_sql, rows_sql, committed_sql]


# -- the documented point reads (README, "SQL views"; bench part `reads`) ---------------
# Placeholders in pymysql's style (%s). `ukey` is the encoded key (a map entry's: the key's
# and the map key's), `key_group` Flink's key group of the key: both are columns of the
# views; `kjson` is the key as JSON, as pyflink-ndb writes it (compact, UTF-8).

def ranges_query(namespace: str) -> str:
    """The version ranges readers see, per key-group segment, and the `committed`
    descriptor they belong to. Parameters: operator."""
    return (f"SELECT kg_start, kg_end, lo, hi, checkpoint, committed FROM "
            f"{view_names(namespace)[2]} WHERE operator = %s")


def point_read_query(namespace: str, ranges: int) -> str:
    """The newest committed version of one entry by primary key, with the version ranges
    of its key group read once (:func:`ranges_query`; a key group's ranges are those of
    the segment with `kg_start <= key_group <= kg_end`, `ranges` of them). Returns
    `current` (0: the committed checkpoint moved since the ranges were read: read them
    again), `version`, `tombstone` (1: deleted), `vjson`, `chunks`, `expires_at_ms` (the
    TTL); no row: the entry has no version in those ranges (if they may be old, read them
    again to be sure). Parameters: operator, committed (as :func:`ranges_query` returned
    it), key_group, state_id, ukey, then `lo, hi` of each range."""
    visible = " OR ".join("s.version BETWEEN %s AND %s" for _ in range(ranges))
    return (f"SELECT (SELECT o.committed FROM {namespace}_operators o WHERE o.operator = %s) "
            "= %s AS current, s.version, s.tombstone, s.vjson, s.chunks, s.expires_at_ms "
            f"FROM {namespace}_state s FORCE INDEX (PRIMARY) WHERE s.key_group = %s AND "
            f"s.state_id = %s AND s.ukey = %s AND s.chunk = 0 AND ({visible}) "
            "ORDER BY s.version DESC LIMIT 1")


def versions_read_query(namespace: str) -> str:
    """Every stored version of one entry's first chunk by primary key, for the client to
    pick the one its ranges see (:func:`newest_in_ranges`; the ranges read once with
    :func:`ranges_query`) and to validate in batches (:func:`committed_query`): no version
    predicate, no `ORDER BY` and no check of `committed` in the statement, so the server
    plans a plain primary-key prefix lookup (bench part 6 compares it with
    :func:`point_read_query`). Returns `version`, `tombstone`, `vjson`, `chunks`,
    `expires_at_ms`, one row per stored version (of every branch, uncommitted ones too:
    the ranges decide). Parameters: key_group, state_id, ukey."""
    return (f"SELECT s.version, s.tombstone, s.vjson, s.chunks, s.expires_at_ms FROM "
            f"{namespace}_state s WHERE s.key_group = %s AND s.state_id = %s AND "
            "s.ukey = %s AND s.chunk = 0")


def committed_query(namespace: str) -> str:
    """The operator's `committed` descriptor alone (parameter: operator): compare it with
    the one :func:`ranges_query` returned to validate the reads made since."""
    return f"SELECT committed FROM {namespace}_operators WHERE operator = %s"


def newest_in_ranges(rows: Sequence[Sequence[Any]], ranges: Sequence[tuple[int, int]]
                     ) -> Sequence[Any] | None:
    """The row of :func:`versions_read_query` that a checkpoint's version `ranges` (of the
    entry's key group, `(lo, hi)` inclusive) see: the greatest `version` (its first
    column) inside one of them; None: no version there.

    Exact only while that checkpoint is still the committed one: garbage collection keeps
    every version a retained checkpoint sees, but once the ranges' checkpoint has left
    retention it may delete the version it saw and keep an older one a savepoint sees,
    which this would then return. So validate: after a batch of reads, read `committed`
    (:func:`committed_query`); if it still equals the descriptor read with the ranges,
    every answer of the batch is the committed state at that checkpoint (the statement of
    :func:`point_read_query` does the same check in each read); if it moved, read the
    ranges again and redo the batch."""
    best: Sequence[Any] | None = None
    for row in rows:
        version = row[0]
        if (best is None or version > best[0]) and any(lo <= version <= hi
                                                        for lo, hi in ranges):
            best = row
    return best


def ranges_point_read_query(namespace: str) -> str:
    """The newest committed version of one entry by primary key, the ranges joined from
    `<ns>_committed_ranges` (always current; slower). Returns version, tombstone, vjson,
    chunks, expires_at_ms (no row: no committed version). Parameters: operator,
    key_group, state_id, ukey."""
    return (f"SELECT s.version, s.tombstone, s.vjson, s.chunks, s.expires_at_ms FROM "
            f"{namespace}_state s JOIN {view_names(namespace)[2]} r ON r.operator = %s AND "
            "s.key_group BETWEEN r.kg_start AND r.kg_end AND s.version BETWEEN r.lo AND "
            "r.hi WHERE s.key_group = %s AND s.state_id = %s AND s.ukey = %s AND "
            "s.chunk = 0 ORDER BY s.version DESC LIMIT 1")


def view_point_read_query(namespace: str) -> str:
    """One entry through `<ns>_committed` by primary key. Parameters: operator, state,
    key_group, ukey."""
    return (f"SELECT kind, mkey, vjson, checkpoint FROM {view_names(namespace)[0]} WHERE "
            "operator = %s AND state = %s AND key_group = %s AND ukey = %s")


def view_key_query(namespace: str) -> str:
    """Every state of one key through `<ns>_committed`, by the key's JSON (indexed where
    the state table has `kjson_key`). Parameters: operator, kjson."""
    return (f"SELECT state, mkey, vjson, kind, checkpoint FROM {view_names(namespace)[0]} "
            "WHERE operator = %s AND kjson = %s")


def rows_point_read_query(namespace: str) -> str:
    """One stored entry row through the leaner `<ns>_committed_rows` (no list aggregation
    and no map-key decoding: about a third of `<ns>_committed`'s cost per statement) by
    primary key. Parameters: operator, state, key_group, ukey."""
    return (f"SELECT kind, vjson, checkpoint FROM {view_names(namespace)[1]} WHERE "
            "operator = %s AND state = %s AND key_group = %s AND ukey = %s")


def rows_key_query(namespace: str) -> str:
    """Every stored entry row of one key through `<ns>_committed_rows`, by the indexed
    `kjson_key` (the key's JSON, as for :func:`view_key_query`). Parameters: operator,
    kjson."""
    return (f"SELECT state, ukey, vjson, kind, checkpoint FROM {view_names(namespace)[1]} "
            "WHERE operator = %s AND kjson_key = %s")


def has_kjson_index(store: StateStore) -> bool:
    """True when the namespace's state table has the indexed `kjson_key` column."""
    rows = store._read("inspect columns", "SELECT COUNT(*) FROM information_schema.COLUMNS "
                       "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND "
                       "COLUMN_NAME = 'kjson_key'", (store.t_state,))
    return bool(rows and int(rows[0][0]))


def ensure_kjson_index(store: StateStore) -> bool:
    """Give an InnoDB state table made before `kjson_key` existed the column and its index
    (:func:`pyflink_ndb.stores.mysql.kjson_index_ddl`: online, the job may run); nothing
    when they exist. An NDB table is left as it is (NDB indexes no virtual column; a
    stored one is a copying ALTER, unsafe while a job writes): its `kjson` lookups read
    the table. Returns whether the column is there now.

    :raises StoreUnavailableError: the database cannot be reached.
    """
    from pyflink_ndb.stores.mysql import kjson_index_ddl

    if has_kjson_index(store):
        return True
    engine = store._read("inspect engine", "SELECT ENGINE FROM information_schema.TABLES "
                         "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                         (store.t_state,))
    if not engine or str(engine[0][0]).lower() != "innodb":
        return False
    for statement in kjson_index_ddl(store):
        def unit(statement: str = statement) -> None:
            try:
                store._execute(statement)
            except pymysql.err.MySQLError as err:
                # 1060/1061: a concurrent `views create` added it first.
                if not err.args or err.args[0] not in (1060, 1061):
                    raise
        try:
            store._retry("add the kjson index", unit)
        except pymysql.err.MySQLError as err:  # e.g. 1142: no ALTER/INDEX privilege
            _log.warning(
                "Could not add the kjson index to %s (%s): lookups by kjson in the views "
                "read the whole table. Run as a user with ALTER, CREATE and INSERT on it: %s",
                store.t_state, err, "; ".join(kjson_index_ddl(store)))
            return False
    return True


def create_views(store: StateStore) -> list[str]:
    """Create (or replace) the namespace's views; returns their names.

    On an InnoDB state table without the indexed `kjson_key` column (made by an earlier
    release), it is added first (:func:`ensure_kjson_index`), online.

    Run it again after an upgrade of pyflink-ndb (it replaces them). On RonDB, views
    are objects of the MySQL server they are created on: create them on each MySQL
    server that clients query.

    :param store: an opened MySQL-protocol store of the namespace.
    :raises ConfigurationError: SQLite, or a server without JSON_TABLE (see
        :func:`check_server`).
    :raises StoreUnavailableError: the database cannot be reached or refused the DDL.
    """
    check_server(store)
    statements = views_sql(store, ensure_kjson_index(store))

    def unit() -> None:
        for statement in statements:
            store._execute(statement)
    store._retry("create views", unit)
    return list(reversed(view_names(store.namespace)))


def drop_views(store: StateStore) -> list[str]:
    """Drop the namespace's views where they exist (nothing on SQLite); returns the names
    of those that existed.

    :raises StoreUnavailableError: the database cannot be reached.
    """
    from pyflink_ndb.stores.mysql import MysqlStateStore

    if not isinstance(store, MysqlStateStore):
        return []
    existing = [name for name in view_names(store.namespace) if store._table_exists(name)]

    def unit() -> None:
        for name in view_names(store.namespace):
            store._execute(f"DROP VIEW IF EXISTS {name}")
    store._retry("drop views", unit)
    return existing
