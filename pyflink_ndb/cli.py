"""`pyflink-ndb`: show the state as the job sees it (status, get, scan, query), SQL views
for any MySQL client, savepoints and their release, dropping and migrating namespaces."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import click

from pyflink_ndb.config import NdbStateOptions, redact_url, resolve_sqlite_url
from pyflink_ndb.errors import NdbStateError, StaleReadError
from pyflink_ndb.operator_ids import operator_id_of_uid
from pyflink_ndb.serialization.keys import decode_key, split_key
from pyflink_ndb.serialization.values import JsonRenderer, decode_value, json_renderer
from pyflink_ndb.stores.base import (
    BranchOrigin,
    SnapshotRow,
    StateStore,
    restored_by_other_jobs,
    retained_by_other_runs,
    stopped_runs,
    utc_text,
)
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.stores.inspect import (
    KEY_TYPES,
    Cursor,
    StateEntry,
    StateInfo,
    iter_entries,
    list_namespaces,
    parse_key,
    sample_keys,
    snapshot_descriptor,
    states_of,
    storage_by_state,
    to_jsonable,
)
from pyflink_ndb.stores.lineage import Descriptor
from pyflink_ndb.stores.views import (
    check_server,
    create_views,
    drop_views,
    view_names,
    views_sql,
)

_url = click.option("--url", required=True, envvar="PYFLINK_NDB_URL", show_envvar=True,
                    help="state.backend.ndb.url, e.g. mysql://root@127.0.0.1:3306/test.")
_namespace = click.option("--namespace", default="default", show_default=True)


#: The job's option names in store errors, and what a user of this CLI gives instead: the
#: CLI takes the whole URL, with its user and password, as --url (or PYFLINK_NDB_URL).
_JOB_TERMS = (
    ("(in state.backend.ndb.url, `mysql://USER@host:port/db`, or state.backend.ndb.user) "
     "and the password (state.backend.ndb.password, password-file or password-env)",
     "and the password in --url (`mysql://USER:PASSWORD@host:port/db`; or set "
     "PYFLINK_NDB_URL)"),
    ("state.backend.ndb.url=", "--url "),
    ("state.backend.ndb.url", "--url (or PYFLINK_NDB_URL)"),
)


def _cli_error(err: NdbStateError) -> click.ClickException:
    """`err` as a one-line error of this CLI: where the store's message names the job's
    options for the URL, user and password (`state.backend.ndb.url`, ...), it names
    --url, which is where a user of the CLI gives them (a new user's trial)."""
    message = str(err)
    for job_term, cli_term in _JOB_TERMS:
        message = message.replace(job_term, cli_term)
    return click.ClickException(message)


def _open(url: str, namespace: str) -> StateStore:
    """Open an existing namespace read-only; a one-line error instead of a traceback (for
    a namespace the store does not hold, one that names those it holds)."""
    try:
        return open_store(NdbStateOptions(url=resolve_sqlite_url(url), namespace=namespace),
                          create=False)
    except NdbStateError as err:
        probe = _connect_only(url, namespace)
        try:
            if namespace not in list_namespaces(probe):
                raise _no_namespace(probe, namespace) from err
        except NdbStateError:
            pass  # the probe failed too: the first error says more
        finally:
            probe.close()
        raise _cli_error(err) from err


@contextlib.contextmanager
def _opened(opener: Callable[[str, str], StateStore], url: str, namespace: str
            ) -> Iterator[StateStore]:
    """The store `opener` opens, closed after the command; a store error becomes a
    one-line error instead of a traceback."""
    store = opener(url, namespace)
    try:
        yield store
    except NdbStateError as err:
        raise _cli_error(err) from err
    finally:
        store.close()


@click.group()
@click.version_option(package_name="pyflink-ndb", prog_name="pyflink-ndb")
def main() -> None:
    """Inspect the state that pyflink-ndb jobs committed."""


@main.command()
@_url
@_namespace
@click.option("--operator", default=None, help="Operator: its uid (default: all).")
@click.option("--state", "state_name", default=None, help="State name (default: all).")
@click.option("--limit", default=20, show_default=True,
              help="Entries to print (0: all); only what is printed is read.")
@click.option("--sql", "show_sql", is_flag=True,
              help="Print the SQL (and its parameters) of one operator's committed state "
                   "(of one state with --state).")
def query(url: str, namespace: str, operator: str | None, state_name: str | None,
          limit: int, show_sql: bool) -> None:
    """Print the committed state (the operator's latest completed checkpoint): one JSON
    line per entry (key, value, checkpoint)."""
    with _opened(_open, url, namespace) as store:
        if show_sql:
            if operator is None:
                raise click.ClickException("--sql needs --operator: each operator's "
                                           "committed checkpoint is its own.")
            operator = _resolve_operator(namespace, operator,
                                         [o.operator for o in store.operators()])
            sql, params = store.committed_sql(operator)
            if state_name is not None:
                _states(store, [operator], state_name)  # the error when it has no such state
                sql, params = f"{sql} AND c.state_name = ?", [*params, state_name]
            click.echo(store._sql(sql))
            click.echo("-- parameters: " + json.dumps(params, default=repr))
            return
        if limit < 0:
            raise click.ClickException(f"--limit must be 0 (all) or more, not {limit}.")
        known = {o.operator: o for o in store.operators()}
        if operator is not None:
            operator = _resolve_operator(namespace, operator, known)
        ops = [operator] if operator is not None else sorted(known)
        if state_name is not None:
            _states(store, ops, state_name)  # the error when none of them has the state
        for op in ops:
            if known[op].committed is None:
                click.echo(f"-- operator {op!r} has no completed checkpoint yet (readers see "
                           "checkpoints, not savepoints)", err=True)
        printed = 0
        for op in ops:
            page = min(limit, 1000) if limit else 1000
            renderers = {int(r["state_id"]): json_renderer(r["state_kind"],
                                                           ttl=r["ttl_ms"] is not None)
                         for r in store.catalog(op)}
            for row in store.iter_committed(op, state_name, page_rows=page):
                if limit and printed >= limit:
                    break
                value = _printed_value(row, renderers[int(row["state_id"])])
                prefix, rest = split_key(row["ukey"])
                key = (json.loads(row["kjson"]) if row["kjson"] is not None
                       else to_jsonable(decode_key(prefix)))
                entry = {"operator": row["operator"], "state": row["state_name"], "key": key}
                if rest:
                    entry["entry"] = to_jsonable(decode_key(rest))
                entry.update(value=value, checkpoint=row["checkpoint"])
                click.echo(json.dumps(entry, default=repr))
                printed += 1
        noun = "entry" if printed == 1 else "entries"
        click.echo(f"-- {printed} committed {noun} printed from {store.describe()}", err=True)


def _printed_value(row: dict[str, Any], renderer: JsonRenderer) -> Any:
    """The value `query` prints for a committed row: its `vjson`, else the JSON its state's
    renderer makes of its bytes (a value written with `write.value-json: false`, or over
    one chunk), else the decoded bytes (no JSON form).

    :raises SerializationError: the bytes cannot be unpickled.
    """
    if row["vjson"] is not None:
        return json.loads(row["vjson"])
    text = renderer(row["vbytes"])
    return decode_value(row["vbytes"]) if text is None else json.loads(text)


def _release(url: str, namespace: str, operator: str, checkpoint_id: int,
             branches: tuple[int, ...], job: str | None) -> None:
    with _opened(_open, url, namespace) as store:
        operator = _resolve_operator(namespace, operator,
                                     [o.operator for o in store.operators()])
        row = store.read_operator(operator)
        owners = {br for _, _, br in row.owners} if row is not None else set()
        committed = set() if row is None or row.committed is None else {
            (t.branch, t.epoch) for t in row.committed.parts}
        if row is None:
            known = sorted(o.operator for o in store.operators())
            raise click.ClickException(
                f"Namespace {namespace!r} has no operator {operator!r}; its operators: "
                f"{', '.join(known) or 'none'}.")
        snapshots = store.list_snapshots(operator)
        found = [r for r in snapshots if r.epoch == checkpoint_id
                 and (not branches or r.branch in branches) and (job is None or r.job_id == job)]
        if not found:
            # One line per snapshot of a job (its subtasks' rows together): --job tells
            # two jobs' same checkpoint id apart, --branch one subtask's part.
            grouped: dict[tuple[int, str, str], list[SnapshotRow]] = {}
            for r in snapshots:
                grouped.setdefault((r.epoch, r.kind, r.job_id), []).append(r)
            listing = "; ".join(
                f"{kind} {epoch} ({'/'.join(sorted({r.status for r in rows}))}, job {job_id}, "
                f"{len(rows)} subtask snapshot(s))"
                for (epoch, kind, job_id), rows in sorted(grouped.items()))
            raise click.ClickException(
                f"Operator {operator!r} has no snapshot {checkpoint_id}"
                + (" with that --job/--branch" if branches or job else "")
                + f"; its restorable snapshots: {listing or 'none'}.")
        by_job: dict[str, list[int]] = {}
        for r in found:
            by_job.setdefault(r.job_id, []).append(r.branch)
        if len(by_job) > 1 and not branches and job is None:
            raise click.ClickException(
                f"Snapshot {checkpoint_id} of {operator!r} exists in several jobs (checkpoint "
                "ids repeat across jobs started from one snapshot): "
                + "; ".join(f"job {j}: --branch {' --branch '.join(map(str, bs))}"
                            for j, bs in sorted(by_job.items()))
                + ". Name one with --job or --branch.")
        if any((r.branch, r.epoch) in committed for r in found):
            raise click.ClickException(
                f"Checkpoint {checkpoint_id} of {operator!r} is what readers see (the latest "
                "completed checkpoint): a later completed checkpoint frees it.")
        if any(r.branch in owners and r.kind != "savepoint" for r in found):
            raise click.ClickException(
                f"Checkpoint {checkpoint_id} of {operator!r} belongs to the attempts that own "
                "the operator now: Flink subsumes its own retained checkpoints. Only "
                "savepoints and checkpoints of jobs that no longer run can be released.")
        removed = store.delete_snapshots(operator, [(r.branch, r.epoch) for r in found])
        kinds = sorted({r.kind for r in found})
        click.echo(f"released {'/'.join(kinds)} {checkpoint_id} of {operator} ({removed} "
                   "subtask snapshot(s)); garbage collection reclaims what only it needed")


_release_options = [
    click.option("--operator", required=True),
    click.option("--checkpoint", "checkpoint_id", type=int, required=True,
                 help="The snapshot's checkpoint id (a retained checkpoint's folder is "
                      "chk-<id>; a wrong id lists the restorable snapshots with their ids)."),
    click.option("--branch", "branches", type=int, multiple=True,
                 help="Only the subtask snapshots of these branches (repeatable)."),
    click.option("--job", default=None, help="Only the snapshot of this Flink job id."),
]


def _with_release_options(f: Any) -> Any:
    for option in reversed(_release_options):
        f = option(f)
    return _namespace(_url(f))


@main.command("release")
@_with_release_options
def release(url: str, namespace: str, operator: str, checkpoint_id: int,
            branches: tuple[int, ...], job: str | None) -> None:
    """Release a savepoint, or a checkpoint of a job that no longer runs, so that garbage
    collection may reclaim what only it needs; restoring it afterwards fails."""
    _release(url, namespace, operator, checkpoint_id, branches, job)


@main.command("release-savepoint", hidden=True)
@_with_release_options
def release_savepoint(url: str, namespace: str, operator: str, checkpoint_id: int,
                      branches: tuple[int, ...], job: str | None) -> None:
    """Same as `release`."""
    _release(url, namespace, operator, checkpoint_id, branches, job)


@main.command()
@_url
@_namespace
def migrate(url: str, namespace: str) -> None:
    """Convert a namespace written by row format 1 to format 2 (run it with no job on it)."""
    from pyflink_ndb.stores.factory import create_store
    from pyflink_ndb.stores.migrate import migrate as run_migration

    store = create_store(NdbStateOptions(url=resolve_sqlite_url(url), namespace=namespace))
    try:
        store.connect()
        if not store._table_exists(store.t_legacy_epochs):
            if not store._table_exists(store.t_state):
                raise click.ClickException(
                    f"Namespace {namespace!r} in {store.describe()} has no pyflink-ndb "
                    "tables. Check --url and --namespace.")
            click.echo(f"namespace {namespace} already holds row format 2: nothing to migrate")
            return
        counts = run_migration(store)
        store.open(create=False)
        click.echo(f"migrated {namespace}: {counts['operators']} operator(s), {counts['rows']} "
                   f"rows, {counts['checkpoints']} checkpoint(s), {counts['savepoints']} "
                   "savepoint(s)")
    except NdbStateError as err:
        raise _cli_error(err) from err
    finally:
        store.close()


@main.command()
@click.option("--url", default=None, envvar="PYFLINK_NDB_URL", show_envvar=True,
              help="Also check that this store answers (state.backend.ndb.url).")
def doctor(url: str | None) -> None:
    """Check what thread-mode jobs with tiered state need on this machine."""
    from pyflink_ndb.diagnostics import run_checks

    failed = 0
    for check in run_checks(url):
        mark = "ok  " if check.ok else "FAIL"
        click.echo(f"{mark} {check.name}: {check.detail}")
        if not check.ok:
            failed += 1
            click.echo(f"     fix: {check.fix}")
    if failed:
        raise click.ClickException(f"{failed} check(s) failed")



# -- state as the job sees it -------------------------------------------------------------
_format = click.option("--format", "fmt", type=click.Choice(["table", "json"]),
                       default="table", show_default=True,
                       help="Aligned columns, or one JSON object per line.")
_key_type = click.option("--key-type", type=click.Choice(KEY_TYPES), default="str",
                         show_default=True,
                         help="How to read KEY/--key: a string, an int, a float, or a Python "
                              "literal (tuples, bytes b'..', None; a ROW key as "
                              "Row(f0='a', f1=1)).")
_STALE_ATTEMPTS = 3


def _connect_only(url: str, namespace: str) -> StateStore:
    """A store connected without checking its tables (status, drop); creates no file."""
    from pathlib import Path

    from pyflink_ndb.stores.factory import create_store

    try:
        options = NdbStateOptions(url=resolve_sqlite_url(url), namespace=namespace)
        if options.url.startswith("sqlite:///"):
            path = options.url[len("sqlite:///"):]
            if path != ":memory:" and not Path(path).exists():
                raise click.ClickException(f"No SQLite store at {path!r}: check --url.")
        store = create_store(options)
        store.connect()
        return store
    except NdbStateError as err:
        raise _cli_error(err) from err


def _no_namespace(store: StateStore, namespace: str) -> click.ClickException:
    names = list_namespaces(store)
    return click.ClickException(
        f"{store.describe()} has no pyflink-ndb namespace {namespace!r}; its namespaces: "
        f"{', '.join(names) or 'none'}.")


def _operators(store: StateStore, namespace: str, operator: str | None) -> list[str]:
    """The operators to show: all, or the one named (an error that lists them otherwise)."""
    known = sorted(o.operator for o in store.operators())
    if operator is None:
        return known
    return [_resolve_operator(namespace, operator, known)]


def _resolve_operator(namespace: str, operator: str, known: Any) -> str:
    """`operator` as stored: the name itself, or, for an operator of the job-wide switch
    (stored under its Flink operator ID), the ID of the uid given.

    :raises click.ClickException: neither is an operator of the namespace (lists them)."""
    if operator in known:
        return operator
    flink_id = operator_id_of_uid(operator)
    if flink_id in known:
        return flink_id
    raise click.ClickException(
        f"Namespace {namespace!r} has no operator {operator!r} (nor one whose Flink operator "
        f"ID is that uid's, {flink_id}); its operators: {', '.join(sorted(known)) or 'none'}.")


def _states(store: StateStore, ops: Sequence[str], state_name: str | None
            ) -> dict[str, list[StateInfo]]:
    """The states to show per operator (an error that lists them when none is named so)."""
    out = {op: [s for s in states_of(store, op) if state_name in (None, s.name)]
           for op in ops}
    if state_name is not None and not any(out.values()):
        names = sorted({s.name for op in ops for s in states_of(store, op)})
        raise click.ClickException(
            f"No state {state_name!r} in operator(s) {', '.join(ops) or 'none'}; states: "
            f"{', '.join(names) or 'none'}.")
    return out


def _key_sample(store: StateStore, states: dict[str, list[StateInfo]], count: int = 10
                ) -> list[str]:
    """Up to `count` distinct committed keys of `states` (by operator ID), as compact JSON,
    for errors that list what exists (a key held by several states is listed once)."""
    texts = (_compact(key, 40) for op in sorted(states)
             for key in sample_keys(store, op, states[op], count))
    return list(dict.fromkeys(texts))[:count]


def _key_hint(key_type: str, sample: Sequence[str]) -> str:
    """What to add to a "no such key" error: how to give a key that is not a string, and
    how to give a ROW key when the state holds keys that print as JSON objects (PyFlink
    names a ROW key's fields f0, f1, ...)."""
    parts = []
    if key_type == "str":
        parts.append("a key that is not a string needs --key-type: --key-type int 42, "
                     "--key-type python \"('a', 1)\" for a tuple printed as [\"a\",1]")
    if any(text.startswith("{") for text in sample):
        parts.append("a ROW key printed as {\"f0\":\"a\",\"f1\":1} is given as "
                     "--key-type python \"Row(f0='a', f1=1)\"")
    return f" ({'; '.join(parts)})" if parts else ""


def _compact(value: Any, width: int) -> str:
    text = json.dumps(to_jsonable(value), ensure_ascii=False, separators=(",", ":"))
    return text if width <= 0 or len(text) <= width else text[:max(width - 1, 1)] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Lines of an aligned table (the last column is not padded)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in [list(headers), *cells]]


