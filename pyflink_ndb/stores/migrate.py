"""`pyflink-ndb migrate`: convert a namespace from row format 1 to row format 2.

Format 1 kept one timeline of bare epochs (`<ns>_state.epoch`, commit markers and pins in
`<ns>_epochs`). The conversion gives each operator one root branch over every key group,
copies the rows with `version = root << 32 | epoch` in pages, turns commit markers into
completed checkpoints and pins into savepoints, and makes the latest commit marker what
readers see. A Flink checkpoint taken by format 1 carries no token; it is restored as
`(root, epoch offset + checkpoint id)` (:func:`legacy_tokens`). Run it with no job on the
namespace; it can be run again after an interruption.
"""

from __future__ import annotations

import json
from typing import Any

from pyflink_ndb.errors import CheckpointError
from pyflink_ndb.stores.base import (
    COMPLETED,
    FORMAT_VERSION,
    KIND_CHECKPOINT,
    KIND_SAVEPOINT,
    PENDING,
    StateStore,
    now_ms,
)
from pyflink_ndb.stores.lineage import Descriptor, Token, fresh_lineage

#: Key groups of a root branch: every key group Flink can have (max parallelism 32768).
ROOT_KG_END = 32767
COPY_PAGE_ROWS = 1000


def legacy_tokens(store: StateStore, operator: str, epoch: int) -> list[Token]:
    """The token of format-1 epoch `epoch` of `operator` after migration.

    :raises CheckpointError: the operator has no migrated root branch or that epoch is
        not a restorable snapshot of it.
    """
    root = _root_branch(store, operator)
    if root is None:
        raise CheckpointError(
            f"The restored checkpoint was taken by pyflink-ndb row format 1 (it carries an "
            f"epoch offset, no token), but operator {operator!r} has no migrated state in "
            f"{store.describe()}. Run `pyflink-ndb migrate --url URL --namespace "
            f"{store.namespace}` first.")
    return [Token(root, epoch, 0, ROOT_KG_END)]


def _root_branch(store: StateStore, operator: str) -> int | None:
    for bid, row in store.load_branches(store.branches_of(operator)).items():
        if json.loads(row.origin).get("kind") == "migrated":
            return bid
    return None


