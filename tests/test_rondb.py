"""Running against a real RonDB: engine detection and the DDL an NDB server gets, TLS in
the URL (`?ssl_mode=...&ssl_ca=...`), and the least-privilege grants
(pyflink_ndb/stores/grants.py).

RonDB is not installable here: the engine detection is checked against a fake connection
that answers `information_schema.ENGINES` as an NDB server does; TLS runs against a MariaDB
of this test's own, started with certificates made by `openssl`; the grants run on the
MySQL-protocol test server.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
from conftest import free_port

from pyflink_ndb.errors import ConfigurationError, StoreUnavailableError
from pyflink_ndb.stores import grants
from pyflink_ndb.stores import mysql as mysql_store
from pyflink_ndb.stores.base import Fence, WriteRow
from pyflink_ndb.stores.lineage import version_of
from pyflink_ndb.stores.mysql import (
    MysqlStateStore,
    is_transient_error,
    parse_mysql_url,
    tls_connect_args,
)

# -- engine detection ---------------------------------------------------------------------


class FakeCursor:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn
        self.rows: list[tuple[Any, ...]] = []

    def execute(self, sql: str, params: Any = ()) -> None:
        self.conn.sql.append(sql)
        if "information_schema.ENGINES" in sql:
            self.rows = [] if self.conn.ndb_support is None else [(self.conn.ndb_support,)]
        elif "COUNT(*) FROM information_schema.TABLES" in sql:
            self.rows = [(0,)]
        else:
            self.rows = []

    def executemany(self, sql: str, rows: Any) -> None:
        self.conn.sql.append(sql)

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def __enter__(self) -> FakeCursor:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def close(self) -> None:
        pass


class FakeConnection:
    """What pymysql.connect returns, answering as a server with this NDB SUPPORT value
    (`YES`, `DEFAULT`, `NO`, or None: no ndbcluster row)."""

    def __init__(self, ndb_support: str | None, **kwargs: Any) -> None:
        self.ndb_support = ndb_support
        self.kwargs = kwargs
        self.sql: list[str] = []

    def cursor(self) -> FakeCursor:
        return FakeCursor(self)

    def __getattr__(self, name: str) -> Any:  # commit, rollback, begin, close, ping
        return lambda *args, **kwargs: None


def open_on_fake(monkeypatch: pytest.MonkeyPatch, support: str | None,
                 url: str = "mysql://flink@rondb-mysqld:3306/state") -> FakeConnection:
    made: list[FakeConnection] = []

    def connect(**kwargs: Any) -> FakeConnection:
        made.append(FakeConnection(support, **kwargs))
        return made[-1]

    monkeypatch.setattr(mysql_store, "connect_driver", connect)
    store = MysqlStateStore(url, "flights")
    store.open()
    store.close()
    return made[0]


@pytest.mark.parametrize("support", ["YES", "DEFAULT"])
def test_an_ndb_server_gets_ndbcluster_tables_partitioned_by_key_group(monkeypatch, support):
    conn = open_on_fake(monkeypatch, support)
    creates = [s for s in conn.sql if s.startswith("CREATE TABLE")]
    assert [s.split()[5] for s in creates] == [
        "flights_state", "flights_branches", "flights_snapshots", "flights_operators",
        "flights_catalog"]
    for statement in creates:
        assert ") ENGINE=NDBCLUSTER DEFAULT CHARSET=utf8mb4" in statement
        assert "InnoDB" not in statement
    state = creates[0]
    assert state.endswith("PARTITION BY KEY (key_group)")
    assert "PRIMARY KEY (key_group, state_id, ukey, version, chunk)" in state
    assert "vbytes LONGBLOB NULL" in state
    assert sum("PARTITION" in s for s in creates) == 1
    # Sessions run at READ COMMITTED, the only isolation level NDB offers.
    assert conn.sql[0] == "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
    assert conn.kwargs["autocommit"] is True and conn.kwargs["read_timeout"] > 0


@pytest.mark.parametrize("support", ["NO", "DISABLED", None])
def test_a_server_without_ndb_gets_innodb_tables(monkeypatch, support):
    conn = open_on_fake(monkeypatch, support)
    creates = [s for s in conn.sql if s.startswith("CREATE TABLE")]
    assert len(creates) == 5
    for statement in creates:
        assert "ENGINE=InnoDB" in statement and "NDBCLUSTER" not in statement
        assert "PARTITION" not in statement


def test_describe_names_the_engine_and_tls(monkeypatch):
    monkeypatch.setattr(mysql_store, "connect_driver",
                        lambda **kwargs: FakeConnection("YES", **kwargs))
    store = MysqlStateStore("mysql://flink@db:3306/state?ssl_mode=required", "ns")
    assert store.check_connection() == "mysql://flink@db:3306/state (NDBCLUSTER, TLS required)"


# -- TLS in the URL -------------------------------------------------------------------------

def test_a_url_without_parameters_keeps_pymysqls_tls_default():
    args = parse_mysql_url("mysql://u:p%40ss@h:3307/db")
    assert args == {"host": "h", "port": 3307, "user": "u", "password": "p@ss",
                    "database": "db", "tls": {}}
    assert tls_connect_args(args["tls"]) == {}


def test_tls_parameters_and_their_defaults():
    tls = parse_mysql_url("mysql://u@h/db?ssl_ca=/etc/ca.pem")["tls"]
    assert tls == {"ca": "/etc/ca.pem", "mode": "verify_ca"}
    tls = parse_mysql_url("mysql://u@h/db?ssl_cert=/c.pem&ssl_key=/k.pem")["tls"]
    assert tls == {"cert": "/c.pem", "key": "/k.pem", "mode": "required"}
    tls = parse_mysql_url("mysql://u@h/db?ssl_mode=VERIFY_IDENTITY&ssl_ca=/ca.pem")["tls"]
    assert tls == {"ca": "/ca.pem", "mode": "verify_identity"}
    assert parse_mysql_url("mysql://u@h/db?ssl_mode=disabled")["tls"] == {"mode": "disabled"}
    assert tls_connect_args({"mode": "disabled"}) == {"ssl_disabled": True}
    assert tls_connect_args({"mode": "preferred"}) == {}


@pytest.mark.parametrize("query, message", [
    ("ssl_cax=/ca.pem", "unknown parameters ssl_cax; known: ssl_mode, ssl_ca"),
    ("ssl_ca=/a.pem&ssl_ca=/b.pem", "give ssl_ca once"),
    ("ssl_ca=", "give ssl_ca once, with a value"),
    ("ssl_mode=verify", "ssl_mode='verify' is not one of disabled, preferred"),
    ("ssl_cert=/c.pem", "ssl_cert and ssl_key go together"),
    ("ssl_mode=disabled&ssl_ca=/ca.pem", "ssl_ca need ssl_mode=required"),
    ("ssl_mode=preferred&ssl_cert=/c&ssl_key=/k", "ssl_cert, ssl_key need ssl_mode"),
    ("ssl_ca", "malformed query"),
])
def test_invalid_tls_parameters_are_configuration_errors(query, message):
    with pytest.raises(ConfigurationError, match=message.replace("?", r"\?")) as info:
        parse_mysql_url(f"mysql://u:Secret-9@h/db?{query}")
    assert "Secret-9" not in str(info.value)


def test_an_invalid_port_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="invalid port"):
        parse_mysql_url("mysql://u@h:99999/db")


def test_tls_contexts_follow_the_mode(certs: dict[str, Path]):
    ca = str(certs["ca.pem"])
    required = tls_connect_args({"mode": "required"})["ssl"]
    assert required.verify_mode == ssl.CERT_NONE and not required.check_hostname
    verify_ca = tls_connect_args({"mode": "verify_ca", "ca": ca})["ssl"]
    assert verify_ca.verify_mode == ssl.CERT_REQUIRED and not verify_ca.check_hostname
    identity = tls_connect_args({"mode": "verify_identity", "ca": ca})["ssl"]
    assert identity.verify_mode == ssl.CERT_REQUIRED and identity.check_hostname
    assert any("pyflink-ndb test CA" in str(c.get("subject")) for c in identity.get_ca_certs())
    with_client = tls_connect_args({"mode": "verify_ca", "ca": ca,
                                    "cert": str(certs["client.pem"]),
                                    "key": str(certs["client.key"])})
    assert isinstance(with_client["ssl"], ssl.SSLContext)


def test_tls_contexts_are_made_once_until_a_file_changes(certs: dict[str, Path], tmp_path):
    """Loading certificates costs tens of milliseconds per connection: the same settings
    and files give the same context; a renewed CA file gives a new one."""
    ca = tmp_path / "ca.pem"
    shutil.copy(certs["ca.pem"], ca)
    first = tls_connect_args({"mode": "verify_ca", "ca": str(ca)})["ssl"]
    assert tls_connect_args({"mode": "verify_ca", "ca": str(ca)})["ssl"] is first
    assert tls_connect_args({"mode": "verify_identity", "ca": str(ca)})["ssl"] is not first
    os.utime(ca, ns=(ca.stat().st_atime_ns, ca.stat().st_mtime_ns + 1_000_000_000))
    assert tls_connect_args({"mode": "verify_ca", "ca": str(ca)})["ssl"] is not first


@pytest.mark.mysql
def test_connections_of_the_default_tls_mode_share_one_context(mysql_url):
    """pymysql >= 1.2 builds a context (the system's CA certificates) for each connection
    in its default, preferred mode; the store's connections share one."""
    store = MysqlStateStore(mysql_url, f"ctx_{uuid.uuid4().hex[:8]}")
    store.connect()
    twin = store.fork()
    try:
        assert store._conn.ctx is not None
        assert twin._conn.ctx is store._conn.ctx
    finally:
        twin.close()
        store.close()


def test_unreadable_tls_files_name_the_parameter(tmp_path, certs):
    with pytest.raises(ConfigurationError, match="ssl_ca .*absent.pem"):
        tls_connect_args({"mode": "verify_ca", "ca": str(tmp_path / "absent.pem")})
    with pytest.raises(ConfigurationError, match="ssl_cert/ssl_key"):
        tls_connect_args({"mode": "required", "cert": str(certs["client.pem"]),
                          "key": str(certs["ca.pem"])})  # not the certificate's key
    store = MysqlStateStore(f"mysql://u@127.0.0.1:1/db?ssl_ca={tmp_path}/absent.pem", "ns")
    with pytest.raises(ConfigurationError, match="ssl_ca"):
        store.check_connection()  # before any connection attempt, without retries


def test_the_store_passes_the_tls_context_to_pymysql(monkeypatch, certs):
    conn = open_on_fake(monkeypatch, "YES",
                        f"mysql://flink@db:3306/state?ssl_mode=verify_identity"
                        f"&ssl_ca={certs['ca.pem']}")
    context = conn.kwargs["ssl"]
    assert isinstance(context, ssl.SSLContext) and context.check_hostname


# -- TLS against a real server ----------------------------------------------------------

def openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate it signed,
    and a second CA that signed nothing here."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make test certificates (Debian package openssl)")
    d = tmp_path_factory.mktemp("certs")
    for ca, name in (("ca", "pyflink-ndb test CA"), ("other-ca", "another CA")):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-subj", f"/CN={name}",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    for leaf, cn, san in (("server", "127.0.0.1", "IP:127.0.0.1"),
                          ("client", "flink", "DNS:flink")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{leaf}.key",
                "-out", f"{leaf}.csr", "-subj", f"/CN={cn}", cwd=d)
        (d / f"{leaf}.ext").write_text(f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n")
        openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{leaf}.pem",
                "-extfile", f"{leaf}.ext", cwd=d)
    return {p.name: p for p in d.iterdir()}