def _entry_json(entry: StateEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"operator": entry.operator, "state": entry.state,
                           "kind": entry.kind, "key": to_jsonable(entry.key),
                           "value": to_jsonable(entry.value), "checkpoint": entry.checkpoint,
                           "key_group": entry.key_group}
    if entry.expires_at_ms is not None:
        out["expires_at_ms"] = entry.expires_at_ms
    return out


def _ttl(ttl_ms: int | None) -> str:
    if ttl_ms is None:
        return "-"
    return f"{ttl_ms / 1000:g} s" if ttl_ms < 3_600_000 else f"{ttl_ms / 3_600_000:g} h"


def _segments_text(parts: Sequence[Sequence[Any]]) -> str:
    return ", ".join(f"key groups {a}-{b}: branch {br}" + (f" @{e}" if e is not None else "")
                     for a, b, br, e in parts)


#: `savepoints --all`: a checkpoint of a job its subtasks saw stopped with a savepoint.
STOPPED_NOTE = ("kept until released (its job was stopped with a savepoint: Flink deleted "
                "it, unless the job failed while stopping)")


def _snapshot_groups(snapshots: Sequence[SnapshotRow], committed: set[tuple[int, int]],
                     owners: set[int], origins: dict[int, BranchOrigin]
                     ) -> list[dict[str, Any]]:
    """Restorable snapshots grouped per (kind, checkpoint, job): what `release` takes.
    `origins`: the operator's branch origins (`StateStore.branch_origins`), which tell the
    snapshots a job was started from and the checkpoints an ended job kept."""
    pinned = restored_by_other_jobs(origins, snapshots)
    claimed = {key for o in origins.values() for key in o.claimed}
    # What the retention of the key groups' current owners leaves to the user (of every
    # owner's run, when a partial claim left owners of several runs).
    owner_runs = {origins[br].run for br in owners if br in origins} or {""}
    kept = set.intersection(*(retained_by_other_runs(origins, snapshots, run)
                              for run in owner_runs))
    stopped = stopped_runs(origins)
    groups: dict[tuple[str, int, str], list[SnapshotRow]] = {}
    for r in snapshots:
        groups.setdefault((r.kind, r.epoch, r.job_id), []).append(r)
    out = []
    for (kind, epoch, job), rows in sorted(groups.items(), key=lambda g: (g[0][1], g[0][0])):
        keys = {(r.branch, r.epoch) for r in rows}
        if keys & committed:
            note = "readers see it"
        elif any(r.status != "completed" for r in rows):
            note = "pending (not completed)"
        elif keys & claimed and not keys & pinned:
            note = "claimed by the job started from it (goes once that job subsumes it)"
        elif kind == "savepoint":
            note = "pinned until released"
        elif keys & pinned:
            note = "pinned until released (a job was started from it)"
        elif all(r.branch in origins and origins[r.branch].run in stopped for r in rows) \
                and kind == "checkpoint":
            note = STOPPED_NOTE
        elif keys & kept and not any(r.branch in owners for r in rows):
            note = "kept until released (its job retains its checkpoints when it ends)"
        elif any(r.branch in owners for r in rows):
            # Owners are the latest attempt of each key group, which may have ended: the
            # store cannot tell a running job from one that stopped.
            note = "retained for the key groups' current owner (the latest job)"
        else:
            note = "side snapshot (releasable)"
        out.append({"kind": kind, "checkpoint": epoch, "job": job,
                    "status": "/".join(sorted({r.status for r in rows})),
                    "subtasks": len(rows), "branches": sorted({r.branch for r in rows}),
                    "key_groups": sorted([r.kg_start, r.kg_end] for r in rows),
                    "created": utc_text(min(r.created_ms for r in rows)), "note": note})
    return out


