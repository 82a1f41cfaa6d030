"""Least-privilege grants of a database user for pyflink-ndb (RonDB, MySQL, MariaDB).

`python -m pyflink_ndb.stores.grants --user flink --database state --namespace flights`
prints the statements for an administrator to run; nothing connects to a database. What
each role needs comes from the SQL the package sends:

* `job` (the running job and the client that builds it): SELECT, INSERT, UPDATE, DELETE on
  the namespace's tables (REPLACE is an INSERT plus a DELETE; `SELECT ... LOCK IN SHARE
  MODE` and `FOR UPDATE` need UPDATE or DELETE besides SELECT), and CREATE (every open runs
  `CREATE TABLE IF NOT EXISTS`, which MySQL checks even when the table exists).
* `reader` (`pyflink-ndb query`, SQL readers): SELECT.
* `admin`: `job` plus DROP and ALTER, for dropping a namespace (`DROP TABLE`) and
  `pyflink-ndb migrate` (renames the row-format-1 state table, drops `ns_epochs`).

With a namespace the grants are table-level, on exactly the tables of that namespace
(MySQL accepts table-level grants on tables that do not exist yet when CREATE is among the
privileges; the `reader` role is granted on tables that must then already exist); without
one they are database-level (`db`.*, any namespace). On RonDB / MySQL NDB Cluster a user
exists only on the MySQL server where it was created unless it holds NDB_STORED_USER
(MySQL NDB Cluster 8.0.18 and later; RonDB): then the user and its grants are stored in
NDB and every MySQL server of the cluster has them (`ndb_stored_user=True`).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import ConfigurationError

#: Privileges per role (see the module docstring).
ROLE_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "job": ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE"),
    "reader": ("SELECT",),
    "admin": ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "ALTER"),
}
#: MySQL account names: up to 32 characters (MySQL 5.7+; MariaDB allows 80), here of a
#: safe alphabet so that the printed statements need no escaping.
_USER_RE = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
#: Account hosts: a host name, an IP address (v4 or v6), `localhost`, with `%`/`_` wildcards
#: or a `/` netmask.
_HOST_RE = re.compile(r"^[A-Za-z0-9_.%:/-]{1,255}$")
#: Database names, unquoted-identifier alphabet (MySQL allows more when quoted; keep it plain).
_DATABASE_RE = re.compile(r"^[A-Za-z0-9_$]{1,64}$")


def namespace_tables(namespace: str, role: str = "job") -> tuple[str, ...]:
    """The tables of `namespace` that `role` is granted on.

    :param namespace: a valid namespace ([a-z][a-z0-9_]{0,39}).
    :param role: `admin` adds the tables of row format 1 that `pyflink-ndb migrate` renames
        and drops (`ns_epochs`, `ns_state_v1`). Default `job`.
    :raises ConfigurationError: an invalid namespace or role.
    """
    from pyflink_ndb.stores.mysql import MysqlStateStore

    _check_role(role)
    NdbStateOptions(namespace=namespace)  # validates the namespace
    store = MysqlStateStore("mysql://grants@127.0.0.1/grants", namespace)  # never connects
    tables = (store.t_state, store.t_branches, store.t_snapshots, store.t_operators,
              store.t_catalog)
    if role == "admin":
        return tuple(dict.fromkeys((*tables, *store.all_tables())))
    return tables


def _check_role(role: str) -> None:
    if role not in ROLE_PRIVILEGES:
        raise ConfigurationError(
            f"Unknown role {role!r}; known: {', '.join(ROLE_PRIVILEGES)}.")


def _check(value: str, pattern: re.Pattern[str], what: str, rule: str) -> None:
    if not pattern.match(value):
        raise ConfigurationError(f"{what} {value!r} is not valid: {rule}.")


def grant_statements(user: str, database: str, namespace: str | None = None, *,
                     host: str = "%", role: str = "job", require_tls: bool = False,
                     ndb_stored_user: bool = False) -> list[str]:
    """The SQL statements that give `user` what `role` needs, for an administrator to run.

    The first statement creates the user (if missing) with a placeholder password
    `<password>` to replace; no password is ever printed or taken.

    :param user: the account name (1-32 characters of [A-Za-z0-9_.-]).
    :param database: the database of `state.backend.ndb.url` ([A-Za-z0-9_$]{1,64}).
    :param namespace: `state.backend.ndb.namespace`; None: grants on the whole database
        (every namespace). Default None.
    :param host: the account's host part (`%` any host, or the TaskManagers' network, e.g.
        `10.0.%`). Default `%`.
    :param role: `job`, `reader` or `admin` (see :data:`ROLE_PRIVILEGES`). Default `job`.
    :param require_tls: add `REQUIRE SSL`: the server refuses the user's connections without
        TLS (pair it with `?ssl_mode=verify_ca&ssl_ca=...` in the URL). Default False.
    :param ndb_stored_user: add `GRANT NDB_STORED_USER ON *.*` (RonDB / MySQL NDB Cluster
        8.0.18+): the user and its grants are shared by every MySQL server of the cluster.
        Default False.
    :returns: statements, each ending with `;`.
    :raises ConfigurationError: an invalid user, host, database, namespace or role.
    """
    _check(user, _USER_RE, "User", "use 1-32 characters of [A-Za-z0-9_.-]")
    _check(host, _HOST_RE, "Host", "use a host name, an IP address, localhost or a "
           "pattern with % and _")
    _check(database, _DATABASE_RE, "Database", "use 1-64 characters of [A-Za-z0-9_$]")
    _check_role(role)
    account = f"'{user}'@'{host}'"
    privileges = ", ".join(ROLE_PRIVILEGES[role])
    statements = [f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY '<password>';"]
    if require_tls:
        statements.append(f"ALTER USER {account} REQUIRE SSL;")
    if namespace is None:
        statements.append(f"GRANT {privileges} ON `{database}`.* TO {account};")
    else:
        statements += [f"GRANT {privileges} ON `{database}`.`{table}` TO {account};"
                       for table in namespace_tables(namespace, role)]
    if ndb_stored_user:
        statements.append(f"GRANT NDB_STORED_USER ON *.* TO {account};")
    return statements


def main(argv: Sequence[str] | None = None) -> int:
    """Print :func:`grant_statements` for the command line's arguments.

    :returns: 0, or 2 for invalid arguments (the message is on stderr).
    """
    parser = argparse.ArgumentParser(
        prog="python -m pyflink_ndb.stores.grants",
        description="Print the least-privilege grants of a pyflink-ndb database user "
                    "(nothing connects to a database).")
    parser.add_argument("--user", required=True, help="account name")
    parser.add_argument("--database", required=True, help="database of state.backend.ndb.url")
    parser.add_argument("--namespace", help="state.backend.ndb.namespace (default: every "
                        "namespace of the database)")
    parser.add_argument("--host", default="%", help="account host part (default: %%)")
    parser.add_argument("--role", default="job", choices=sorted(ROLE_PRIVILEGES),
                        help="job (default), reader or admin")
    parser.add_argument("--require-tls", action="store_true", help="add REQUIRE SSL")
    parser.add_argument("--ndb-stored-user", action="store_true",
                        help="add GRANT NDB_STORED_USER (RonDB / MySQL NDB Cluster)")
    args = parser.parse_args(argv)
    try:
        statements = grant_statements(
            args.user, args.database, args.namespace, host=args.host, role=args.role,
            require_tls=args.require_tls, ndb_stored_user=args.ndb_stored_user)
    except ConfigurationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    scope = f"namespace {args.namespace}" if args.namespace else "every namespace"
    print(f"-- pyflink-ndb, role {args.role}: {args.user}@{args.host} on {args.database}, "
          f"{scope}. Replace <password>.")
    print("\n".join(statements))
    return 0


if __name__ == "__main__":
    sys.exit(main())
