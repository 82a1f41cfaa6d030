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
(the segment's latest element) in the view, per element in `pyflink-ndb scan`.
"""

from __future__ import annotations

import re

from pyflink_ndb.errors import ConfigurationError
from pyflink_ndb.stores.base import StateStore

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
    return (f"(CASE {_byte(u, '1')} WHEN 78 THEN 1 WHEN 84 THEN 1 WHEN 70 THEN 1 "
            "WHEN 102 THEN 9 WHEN 115 THEN {v} WHEN 98 THEN {v} WHEN 97 THEN {v} "
            "WHEN 105 THEN {v} WHEN 112 THEN {v} ELSE NULL END)").format(
        v=f"IF({b1} < 128, 2 + {b1}, 3 + ({b1} - 128) + 128 * {b2})")


def _map_key_json(m: str) -> str:
    """SQL: JSON text of the encoded map key `m` (the rest of the ukey) for str, int (up
    to 7 bytes), bool and None; NULL otherwise."""
    skip = f"IF({_byte(m, '2')} < 128, 2, 3)"
    raw = f"SUBSTRING({m}, 1 + {skip})"
    integer = (f"IF(LENGTH({raw}) BETWEEN 1 AND 7, CAST(CAST(CONV(HEX({raw}), 16, 10) AS "
               f"SIGNED) - IF(ASCII({raw}) >= 128, CAST(1 << (8 * LENGTH({raw})) AS SIGNED), "
               "0) AS CHAR), NULL)")
    return (f"(CASE {_byte(m, '1')} WHEN 78 THEN 'null' WHEN 84 THEN 'true' "
            f"WHEN 70 THEN 'false' WHEN 115 THEN JSON_QUOTE(CONVERT({raw} USING utf8mb4)) "
            f"WHEN 105 THEN {integer} ELSE NULL END)")


def views_sql(store: StateStore) -> list[str]:
    """The `CREATE OR REPLACE VIEW` statements of the store's namespace, in creation order.

    Identifiers come only from the validated namespace; the statements take no
    parameters.
    """
    committed, rows, ranges = view_names(store.namespace)
    o, b, s, c = store.t_operators, store.t_branches, store.t_state, store.t_catalog
    part = ("JSON_TABLE(o.committed, '$[*]' COLUMNS (kg_start INT PATH '$[0]', "
            "kg_end INT PATH '$[1]', branch BIGINT PATH '$[2]', epoch BIGINT PATH '$[3]')) p")
    ranges_sql = (
        f"CREATE OR REPLACE VIEW {ranges} AS "
        f"SELECT o.operator, GREATEST(p.kg_start, l.kg_start) AS kg_start, "
        "LEAST(p.kg_end, l.kg_end) AS kg_end, l.lo, l.hi, p.epoch AS checkpoint "
        f"FROM {o} o, {part}, {b} br, JSON_TABLE(br.lineage, '$[*]' COLUMNS ("
        "kg_start INT PATH '$[0]', kg_end INT PATH '$[1]', NESTED PATH '$[2][*]' COLUMNS ("
        "lo BIGINT PATH '$[0]', hi BIGINT PATH '$[1]'))) l "
        "WHERE br.branch_id = p.branch AND l.kg_start <= p.kg_end AND "
        "l.kg_end >= p.kg_start AND l.lo IS NOT NULL "
        f"UNION ALL SELECT o.operator, p.kg_start, p.kg_end, p.branch * {_EPOCH_SPAN}, "
        f"p.branch * {_EPOCH_SPAN} + p.epoch, p.epoch FROM {o} o, {part}")
    now_ms = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
    rows_sql = (
        f"CREATE OR REPLACE VIEW {rows} AS "
        "SELECT c.operator, c.state_name AS state, c.state_kind AS kind, s.key_group, "
        "s.state_id, s.ukey, s.version, r.checkpoint, s.kjson, s.vjson, s.chunks, "
        f"s.expires_at_ms FROM {s} s JOIN {c} c ON c.state_id = s.state_id "
        f"JOIN {ranges} r ON r.operator = c.operator AND s.key_group BETWEEN r.kg_start "
        "AND r.kg_end AND s.version BETWEEN r.lo AND r.hi "
        "WHERE s.chunk = 0 AND s.tombstone = 0 AND (s.expires_at_ms IS NULL OR "
        f"s.expires_at_ms > {now_ms}) AND NOT EXISTS (SELECT 1 FROM {s} t JOIN {ranges} q "
        "ON q.operator = c.operator AND t.key_group BETWEEN q.kg_start AND q.kg_end AND "
        "t.version BETWEEN q.lo AND q.hi WHERE t.key_group = s.key_group AND "
        "t.state_id = s.state_id AND t.ukey = s.ukey AND t.chunk = 0 AND "
        "t.version > s.version)")
    klen = _scalar_length("v.ukey")
    mkey = _map_key_json(f"SUBSTRING(v.ukey, {klen} + 1)")
    inner = "SUBSTRING(CAST(g.vjson AS CHAR), 2, CHAR_LENGTH(CAST(g.vjson AS CHAR)) - 2)"
    concat = f"GROUP_CONCAT({inner} ORDER BY g.ukey SEPARATOR ',')"
    segments = (f"FROM {rows} g WHERE g.key_group = h.key_group AND g.state_id = h.state_id "
                "AND g.ukey BETWEEN CONCAT(h.ukey, X'690100') AND CONCAT(h.ukey, X'6901FF') "
                "AND LENGTH(g.ukey) = LENGTH(h.ukey) + 3")
    list_json = (f"(SELECT IF(COUNT(*) = COUNT(g.vjson) AND LENGTH({concat}) = "
                 f"SUM(LENGTH({inner})) + COUNT(*) - 1, CONCAT('[', {concat}, ']'), NULL) "
                 f"{segments})")
    columns = ("operator, state, kind, key_group, kjson, key_text, mkey, vjson, checkpoint, "
               "version, expires_at_ms, chunks, ukey")
    committed_sql = (
        f"CREATE OR REPLACE VIEW {committed} ({columns}) AS "
        "SELECT v.operator, v.state, v.kind, v.key_group, v.kjson, JSON_UNQUOTE(v.kjson), "
        f"CASE WHEN v.kind = 'map' THEN {mkey} END, v.vjson, v.checkpoint, v.version, "
        f"v.expires_at_ms, v.chunks, v.ukey FROM {rows} v WHERE v.kind <> 'list' "
        "UNION ALL SELECT x.operator, x.state, x.kind, x.key_group, x.kjson, "
        "JSON_UNQUOTE(x.kjson), NULL, x.vjson, x.checkpoint, x.version, x.expires_at_ms, "
        "x.chunks, x.ukey FROM (SELECT h.operator, h.state, h.kind, h.key_group, h.kjson, "
        f"{list_json} AS vjson, (SELECT COUNT(*) {segments}) AS segments, h.checkpoint, "
        f"h.version, h.expires_at_ms, h.chunks, h.ukey FROM {rows} h WHERE h.kind = 'list' "
        "AND h.vjson IS NULL) x WHERE x.segments > 0")
    return [ranges_sql, rows_sql, committed_sql]


def create_views(store: StateStore) -> list[str]:
    """Create (or replace) the namespace's views; returns their names.

    Run it again after an upgrade of pyflink-ndb (it replaces them). On RonDB, views
    are objects of the MySQL server they are created on: create them on each MySQL
    server that clients query.

    :param store: an opened MySQL-protocol store of the namespace.
    :raises ConfigurationError: SQLite, or a server without JSON_TABLE (see
        :func:`check_server`).
    :raises StoreUnavailableError: the database cannot be reached or refused the DDL.
    """
    check_server(store)
    statements = views_sql(store)

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