def _namespace_status(url: str, namespace: str) -> dict[str, Any]:
    with _opened(_open, url, namespace) as store:
        stats = storage_by_state(store)
        operators = []
        for row in store.operators():
            committed = [] if row.committed is None else [
                [t.kg_start, t.kg_end, t.branch, t.epoch] for t in row.committed.parts]
            states = []
            for info in states_of(store, row.operator):
                st = stats.get(info.state_id)
                spread = None if st is None else st.spread()
                states.append({
                    "name": info.name, "kind": info.kind, "ttl_ms": info.ttl_ms,
                    "rows": 0 if st is None else st.rows,
                    "bytes": 0 if st is None else st.bytes,
                    "key_groups": 0 if st is None else st.key_groups,
                    "rows_per_key_group": None if spread is None else dict(
                        zip(("min", "median", "max"), spread, strict=True))})
            snapshots = store.list_snapshots(row.operator)
            operators.append({
                "operator": row.operator,
                "committed_checkpoint": None if row.committed is None
                else row.committed.checkpoint_id,
                "committed": committed,
                "owners": [list(o) for o in row.owners],
                "states": states,
                "snapshots": _snapshot_groups(
                    snapshots, {(c[2], c[3]) for c in committed},
                    {br for _, _, br in row.owners}, store.branch_origins(row.operator))})
        return {"namespace": namespace, "store": store.describe(), "operators": operators}


