"""Read a namespace as the job sees it: its states, snapshots, storage, and the committed
entries decoded as PyFlink's state API returns them (for `pyflink-ndb status`, `get`,
`scan`, `savepoints`).

What a reader sees is the operator's latest completed checkpoint (`committed`,
docs/protocol.md "P4"): per key-group segment the newest version inside that
checkpoint's version ranges, tombstones and TTL-expired rows left out. Rows are grouped
into *entries*, one per (state, Flink key), by the layout of each state kind
(pyflink_ndb/state/): a ValueState, ReducingState or AggregatingState is one row (the
value; the accumulator for an AggregatingState, since its `AggregateFunction` lives in the
job); a MapState is one row per map key (`ukey = encoded key + encoded map key`) and
becomes a `dict`; a ListState is a head row `(segments, token)` plus segment rows
(`ukey = encoded key + encoded segment number`) and becomes the concatenated `list`,
with TTL applied per element. Values of any size are joined from all their chunks.

Everything here only reads, in autocommit; pages are read in full and then checked to
belong to a checkpoint that is still retained, so a read that garbage collection
overtakes raises :class:`~pyflink_ndb.errors.StaleReadError` instead of returning a mix.
"""

from __future__ import annotations

import ast
import base64
import datetime
import decimal
import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyflink_ndb.errors import ConfigurationError, SerializationError
from pyflink_ndb.serialization.keys import decode_key, encode_key, split_key
from pyflink_ndb.serialization.values import decode_value
from pyflink_ndb.stores.base import _IDENT_RE, StateStore, prefix_upper_bound, visible
from pyflink_ndb.stores.lineage import Descriptor, Ranges

#: Rows per page when the committed state is read (fewer when a limit asks for fewer).
PAGE_ROWS = 1000
#: Kinds whose entry is one row holding the value.
SINGLE_ROW_KINDS = frozenset({"value", "reducing", "aggregating"})


@dataclass(frozen=True, slots=True)
class StateInfo:
    """One declared state (a catalog row)."""

    operator: str
    name: str
    kind: str
    state_id: int
    ttl_ms: int | None
    serializer: str


@dataclass(frozen=True, slots=True)
class StateEntry:
    """One committed entry as the state API returns it.

    `value` is what `value()`/`get()` returns: the value (ValueState, ReducingState), the
    accumulator (AggregatingState), a `dict` (MapState), a `list` (ListState).
    `expires_at_ms` is the TTL expiry (ms since the Unix epoch; for a list or map the
    latest of its elements), None without TTL. `rows` and `bytes` count the stored rows
    (chunks included) and value bytes read for it.
    """

    operator: str
    state: str
    kind: str
    key_group: int
    state_id: int
    key_bytes: bytes
    key: Any
    value: Any
    checkpoint: int
    expires_at_ms: int | None
    rows: int
    bytes: int

    @property
    def cursor(self) -> Cursor:
        """Where a scan continues after this entry."""
        return Cursor(self.operator, self.key_group, self.state_id, self.key_bytes)


