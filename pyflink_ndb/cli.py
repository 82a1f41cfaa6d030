"""`pyflink-ndb`: read committed state with SQL while a job runs, manage savepoint pins."""

from __future__ import annotations

import json
from typing import Any

import click

from pyflink_ndb.config import NdbStateOptions, resolve_sqlite_url
from pyflink_ndb.errors import NdbStateError
from pyflink_ndb.serialization.keys import decode_key, split_key
from pyflink_ndb.serialization.values import decode_value
from pyflink_ndb.stores.base import StateStore
from pyflink_ndb.stores.factory import open_store

_url = click.option("--url", required=True, envvar="PYFLINK_NDB_URL",
                    help="state.backend.ndb.url, e.g. mysql://root@127.0.0.1:3306/test.")
_namespace = click.option("--namespace", default="default", show_default=True)


def _open(url: str, namespace: str) -> StateStore:
    """Open an existing namespace read-only; a one-line error instead of a traceback."""
    try:
        return open_store(NdbStateOptions(url=resolve_sqlite_url(url), namespace=namespace),
                          create=False)
    except NdbStateError as err:
        raise click.ClickException(str(err)) from err


@click.group()
def main() -> None:
    """Inspect the state that pyflink-ndb jobs committed."""


@main.command()
@_url
@_namespace
@click.option("--operator", default=None, help="Operator uid (default: all).")
@click.option("--state", "state_name", default=None, help="State name (default: all).")
@click.option("--limit", default=20, show_default=True,
              help="Entries to print (0: all); only what is printed is read.")
@click.option("--sql", "show_sql", is_flag=True,
              help="Print the SQL (and its parameters) of one operator's committed state.")
def query(url: str, namespace: str, operator: str | None, state_name: str | None,
          limit: int, show_sql: bool) -> None:
    """Print the committed state (the operator's latest completed checkpoint): one JSON
    line per entry (key, value, checkpoint)."""
    store = _open(url, namespace)
    try:
        if show_sql:
            if operator is None:
                raise click.ClickException("--sql needs --operator: each operator's "
                                           "committed checkpoint is its own.")
            sql, params = store.committed_sql(operator)
            click.echo(store._sql(sql))
            click.echo("-- parameters: " + json.dumps(params, default=repr))
            return
        if limit < 0:
            raise click.ClickException(f"--limit must be 0 (all) or more, not {limit}.")
        known = {o.operator: o for o in store.operators()}
        if operator is not None and operator not in known:
            raise click.ClickException(
                f"Namespace {namespace!r} has no operator {operator!r}; its operators: "
                f"{', '.join(sorted(known)) or 'none'}.")
        ops = [operator] if operator is not None else sorted(known)
        if state_name is not None:
            names = {r["state_name"] for op in ops for r in store.catalog(op)}
            if state_name not in names:
                raise click.ClickException(
                    f"No state {state_name!r} in operator(s) {', '.join(ops) or 'none'}; "
                    f"states: {', '.join(sorted(names)) or 'none'}.")
        for op in ops:
            if known[op].committed is None:
                click.echo(f"-- operator {op!r} has no completed checkpoint yet (readers see "
                           "checkpoints, not savepoints)", err=True)
        printed = 0
        for op in ops:
            page = min(limit, 1000) if limit else 1000
            for row in store.iter_committed(op, state_name, page_rows=page):
                if limit and printed >= limit:
                    break
                value = decode_value(row["vbytes"]) if row["vjson"] is None else json.loads(
                    row["vjson"])
                prefix, rest = split_key(row["ukey"])
                key = (json.loads(row["kjson"]) if row["kjson"] is not None
                       else repr(decode_key(prefix)))
                entry = {"operator": row["operator"], "state": row["state_name"], "key": key}
                if rest:
                    entry["entry"] = repr(decode_key(rest))
                entry.update(value=value, checkpoint=row["checkpoint"])
                click.echo(json.dumps(entry, default=repr))
                printed += 1
        click.echo(f"-- {printed} committed entries printed from {store.describe()}", err=True)
    except NdbStateError as err:
        raise click.ClickException(str(err)) from err
    finally:
        store.close()


def _release(url: str, namespace: str, operator: str, checkpoint_id: int,
             branches: tuple[int, ...], job: str | None) -> None:
    store = _open(url, namespace)
    try:
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
            listing = "; ".join(f"{r.kind} {r.epoch} ({r.status}, job {r.job_id}, --branch "
                                f"{r.branch})" for r in snapshots)
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
    except NdbStateError as err:
        raise click.ClickException(str(err)) from err
    finally:
        store.close()


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
        raise click.ClickException(str(err)) from err
    finally:
        store.close()


@main.command()
@click.option("--url", default=None, envvar="PYFLINK_NDB_URL",
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


if __name__ == "__main__":
    main()