def _print_status(doc: dict[str, Any]) -> None:
    click.echo(f"namespace {doc['namespace']}  ({doc['store']})")
    if not doc["operators"]:
        click.echo("  no operator yet")
    for op in doc["operators"]:
        click.echo(f"  operator {op['operator']}")
        if op["committed_checkpoint"] is None:
            click.echo("    readers see:  nothing yet (no completed checkpoint)")
        else:
            click.echo(f"    readers see:  checkpoint {op['committed_checkpoint']} "
                       f"({_segments_text(op['committed'])})")
        click.echo("    owners:       " + (_segments_text([[*o, None] for o in op["owners"]])
                                           or "none"))
        click.echo("    states:")
        rows = []
        for st in op["states"]:
            spread = st["rows_per_key_group"]
            rows.append([st["name"], st["kind"], _ttl(st["ttl_ms"]), f"{st['rows']:,}",
                         f"{st['bytes']:,}", st["key_groups"],
                         "-" if spread is None else
                         f"{spread['min']}/{spread['median']}/{spread['max']}"])
        for line in _table(["STATE", "KIND", "TTL", "ROWS", "BYTES", "KEY GROUPS",
                            "ROWS PER KEY GROUP (min/median/max)"], rows):
            click.echo("      " + line)
        click.echo("    restorable snapshots:" + ("" if op["snapshots"] else " none"))
        if op["snapshots"]:
            for line in _table(
                    ["KIND", "CHECKPOINT", "STATUS", "SUBTASKS", "BRANCHES", "JOB", "CREATED",
                     "NOTE"],
                    [[s["kind"], s["checkpoint"], s["status"], s["subtasks"],
                      ",".join(map(str, s["branches"])), s["job"], s["created"], s["note"]]
                     for s in op["snapshots"]]):
                click.echo("      " + line)