@dataclass(frozen=True, slots=True)
class Cursor:
    """A position in a scan: strictly after the entry (key group, state id, Flink key) of
    `operator`. Printed as an opaque token (`--after`)."""

    operator: str
    key_group: int
    state_id: int
    key_bytes: bytes

    def to_token(self) -> str:
        raw = json.dumps([self.operator, self.key_group, self.state_id, self.key_bytes.hex()],
                         separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def from_token(token: str) -> Cursor:
        """:raises ConfigurationError: not a token printed by `scan`."""
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            op, kg, sid, key_hex = json.loads(raw)
            return Cursor(str(op), int(kg), int(sid), bytes.fromhex(key_hex))
        except (ValueError, TypeError) as err:
            raise ConfigurationError(f"--after {token!r} is not a position printed by "
                                     "`pyflink-ndb scan`.") from err


@dataclass(slots=True)
class StateStorage:
    """Stored rows of one state (every version and chunk, what garbage collection has not
    removed yet) and their spread over key groups."""

    rows: int = 0
    bytes: int = 0
    rows_per_key_group: dict[int, int] = field(default_factory=dict)

    @property
    def key_groups(self) -> int:
        return len(self.rows_per_key_group)

    def spread(self) -> tuple[int, int, int] | None:
        """(min, median, max) rows per key group that holds rows, or None when empty."""
        counts = sorted(self.rows_per_key_group.values())
        if not counts:
            return None
        return counts[0], counts[len(counts) // 2], counts[-1]


# -- namespaces, catalog, storage -------------------------------------------------------
def list_namespaces(store: StateStore) -> list[str]:
    """The pyflink-ndb namespaces in the store's database (those with a `<ns>_state` and a
    `<ns>_operators` table, or a format-1 `<ns>_epochs` table), sorted.

    :param store: a connected store (any namespace of the database).
    :raises StoreUnavailableError: the database cannot be reached.
    """
    from pyflink_ndb.stores.sqlite import SqliteStateStore

    if isinstance(store, SqliteStateStore):
        sql, params = "SELECT name FROM sqlite_master WHERE type = 'table'", ()
    else:
        sql, params = ("SELECT TABLE_NAME FROM information_schema.TABLES WHERE "
                       "TABLE_SCHEMA = DATABASE()", ())
    tables = {str(name) for (name,) in store._read("list tables", sql, params)}
    found = set()
    for table in tables:
        for suffix in ("_operators", "_epochs"):
            if table.endswith(suffix):
                ns = table[:-len(suffix)]
                if _IDENT_RE.match(ns) and f"{ns}_state" in tables:
                    found.add(ns)
    return sorted(found)


def states_of(store: StateStore, operator: str | None = None) -> list[StateInfo]:
    """The declared states (of one operator when given), by operator and name."""
    infos = [StateInfo(str(r["operator"]), str(r["state_name"]), str(r["state_kind"]),
                       int(r["state_id"]), None if r["ttl_ms"] is None else int(r["ttl_ms"]),
                       str(r["serializer"]))
             for r in store.catalog(operator)]
    return sorted(infos, key=lambda s: (s.operator, s.name))


def storage_by_state(store: StateStore) -> dict[int, StateStorage]:
    """Rows, bytes (user key + value chunk) and rows per key group of every state id.

    One `GROUP BY` over the whole state table: it reads every row on the server (run it
    when you need the figures, not in a loop).
    """
    out: dict[int, StateStorage] = {}
    for sid, kg, rows, size in store._read(
            "count rows", f"SELECT state_id, key_group, COUNT(*), SUM(LENGTH(ukey) + "
            f"COALESCE(LENGTH(vbytes), 0)) FROM {store.t_state} GROUP BY state_id, key_group"):
        stats = out.setdefault(int(sid), StateStorage())
        stats.rows += int(rows)
        stats.bytes += int(size or 0)
        stats.rows_per_key_group[int(kg)] = int(rows)
    return out


# -- keys and values for people ---------------------------------------------------------
KEY_TYPES = ("str", "int", "float", "python")


def parse_key(text: str, key_type: str = "str") -> Any:
    """A Flink key given on the command line.

    :param text: the key as typed.
    :param key_type: `str` (default: the text itself), `int`, `float`, or `python` (a
        Python literal, read with `ast.literal_eval`: tuples, bytes `b'..'`, None, ...;
        and PyFlink `Row(...)` calls of literals, for ROW keys: `Row(f0='a', f1=1)` is the
        key of `Types.ROW([Types.STRING(), Types.INT()])`, whose fields PyFlink names
        f0, f1, ...; `Row('a', 1)` is a Row without names, another key).
    :raises ConfigurationError: the text is not a key of that type.
    """
    try:
        if key_type == "str":
            return text
        if key_type == "int":
            return int(text)
        if key_type == "float":
            return float(text)
        if key_type == "python":
            return _python_key(ast.parse(text.strip(), mode="eval").body)
    except (ValueError, SyntaxError, TypeError, RecursionError) as err:
        expected = (" A Python literal is expected (e.g. ('a', 1), b'raw', None), or "
                    "Row(...) of literals for a ROW key (e.g. Row(f0='a', f1=1))."
                    if key_type == "python" else "")
        raise ConfigurationError(
            f"{text!r} is not a key of type {key_type}: {err}.{expected}") from err
    raise ConfigurationError(f"Unknown key type {key_type!r}; one of {', '.join(KEY_TYPES)}.")


def _python_key(node: ast.expr) -> Any:
    """The key a parsed `--key-type python` expression stands for: literals as
    `ast.literal_eval` reads them, with `Row(...)` calls of such (nested in tuples, lists
    and other Rows too) made into PyFlink Rows. Nothing else is evaluated.

    :raises ValueError: any other expression (a name, another call, an operator)."""
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id != "Row":
            raise ValueError(f"only Row(...) may be called, not {ast.unparse(node.func)}")
        if any(k.arg is None for k in node.keywords) or any(
                isinstance(a, ast.Starred) for a in node.args):
            raise ValueError("Row(...) takes plain fields, not *args or **kwargs")
        if node.args and node.keywords:
            raise ValueError("Row(...) takes either positional or named fields")
        from pyflink.common import Row

        if node.keywords:
            return Row(**{str(k.arg): _python_key(k.value) for k in node.keywords})
        return Row(*[_python_key(a) for a in node.args])
    if isinstance(node, ast.Tuple):
        return tuple(_python_key(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [_python_key(e) for e in node.elts]
    try:
        return ast.literal_eval(node)
    except ValueError:  # its own text names an AST node object: name the expression
        raise ValueError(f"{ast.unparse(node)} is not a literal") from None


def to_jsonable(value: Any, depth: int = 0) -> Any:
    """`value` as plain JSON data for people and scripts.

    None, bool, int, str and finite floats stay; tuples, lists, sets and unnamed Rows
    become arrays; named Rows and dicts with string keys become objects; a dict with other
    keys (a MapState keyed by ints or tuples) becomes an array of `{"key": k, "value": v}`
    in its order; bytes become `{"base64": "..."}`; NaN and infinities, dates, times and
    Decimals their text; anything else its `repr` (a string).
    """
    if depth > 200:
        return repr(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return {"base64": base64.b64encode(bytes(value)).decode()}
    as_dict = getattr(value, "as_dict", None)
    if callable(as_dict) and getattr(value, "_fields", None):
        return {str(k): to_jsonable(v, depth + 1) for k, v in as_dict().items()}
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: to_jsonable(v, depth + 1) for k, v in value.items()}
        return [{"key": to_jsonable(k, depth + 1), "value": to_jsonable(v, depth + 1)}
                for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [to_jsonable(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((to_jsonable(v, depth + 1) for v in value), key=repr)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta | decimal.Decimal):
        return str(value)
    try:  # a Row without names iterates
        from pyflink.common import Row

        if isinstance(value, Row):
            return [to_jsonable(v, depth + 1) for v in value]
    except ImportError:  # pragma: no cover - pyflink is a dependency
        pass
    return repr(value)


# -- the committed state, decoded --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Row:
    key_group: int
    state_id: int
    ukey: bytes
    version: int
    value: bytes
    expires_at_ms: int | None
    chunks: int


def _segments(store: StateStore, descriptor: Descriptor
              ) -> list[tuple[int, int, Ranges, int]]:
    """(kg_start, kg_end, ranges, checkpoint) of the committed checkpoint, by key group."""
    return sorted((a, b, ranges, part.epoch)
                  for a, b, ranges, part in store.committed_segments(descriptor))


def _read_rows(store: StateStore, operator: str, descriptor: Descriptor,
               state_ids: Sequence[int], key: bytes | None, after: Cursor | None,
               page_rows: int) -> Iterator[tuple[_Row, int]]:
    """(row, checkpoint) of the newest visible version of every entry row, in
    (key group, state id, ukey) order, read in pages of `page_rows` rows; only the pages
    consumed are read. Each page is checked to be still retained before it is yielded.

    :param key: only the rows of this encoded Flink key (every key group of the
        checkpoint is searched by primary key: the key group is Flink's hash, which only
        Java computes).
    :param after: only rows after this entry.
    """
    marks = ", ".join("?" for _ in state_ids)
    upper = None if key is None else prefix_upper_bound(key)
    start = None if after is None else (after.key_group, after.state_id,
                                        prefix_upper_bound(after.key_bytes) or b"", True)
    for a, b, ranges, checkpoint in _segments(store, descriptor):
        if start is not None and b < start[0]:
            continue
        svis, sp = visible("s.version", ranges)
        tvis, tp = visible("t.version", ranges)
        cursor = start if start is not None and a <= start[0] else None
        while True:
            sql = f"SELECT s.key_group, s.state_id, s.ukey, s.version, s.vbytes, " \
                  f"s.expires_at_ms, s.chunks FROM {store.t_state} s WHERE "
            params: list[Any] = []
            if key is not None:
                sql += f"s.key_group IN ({', '.join('?' for _ in range(a, b + 1))})"
                params += list(range(a, b + 1))
            else:
                sql += "s.key_group BETWEEN ? AND ?"
                params += [a, b]
            sql += f" AND s.state_id IN ({marks}) AND s.chunk = 0 AND s.tombstone = 0 AND {svis}"
            params += [*state_ids, *sp]
            if key is not None:
                sql += " AND s.ukey >= ?"
                params.append(key)
                if upper is not None:
                    sql += " AND s.ukey < ?"
                    params.append(upper)
            if cursor is not None:
                op = ">=" if cursor[3] else ">"
                sql += (" AND (s.key_group > ? OR (s.key_group = ? AND (s.state_id > ? OR "
                        f"(s.state_id = ? AND s.ukey {op} ?))))")
                params += [cursor[0], cursor[0], cursor[1], cursor[1], cursor[2]]
            sql += (f" AND s.version = (SELECT MAX(t.version) FROM {store.t_state} t WHERE "
                    "t.key_group = s.key_group AND t.state_id = s.state_id AND t.ukey = "
                    f"s.ukey AND t.chunk = 0 AND {tvis}) ORDER BY s.key_group, s.state_id, "
                    "s.ukey LIMIT ?")
            params += [*tp, page_rows]
            raw = store._read("read committed", sql, params)
            page = []
            for kg, sid, ukey, version, vbytes, expires, chunks in raw:
                kg, sid, ukey, version, chunks = (int(kg), int(sid), bytes(ukey), int(version),
                                                  int(chunks))

                def join(kg: int = kg, sid: int = sid, ukey: bytes = ukey,
                         version: int = version, first: Any = vbytes,
                         chunks: int = chunks) -> bytes | None:
                    return store._join_chunks(kg, sid, ukey, version, first, chunks)
                data = store._retry("read chunks", join)
                page.append(_Row(kg, sid, ukey, version, data or b"",
                                 None if expires is None else int(expires), chunks))
            store._check_still_restorable(operator, descriptor)
            for row in page:
                yield row, checkpoint
            if len(raw) < page_rows:
                break
            last = page[-1]
            cursor = (last.key_group, last.state_id, last.ukey, False)


def iter_entries(store: StateStore, operator: str, states: Sequence[StateInfo], *,
                 key: Any = None, key_given: bool = False, after: Cursor | None = None,
                 limit: int | None = None, now_ms: int | None = None,
                 snapshot: Descriptor | None = None) -> Iterator[StateEntry]:
    """The committed entries of `operator`'s `states`, decoded, in (key group, state,
    key) order; TTL-expired entries (and list elements, map entries) left out.

    :param key: only this Flink key (when `key_given`; None is a legal key).
    :param after: continue after this entry (a :class:`Cursor` of this operator).
    :param limit: the caller stops after this many entries (None: all): pages are sized
        so that no more rows are read than the entries need, plus one page of lookahead
        for map and list states, whose entries span rows.
    :param now_ms: the time TTL is judged at (ms since the Unix epoch; default now).
    :param snapshot: read this restorable snapshot (a savepoint or retained checkpoint:
        :func:`snapshot_descriptor`) instead of what readers see (None, the default).
    :raises StaleReadError: garbage collection overtook the read (read again).
    :raises SerializationError: a stored value or key cannot be decoded here (its class is
        not importable in this interpreter).
    """
    if snapshot is None:
        row = store.read_operator(operator)
        snapshot = None if row is None else row.committed
    if snapshot is None or not states:
        return
    now = int(time.time() * 1000) if now_ms is None else now_ms
    by_id = {s.state_id: s for s in states}
    key_bytes = encode_key(key) if key_given else None
    page_rows = PAGE_ROWS if limit is None else max(1, min(PAGE_ROWS, limit))
    group: list[tuple[_Row, bytes]] = []
    group_checkpoint = 0

    def flush() -> StateEntry | None:
        return _entry(operator, by_id[group[0][0].state_id], group, group_checkpoint, now)

    for stored, checkpoint in _read_rows(store, operator, snapshot, sorted(by_id),
                                         key_bytes, after, page_rows):
        prefix, _ = split_key(stored.ukey)
        if key_bytes is not None and prefix != key_bytes:
            continue
        if group and (group[0][0].key_group, group[0][0].state_id, group[0][1]) != (
                stored.key_group, stored.state_id, prefix):
            entry = flush()
            group = []
            if entry is not None:
                yield entry
        group.append((stored, prefix))
        group_checkpoint = checkpoint
        if by_id[stored.state_id].kind in SINGLE_ROW_KINDS:
            entry = flush()
            group = []
            if entry is not None:
                yield entry
    if group:
        entry = flush()
        if entry is not None:
            yield entry


def snapshot_descriptor(store: StateStore, operator: str, checkpoint: int,
                        job: str | None = None) -> Descriptor:
    """The restorable snapshot of `operator` that checkpoint or savepoint `checkpoint` took
    (`pyflink-ndb savepoints --all` lists them), to read with :func:`iter_entries`.

    :param checkpoint: Flink's checkpoint id (a savepoint's too).
    :param job: the Flink job id that took it (a prefix will do); None: any. Needed where
        several runs took a checkpoint of that id: a job restored from a snapshot counts
        on from its id, so two jobs restored from one snapshot reuse ids.
    :raises ConfigurationError: no completed snapshot of that id (the message lists the
        ones there are), or several and `job` does not choose one (it lists their jobs).
    """
    rows = [r for r in store.list_snapshots(operator) if r.status == "completed"]
    chosen = [r for r in rows if r.epoch == checkpoint and (job is None
                                                             or r.job_id.startswith(job))]
    if not chosen:
        have = sorted({r.epoch for r in rows if job is None or r.job_id.startswith(job)})
        of_job = "" if job is None else f" of job {job}"
        raise ConfigurationError(
            f"Operator {operator!r} has no restorable snapshot of checkpoint {checkpoint}"
            f"{of_job}; it has {', '.join(map(str, have)) or 'none'} (pyflink-ndb "
            "savepoints --all lists them).")
    takers = sorted({(r.job_id, r.kind) for r in chosen})
    if len({j for j, _ in takers}) > 1:
        raise ConfigurationError(
            f"Checkpoint {checkpoint} of operator {operator!r} was taken by "
            f"{len(takers)} jobs ({', '.join(f'{j}: {k}' for j, k in takers)}); choose one "
            "with --job (pyflink-ndb savepoints --all lists them).")
    return Descriptor(tuple(sorted((r.token for r in chosen),
                                   key=lambda t: (t.kg_start, t.kg_end))))


def _live(expires: int | None, now: int) -> bool:
    return expires is None or expires > now


def _entry(operator: str, state: StateInfo, rows: list[tuple[_Row, bytes]],
           checkpoint: int, now: int) -> StateEntry | None:
    """The entry of one (state, Flink key) from its rows, or None when nothing of it is
    live (expired, or a list without its head)."""
    first, prefix = rows[0]
    n_rows = sum(r.chunks for r, _ in rows)
    n_bytes = sum(len(r.value) for r, _ in rows)
    try:
        key = decode_key(prefix)
        if state.kind == "map":
            items: dict[Any, Any] = {}
            expiry: int | None = None
            for r, p in rows:
                if not _live(r.expires_at_ms, now):
                    continue
                items[decode_key(r.ukey[len(p):])] = decode_value(r.value)
                if r.expires_at_ms is not None:
                    expiry = max(expiry or 0, r.expires_at_ms)
            if not items:
                return None
            value: Any = items
        elif state.kind == "list":
            head = next((r for r, p in rows if len(r.ukey) == len(p)), None)
            if head is None or not _live(head.expires_at_ms, now):
                return None
            count, _token = decode_value(head.value)
            segments = {}
            for r, p in rows:
                if len(r.ukey) > len(p):
                    segments[decode_key(r.ukey[len(p):])] = r
            elements: list[Any] = []
            expiry = None
            for index in range(int(count)):
                seg = segments.get(index)
                if seg is None:
                    continue
                for item in decode_value(seg.value):
                    if state.ttl_ms is None:
                        elements.append(item)
                        continue
                    element, expires = item
                    if expires > now:
                        elements.append(element)
                        expiry = max(expiry or 0, expires)
            if not elements:
                return None
            value = elements
        else:
            if len(first.ukey) != len(prefix) or not _live(first.expires_at_ms, now):
                return None
            value = decode_value(first.value)
            expiry = first.expires_at_ms
    except SerializationError as err:
        raise SerializationError(
            f"Cannot decode an entry of state {state.name!r} of operator {operator!r} (key "
            f"group {first.key_group}): {err}") from err
    return StateEntry(operator, state.name, state.kind, first.key_group, state.state_id,
                      prefix, key, value, checkpoint, expiry, n_rows, n_bytes)


def sample_keys(store: StateStore, operator: str, states: Sequence[StateInfo],
                count: int = 10) -> list[Any]:
    """Up to `count` committed keys (for messages that list what exists)."""
    out: list[Any] = []
    for entry in iter_entries(store, operator, states, limit=count):
        out.append(entry.key)
        if len(out) >= count:
            break
    return out
