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
            click.echo(sql)
            click.echo("-- parameters: " + json.dumps(params, default=repr))
            return
        ops = [operator] if operator is not None else [o.operator for o in store.operators()]
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
        found = [r for r in store.list_snapshots(operator) if r.epoch == checkpoint_id
                 and (not branches or r.branch in branches) and (job is None or r.job_id == job)]
        if not found:
            listed = sorted({r.epoch for r in store.list_snapshots(operator)})
            raise click.ClickException(
                f"Operator {operator!r} has no snapshot {checkpoint_id} matching the filters; "
                f"its snapshots: {listed or 'none'}.")
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
        keep = [r for r in found if (r.branch, r.epoch) in committed
                or (r.branch in owners and r.kind != "savepoint")]
        if keep:
            raise click.ClickException(
                f"Snapshot {checkpoint_id} of {operator!r} is a retained checkpoint of the "
                "job that runs now (or what readers see): Flink subsumes it itself. Only "
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
                 help="The snapshot's checkpoint id (in its path: savepoint-<job>-<...> or "
                      "chk-<id>)."),
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
            raise click.ClickException(f"Namespace {namespace!r} in {store.describe()} holds no "
                                       "format-1 state: nothing to migrate.")
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