@main.command()
@_url
@click.option("--namespace", default=None,
              help="Namespace to show (default: every namespace in the database).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of text.")
def status(url: str, namespace: str | None, as_json: bool) -> None:
    """Show namespaces, operators, states (kind, TTL, stored rows and bytes, spread over key
    groups), what readers see (the latest completed checkpoint) and the restorable
    checkpoints and savepoints.

    Row and byte counts are of the stored rows: every version garbage collection keeps
    (docs/protocol.md) and every chunk; counting them reads the whole state table once.
    """
    probe = _connect_only(url, namespace or "default")
    try:
        names = list_namespaces(probe)
        if namespace is not None and namespace not in names:
            raise _no_namespace(probe, namespace)
    except NdbStateError as err:
        raise _cli_error(err) from err
    finally:
        probe.close()
    docs = []
    for name in [namespace] if namespace is not None else names:
        try:
            docs.append(_namespace_status(url, name))
        except click.ClickException as err:
            if namespace is not None:
                raise
            docs.append({"namespace": name, "store": "", "operators": [],
                         "error": err.message})
    if as_json:
        click.echo(json.dumps(docs if namespace is None else docs[0], indent=2))
        return
    if not docs:
        click.echo("no pyflink-ndb namespace in this database")
    for doc in docs:
        if "error" in doc:
            click.echo(f"namespace {doc['namespace']}: {doc['error']}")
        else:
            _print_status(doc)