@pytest.fixture(scope="module")
def tls_server(certs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[int]:
    """A MariaDB of this test's own on a free loopback port, with TLS on; its port."""
    for tool in ("mariadb-install-db", "/usr/sbin/mariadbd"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is needed for the TLS test (Debian package mariadb-server)")
    d = tmp_path_factory.mktemp("tls-mariadb")
    installed = subprocess.run(
        ["mariadb-install-db", "--no-defaults", f"--datadir={d / 'data'}", "--user=root",
         "--auth-root-authentication-method=normal", "--skip-test-db"],
        capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    port = free_port()
    log = (d / "mariadbd.log").open("w")
    server = subprocess.Popen(
        ["/usr/sbin/mariadbd", "--no-defaults", f"--datadir={d / 'data'}",
         f"--socket={d / 'mysqld.sock'}", f"--pid-file={d / 'mysqld.pid'}", f"--port={port}",
         "--bind-address=127.0.0.1", "--user=root", "--skip-log-bin",
         "--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M",
         f"--ssl-ca={certs['ca.pem']}", f"--ssl-cert={certs['server.pem']}",
         f"--ssl-key={certs['server.key']}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (d / "mariadbd.log").read_text()[-3000:]
            try:
                pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=2,
                                ssl_disabled=True).close()
                break
            except pymysql.err.OperationalError:
                assert time.monotonic() < deadline, (d / "mariadbd.log").read_text()[-3000:]
                time.sleep(0.2)
        root = pymysql.connect(host="127.0.0.1", port=port, user="root", autocommit=True,
                               ssl_disabled=True)
        with root.cursor() as cur:
            cur.execute("CREATE DATABASE test")
        root.close()
        yield port
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()


def tls_store(port: int, query: str, namespace: str = "tls") -> MysqlStateStore:
    return MysqlStateStore(f"mysql://root@127.0.0.1:{port}/test?{query}", namespace,
                           connect_timeout_s=5)


def session_cipher(store: MysqlStateStore) -> str:
    rows = store._read("tls status", "SHOW SESSION STATUS LIKE 'Ssl_cipher'")
    return str(rows[0][1]) if rows else ""


@pytest.mark.parametrize("query", [
    "ssl_ca={ca}",                                        # verify_ca
    "ssl_mode=verify_identity&ssl_ca={ca}",               # 127.0.0.1 is in the certificate
    "ssl_mode=required",                                  # encrypted, not verified
    "ssl_mode=verify_ca&ssl_ca={ca}&ssl_cert={client_pem}&ssl_key={client_key}",
])
def test_tls_connections_to_a_real_server(tls_server, certs, query):
    query = query.format(ca=certs["ca.pem"], client_pem=certs["client.pem"],
                         client_key=certs["client.key"])
    store = tls_store(tls_server, query, "tls_" + uuid.uuid4().hex[:8])
    store.open()
    try:
        assert session_cipher(store), "the session is not encrypted"
        fence = Fence("op", 1, 0, 127)
        store.claim(fence, None)
        store.write_versions(fence, version_of(1, 1),
                             [WriteRow(3, 1, b"k", False, b"value", None, None, None)])
    finally:
        store.drop_tables()
        store.close()


def test_ssl_mode_disabled_is_plain_tcp(tls_server):
    store = tls_store(tls_server, "ssl_mode=disabled")
    store._conn = store._connect()
    try:
        assert session_cipher(store) == ""
    finally:
        store.close()


def test_a_certificate_of_another_ca_fails_at_once_and_is_not_retried(tls_server, certs):
    store = tls_store(tls_server, f"ssl_ca={certs['other-ca.pem']}")
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="TLS with the database at 127.0.0.1") as info:
        store.check_connection()
    assert "certificate verify failed" in str(info.value)
    assert not is_transient_error(info.value)
    assert time.monotonic() - started < 10  # no retries until the 90 s deadline


def test_tls_required_on_a_server_without_tls_says_so(mysql_url):
    plain = parse_mysql_url(mysql_url)
    store = MysqlStateStore(f"{mysql_url}?ssl_mode=required", "tls", password=plain["password"])
    try:
        store.check_connection()
    except StoreUnavailableError as err:  # the shared test server has no TLS
        assert "TLS with the database" in str(err) and not is_transient_error(err)
    else:  # a test server with TLS: then the session must be encrypted
        store._conn = store._connect()
        assert session_cipher(store)
        store.close()


# -- grants ---------------------------------------------------------------------------

def test_job_grants_are_table_level_on_the_namespace():
    assert grants.grant_statements("flink", "state", "flights", host="10.0.%") == [
        "CREATE USER IF NOT EXISTS 'flink'@'10.0.%' IDENTIFIED BY '<password>';",
        *[f"GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `state`.`flights_{t}` "
          "TO 'flink'@'10.0.%';"
          for t in ("state", "branches", "snapshots", "operators", "catalog")],
    ]


def test_grants_per_role_database_and_options():
    reader = grants.grant_statements("bi", "state", role="reader")
    assert reader[1:] == ["GRANT SELECT ON `state`.* TO 'bi'@'%';"]
    admin = grants.grant_statements("ops", "state", "flights", role="admin",
                                    require_tls=True, ndb_stored_user=True)
    assert admin[1] == "ALTER USER 'ops'@'%' REQUIRE SSL;"
    assert "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, ALTER ON `state`." \
           "`flights_epochs` TO 'ops'@'%';" in admin
    assert "`flights_state_v1`" in " ".join(admin)
    assert admin[-1] == "GRANT NDB_STORED_USER ON *.* TO 'ops'@'%';"


@pytest.mark.parametrize("kwargs, message", [
    ({"user": "x'; DROP USER root; --"}, "User"),
    ({"user": ""}, "User"),
    ({"database": "st`ate"}, "Database"),
    ({"host": "a'b"}, "Host"),
    ({"namespace": "Flights"}, "namespace"),
    ({"role": "owner"}, "Unknown role 'owner'; known: job, reader, admin"),
])
def test_grants_reject_invalid_identifiers(kwargs, message):
    args = {"user": "flink", "database": "state", **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        grants.grant_statements(args.pop("user"), args.pop("database"), **args)


def test_the_grants_command_prints_them(capsys):
    assert grants.main(["--user", "flink", "--database", "state", "--namespace", "flights",
                        "--ndb-stored-user"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("-- pyflink-ndb, role job: flink@% on state, namespace flights")
    assert out[1] == "CREATE USER IF NOT EXISTS 'flink'@'%' IDENTIFIED BY '<password>';"
    assert out[-1] == "GRANT NDB_STORED_USER ON *.* TO 'flink'@'%';"
    assert grants.main(["--user", "a b", "--database", "state"]) == 2
    assert "User 'a b' is not valid" in capsys.readouterr().err


@pytest.mark.mysql
def test_the_printed_grants_are_enough_for_a_job_and_a_reader(mysql_url):
    from conftest import drop_namespace, mysql_connect

    ns = "grants_" + uuid.uuid4().hex[:8]
    server = parse_mysql_url(mysql_url)
    users = {role: (f"pfn_{role[:3]}_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex)
             for role in ("job", "reader")}
    admin = mysql_connect(mysql_url)

    def run_as_admin(role: str, host: str) -> None:
        user, password = users[role]
        with admin.cursor() as cur:
            for statement in grants.grant_statements(user, server["database"], ns,
                                                     host=host, role=role):
                if "<password>" in statement:
                    cur.execute(statement.rstrip(";").replace("%", "%%")
                                .replace("'<password>'", "%s"), (password,))
                else:
                    cur.execute(statement.rstrip(";"))

    def store_as(role: str) -> MysqlStateStore:
        user, password = users[role]
        return MysqlStateStore(mysql_url, ns, user=user, password=password)

    host = "localhost" if server["host"] in ("127.0.0.1", "localhost") else "%"
    try:
        for h in dict.fromkeys((host, "%")):
            run_as_admin("job", h)
        job = store_as("job")
        job.open()  # creates the tables with the job's own grants
        fence = Fence("op", 1, 0, 127)
        job.claim(fence, None)
        job.write_versions(fence, version_of(1, 1),
                           [WriteRow(3, 1, b"k", False, b"value", None, None, None)])
        job.close()
        for h in dict.fromkeys((host, "%")):
            run_as_admin("reader", h)
        reader = store_as("reader")
        reader.open(create=False)
        assert reader._read("count", f"SELECT COUNT(*) FROM {reader.t_state}") == [(1,)]
        with pytest.raises(pymysql.err.OperationalError) as denied:
            reader._execute(f"DELETE FROM {reader.t_state}")
        assert denied.value.args[0] == 1142  # ER_TABLEACCESS_DENIED_ERROR
        reader.close()
    finally:
        with admin.cursor() as cur:
            for user, _ in users.values():
                cur.execute(f"DROP USER IF EXISTS '{user}'@'%', '{user}'@'localhost'")
        admin.close()
        drop_namespace(mysql_url, ns)