def migrate(store: StateStore, progress: Any = None) -> dict[str, int]:
    """Convert `store`'s namespace (opened with `open_legacy`) to format 2.

    :param progress: optional callable(rows copied so far).
    :returns: counts: operators, rows, checkpoints, savepoints.
    """
    old_state = f"{store.t_state}_v1"
    if store._table_exists(store.t_state) and not store._table_exists(old_state):
        store._retry("rename format-1 state", lambda: store._execute(
            f"ALTER TABLE {store.t_state} RENAME TO {old_state}"))
    store._retry("create tables", lambda: [store._execute(s) for s in store._ddl()])
    markers = store._read("read format-1 markers", f"SELECT operator, epoch, is_savepoint "
                          f"FROM {store.t_legacy_epochs} ORDER BY operator, epoch")
    catalog = store._read("read catalog", f"SELECT state_id, operator FROM {store.t_catalog}")
    operators = sorted({op for _, op in catalog} | {op for op, _, _ in markers})
    counts = {"operators": len(operators), "rows": 0, "checkpoints": 0, "savepoints": 0}
    roots: dict[str, int] = {}
    for op in operators:
        root = _root_branch(store, op)
        if root is None:
            root = store.allocate_branch(op, 0, ROOT_KG_END,
                                         fresh_lineage(0, 0, ROOT_KG_END).to_json(),
                                         {"kind": "migrated", "from_format": 1}, "migrated",
                                         0, 0)
        roots[op] = root
    state_op = {int(sid): op for sid, op in catalog}
    cols = ("key_group, state_id, ukey, epoch, chunk, tombstone, chunks, expires_at_ms, "
            "vbytes, vjson, kjson")
    insert = (f"REPLACE INTO {store.t_state} (key_group, state_id, ukey, version, chunk, "
              "tombstone, chunks, expires_at_ms, fmt, vbytes, vjson, kjson) "
              "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    after: tuple[Any, ...] | None = None
    while True:
        where, params = "", []
        if after is not None:
            where = ("WHERE (key_group > ? OR (key_group = ? AND (state_id > ? OR (state_id = ? "
                     "AND (ukey > ? OR (ukey = ? AND (epoch > ? OR (epoch = ? AND "
                     "chunk > ?))))))))")
            kg, sid, ukey, ep, ch = after
            params = [kg, kg, sid, sid, ukey, ukey, ep, ep, ch]
        rows = store._read("copy format-1 rows", f"SELECT {cols} FROM {old_state} {where} "
                           "ORDER BY key_group, state_id, ukey, epoch, chunk LIMIT ?",
                           [*params, COPY_PAGE_ROWS])
        batch = []
        for kg, sid, ukey, ep, ch, tomb, chunks, exp, vb, vj, kj in rows:
            op = state_op.get(int(sid))
            if op is None:
                continue
            batch.append((kg, sid, ukey, (roots[op] << 32) | int(ep), ch, tomb, chunks, exp,
                          FORMAT_VERSION, vb, vj, kj))
        if batch:
            def copy(b: list[tuple[Any, ...]] = batch) -> None:
                store._executemany(insert, b)
            store._txn("copy format-1 rows", copy)
            counts["rows"] += len(batch)
            if progress is not None:
                progress(counts["rows"])
        if len(rows) < COPY_PAGE_ROWS:
            break
        last = rows[-1]
        after = (last[0], last[1], bytes(last[2]), last[3], last[4])
    for op in operators:
        def snapshots(op: str = op) -> None:
            for m_op, epoch, kind in markers:
                if m_op != op or int(kind) not in (0, 1):
                    continue
                store._execute(
                    f"{store._insert_ignore()} INTO {store.t_snapshots} (operator, branch_id, "
                    "epoch, kind, status, kg_start, kg_end, created_ms, job_id) VALUES "
                    "(?, ?, ?, ?, ?, 0, ?, ?, 'migrated')",
                    (op, roots[op], int(epoch), KIND_SAVEPOINT if int(kind) else
                     KIND_CHECKPOINT, PENDING if int(kind) else COMPLETED, ROOT_KG_END,
                     now_ms()))
        store._txn("convert markers", snapshots)
        checkpoints = [int(e) for m, e, k in markers if m == op and int(k) == 0]
        counts["checkpoints"] += len(checkpoints)
        counts["savepoints"] += sum(1 for m, _, k in markers if m == op and int(k) == 1)
        latest = max(checkpoints, default=None)
        committed = None if latest is None else Descriptor(
            (Token(roots[op], latest, 0, ROOT_KG_END),))

        def owner_row(op: str = op, committed: Descriptor | None = committed,
                      latest: int | None = latest) -> None:
            store._execute(f"{store._insert_ignore()} INTO {store.t_operators} (operator, "
                           "owners, committed, committed_ckpt, fmt, updated_ms) VALUES "
                           "(?, '[]', NULL, 0, ?, ?)", (op, FORMAT_VERSION, now_ms()))
            store._execute(f"UPDATE {store.t_operators} SET committed = ?, committed_ckpt = ? "
                           "WHERE operator = ?", (None if committed is None else
                                                  committed.to_json(), latest or 0, op))
        store._txn("write owner row", owner_row)
    store._txn("update catalog", lambda: store._execute(
        f"UPDATE {store.t_catalog} SET format_version = ?", (FORMAT_VERSION,)))
    for table in (old_state, store.t_legacy_epochs):
        def drop(t: str = table) -> None:
            store._execute(f"DROP TABLE IF EXISTS {t}")
        store._retry("drop format-1 tables", drop)
    return counts