def _read_entries(store: StateStore, states: dict[str, list[StateInfo]], *, key: Any = None,
                  key_given: bool = False, after: Cursor | None = None,
                  limit: int | None = None, snapshots: dict[str, Descriptor] | None = None
                  ) -> Iterator[StateEntry]:
    """Entries of every operator in turn (after the cursor's position); `snapshots`: the
    snapshot to read per operator (None: what readers see)."""
    for op in sorted(states):
        if after is not None and op < after.operator:
            continue
        start = after if after is not None and after.operator == op else None
        yield from iter_entries(store, op, states[op], key=key, key_given=key_given,
                                after=start, limit=limit,
                                snapshot=None if snapshots is None else snapshots[op])


_checkpoint = click.option(
    "--checkpoint", "checkpoint_id", type=int, default=None,
    help="Read this savepoint or retained checkpoint (its Flink checkpoint id, as "
         "`savepoints --all` lists it) instead of what readers see.")
_job = click.option("--job", default=None,
                    help="With --checkpoint: the Flink job id that took it (a prefix will "
                         "do), where several jobs took a checkpoint of that id.")


def _snapshots(store: StateStore, ops: Sequence[str], checkpoint_id: int | None,
               job: str | None) -> dict[str, Descriptor] | None:
    """The snapshot each operator's reads use (`--checkpoint`, `--job`); None: what
    readers see."""
    if checkpoint_id is None:
        if job is not None:
            raise click.ClickException("--job chooses among the jobs of a --checkpoint; "
                                       "give --checkpoint N too.")
        return None
    chosen = {op: snapshot_descriptor(store, op, checkpoint_id, job) for op in ops}
    click.echo(f"-- checkpoint {checkpoint_id}{'' if job is None else ' of job ' + job}, "
               "not necessarily what readers see", err=True)
    return chosen


@main.command()
@_url
@_namespace
@click.option("--operator", default=None,
              help="Operator: its uid (default: the namespace's only operator).")
@click.option("--state", "state_name", default=None,
              help="State name (default: every state that holds the key).")
@_key_type
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="json",
              show_default=True)
@_checkpoint
@_job
@click.argument("key")
def get(url: str, namespace: str, operator: str | None, state_name: str | None,
        key_type: str, fmt: str, checkpoint_id: int | None, job: str | None,
        key: str) -> None:
    """Print one key's committed value, as the state API returns it (a ListState's list,
    a MapState's mapping; values of any size; TTL-expired: absent). --operator may be
    left out where the namespace has one operator; without --state, every state of the
    operator that holds the key is printed (one JSON line, or one table, each).
    --checkpoint reads a savepoint or retained checkpoint instead (what a restore from it
    would start with)."""
    with _opened(_open, url, namespace) as store:
        ops = _operators(store, namespace, operator)
        if len(ops) != 1:
            raise click.ClickException(
                f"Namespace {namespace!r} has {len(ops)} operators"
                f"{': ' + ', '.join(ops) if ops else ''}; name one with --operator.")
        operator = operator or ops[0]
        states = _states(store, ops, state_name)
        snapshots = _snapshots(store, ops, checkpoint_id, job)
        wanted = parse_key(key, key_type)
        for attempt in range(_STALE_ATTEMPTS):
            try:
                found = list(_read_entries(store, states, key=wanted, key_given=True,
                                           limit=1 if state_name is not None else None,
                                           snapshots=snapshots))
                break
            except StaleReadError:
                if attempt == _STALE_ATTEMPTS - 1:
                    raise
        if not found:
            sample = _key_sample(store, states)
            names = ", ".join(sorted({s.name for s in states[ops[0]]})) or "none"
            where = (f"State {state_name!r} of operator {operator!r} has no committed key "
                     f"{wanted!r}" if state_name else
                     f"Operator {operator!r} has no committed key {wanted!r} in any of its "
                     f"states ({names})")
            raise click.ClickException(
                f"{where}{_key_hint(key_type, sample)}; some of its keys: "
                f"{', '.join(sample) or 'none'} (pyflink-ndb scan lists them).")
        for n, entry in enumerate(found):
            doc = _entry_json(entry)
            if fmt == "json":
                click.echo(json.dumps(doc, ensure_ascii=False))
                continue
            if n:
                click.echo("")
            for line in _table(["FIELD", "VALUE"], [[k, _compact(v, 0) if k in (
                    "key", "value") else v] for k, v in doc.items()]):
                click.echo(line)


