"""`pyflink-ndb`: read committed state with SQL while a job runs, manage savepoint pins."""

from __future__ import annotations

import json

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
              help="Entries to print (0: all); the total goes to stderr.")
@click.option("--sql", "show_sql", is_flag=True, help="Print the SQL instead of running it.")
def query(url: str, namespace: str, operator: str | None, state_name: str | None,
          limit: int, show_sql: bool) -> None:
    """Print the committed state: one JSON line per entry (key, value, epoch)."""
    store = _open(url, namespace)
    try:
        if show_sql:
            click.echo(store.committed_view_sql())
            return
        rows = store.query_committed(operator, state_name)
        for row in rows[:limit] if limit else rows:
            value = decode_value(row["vbytes"]) if row["vjson"] is None else json.loads(
                row["vjson"])
            prefix, rest = split_key(row["ukey"])
            key = (json.loads(row["kjson"]) if row["kjson"] is not None
                   else repr(decode_key(prefix)))
            entry = {"operator": row["operator"], "state": row["state_name"], "key": key}
            if rest:
                entry["entry"] = repr(decode_key(rest))
            entry.update(value=value, epoch=row["epoch"])
            click.echo(json.dumps(entry, default=repr))
        click.echo(f"-- {len(rows)} committed entries in {store.describe()}", err=True)
    finally:
        store.close()


@main.command("release-savepoint")
@_url
@_namespace
@click.option("--operator", required=True)
@click.option("--epoch", type=int, required=True)
def release_savepoint(url: str, namespace: str, operator: str, epoch: int) -> None:
    """Unpin a savepoint's epoch so garbage collection may reclaim its versions."""
    store = _open(url, namespace)
    try:
        removed = store.release_savepoint(operator, epoch)
        click.echo(f"released {removed} pin(s) of epoch {epoch} of {operator}")
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