@main.command()
@_url
@_namespace
@click.option("--operator", default=None, help="Operator: its uid (default: all).")
@click.option("--state", "state_name", default=None, help="State name (default: all).")
@click.option("--key", "key_text", default=None, help="Only this Flink key.")
@click.option("--prefix", default=None,
              help="Only keys whose text starts with this (a string key itself, other keys "
                   "their JSON); filtered here, so it reads past what it skips.")
@_key_type
@click.option("--limit", default=20, show_default=True,
              help="Entries to print (0: all); without --prefix only what is printed is read.")
@click.option("--after", default=None,
              help="Continue after this position (printed at the end of a full page).")
@_format
@click.option("--width", default=60, show_default=True,
              help="Longest value text in the table (0: no limit).")
@_checkpoint
@_job
def scan(url: str, namespace: str, operator: str | None, state_name: str | None,
         key_text: str | None, prefix: str | None, key_type: str, limit: int,
         after: str | None, fmt: str, width: int, checkpoint_id: int | None,
         job: str | None) -> None:
    """Print committed entries page by page, one per state and key, decoded as the state API
    returns them (a ListState's list, a MapState's mapping, TTL-expired entries hidden).
    --checkpoint reads a savepoint or retained checkpoint instead of what readers see."""
    if key_text is not None and prefix is not None:
        raise click.ClickException("Give --key or --prefix, not both.")
    if limit < 0:
        raise click.ClickException(f"--limit must be 0 (all) or more, not {limit}.")
    with _opened(_open, url, namespace) as store:
        ops = _operators(store, namespace, operator)
        states = _states(store, ops, state_name)
        snapshots = _snapshots(store, sorted(states), checkpoint_id, job)
        cursor = None if after is None else Cursor.from_token(after)
        key = None if key_text is None else parse_key(key_text, key_type)

        def matches(entry: StateEntry) -> bool:
            """The key's text starts with `prefix`: a string key itself; any other key's
            JSON as the table prints it (compact) or as `--format json` does (spaced)."""
            if prefix is None:
                return True
            if isinstance(entry.key, str):
                return entry.key.startswith(prefix)
            data = to_jsonable(entry.key)
            return (json.dumps(data, ensure_ascii=False, separators=(",", ":"))
                    .startswith(prefix)
                    or json.dumps(data, ensure_ascii=False).startswith(prefix))

        entries = _read_entries(store, states, key=key, key_given=key_text is not None,
                                after=cursor, limit=None if prefix or not limit else limit,
                                snapshots=snapshots)
        printed = 0
        last: StateEntry | None = None
        buffered: list[StateEntry] = []
        headers = ["OPERATOR", "STATE", "KIND", "KEY", "VALUE", "CHECKPOINT"]

        def flush(first: bool) -> None:
            lines = _table(headers, [[e.operator, e.state, e.kind, _compact(e.key, 40),
                                      _compact(e.value, width), e.checkpoint]
                                     for e in buffered])
            for line in lines if first else lines[1:]:
                click.echo(line)
            buffered.clear()

        pages = 0
        if not limit or limit > 1_000:  # a long scan: progress on stderr (terminals only)
            from tqdm import tqdm

            entries = tqdm(entries, desc="scan", unit=" entries", file=sys.stderr,
                           disable=None, leave=False)
        for entry in entries:
            if not matches(entry):
                continue
            if fmt == "json":
                click.echo(json.dumps(_entry_json(entry), ensure_ascii=False))
            else:
                buffered.append(entry)
                if len(buffered) >= 100:
                    flush(pages == 0)
                    pages += 1
            printed += 1
            last = entry
            if limit and printed >= limit:
                break
        if buffered:
            flush(pages == 0)
        if printed == 0 and (key_text is not None or prefix is not None):
            what = f"key {key!r}" if key_text is not None else f"keys starting with {prefix!r}"
            sample = _key_sample(store, states)
            hint = "" if key_text is None else _key_hint(key_type, sample)
            raise click.ClickException(
                f"No committed entry with {what}{hint}; some keys: "
                f"{', '.join(sample) or 'none'}.")
        click.echo(f"-- {printed} {'entry' if printed == 1 else 'entries'} from "
                   f"{store.describe()}", err=True)
        if limit and printed >= limit and last is not None:
            click.echo(f"-- next page: --after {last.cursor.to_token()}", err=True)


@main.command()
@_url
@_namespace
@click.option("--operator", default=None, help="Operator: its uid (default: all).")
@click.option("--all", "show_all", is_flag=True,
              help="Every restorable snapshot (retained and side checkpoints too).")
@_format
def savepoints(url: str, namespace: str, operator: str | None, show_all: bool,
               fmt: str) -> None:
    """List the savepoints (pinned until released) of each operator; `pyflink-ndb release`
    releases one."""
    with _opened(_open, url, namespace) as store:
        ops = _operators(store, namespace, operator)
        rows = []
        for op in ops:
            row = store.read_operator(op)
            committed = set() if row is None or row.committed is None else {
                (t.branch, t.epoch) for t in row.committed.parts}
            owners = set() if row is None else {br for _, _, br in row.owners}
            snapshots = store.list_snapshots(op)
            for group in _snapshot_groups(snapshots, committed, owners,
                                          store.branch_origins(op)):
                if show_all or group["kind"] == "savepoint":
                    rows.append({"operator": op, **group})
        if fmt == "json":
            for r in rows:
                click.echo(json.dumps(r))
        elif rows:
            for line in _table(
                    ["OPERATOR", "KIND", "CHECKPOINT", "STATUS", "SUBTASKS", "BRANCHES", "JOB",
                     "CREATED", "NOTE"],
                    [[r["operator"], r["kind"], r["checkpoint"], r["status"], r["subtasks"],
                      ",".join(map(str, r["branches"])), r["job"], r["created"], r["note"]]
                     for r in rows]):
                click.echo(line)
        what = "restorable snapshot" if show_all else "savepoint"
        click.echo(f"-- {len(rows)} {what}{'' if len(rows) == 1 else 's'} in namespace "
                   f"{namespace}", err=True)
        if rows:
            click.echo(f"-- release one: pyflink-ndb release --url '{redact_url(url)}' "
                       f"--namespace {namespace} --operator OPERATOR --checkpoint N (OPERATOR: as "
                       "listed, or the uid it was given)", err=True)


@main.command()
@_url
@_namespace
@click.option("--operator", default=None, help="Operator: its uid (default: all).")
@click.option("--dry-run", is_flag=True, help="Count what would be removed; delete nothing.")
def gc(url: str, namespace: str, operator: str | None, dry_run: bool) -> None:
    """Run garbage collection now: delete the versions that no restorable checkpoint or
    savepoint, no reader and no running subtask needs (what the jobs' own collection
    deletes as checkpoints complete, over the whole namespace at once). Safe while jobs
    run: the versions of the key groups' current owners (the latest job's subtasks,
    running or ended: the store cannot tell) are left to them, and the job that restores
    their snapshot collects them."""
    from pyflink_ndb.checkpoint.offline_gc import collect_garbage_now

    with _opened(_open, url, namespace) as store:
        total = 0
        for op in _operators(store, namespace, operator):
            report = collect_garbage_now(store, op, dry_run=dry_run)
            total += report.versions_deleted
            click.echo(f"{op}: {report.entries:,} entries, {report.versions:,} versions; "
                       f"{'would remove' if dry_run else 'removed'} "
                       f"{report.versions_deleted:,} versions"
                       + ("" if dry_run else f" ({report.rows_deleted:,} rows)")
                       + (f"; {report.kept_as_owners:,} left to the key groups' current "
                          "owners (the latest job, running or ended; the job that restores "
                          "its snapshot collects them)" if report.kept_as_owners else ""))
        click.echo(f"{'would remove' if dry_run else 'removed'} {total:,} versions in "
                   f"namespace {namespace}")


@main.command()
@_url
@click.option("--namespace", required=True, help="The namespace to drop.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (scripts).")
def drop(url: str, namespace: str, yes: bool) -> None:
    """Drop a namespace for good: its state, checkpoint history, catalog and views. No
    job may run on it; every checkpoint and savepoint of it becomes unrestorable."""
    with _opened(_connect_only, url, namespace) as store:
        if namespace not in list_namespaces(store):
            raise _no_namespace(store, namespace)
        summary = ""
        if store._table_exists(store.t_operators):
            ops = [o.operator for o in store.operators()]
            summary = (f": {len(ops)} operator(s) ({', '.join(ops) or 'none'}), "
                       f"{store.count_rows():,} state rows")
        where = store.describe()
        if not yes:
            click.confirm(f"Drop namespace {namespace!r} in {where}{summary}? Its checkpoints "
                          "and savepoints become unrestorable", abort=True)
        dropped_views = drop_views(store)
        store.drop_tables()
        click.echo(f"dropped namespace {namespace} in {where}"
                   + (f" (and views {', '.join(dropped_views)})" if dropped_views else ""))


@main.group("views")
def views_group() -> None:
    """SQL views of the committed state that any MySQL client can query while the job runs
    (MariaDB 10.6+, MySQL 8.0+, RonDB)."""


@views_group.command("create")
@_url
@_namespace
@click.option("--print-sql", is_flag=True, help="Print the statements instead of running them.")
def views_create(url: str, namespace: str, print_sql: bool) -> None:
    """Create (or replace) `<ns>_committed`: one row per state and key of the latest
    completed checkpoint (a map state one per map key), values as JSON."""
    with _opened(_open, url, namespace) as store:
        if print_sql:
            check_server(store)
            for statement in views_sql(store):
                click.echo(statement + ";")
            return
        names = create_views(store)
        click.echo(f"created views {', '.join(names)} in {store.describe()}")
        click.echo(f"try: SELECT state, key_text, mkey, vjson, checkpoint FROM "
                   f"{view_names(namespace)[0]} LIMIT 10;")


@views_group.command("drop")
@_url
@_namespace
def views_drop(url: str, namespace: str) -> None:
    """Drop the namespace's views (its tables stay)."""
    with _opened(_open, url, namespace) as store:
        names = drop_views(store)
        click.echo(f"dropped views {', '.join(names)}" if names
                   else f"namespace {namespace} has no views")


if __name__ == "__main__":
    main()
