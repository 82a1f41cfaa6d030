"""Row format 1 namespaces: refused at open with the command that converts them, and
`pyflink-ndb migrate` keeps their state and their Flink checkpoints restorable."""

from __future__ import annotations

import zlib

import pytest
from click.testing import CliRunner
from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.cli import main as cli
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.errors import StateCompatibilityError
from pyflink_ndb.serialization import encode_key, encode_value
from pyflink_ndb.stores import open_store
from pyflink_ndb.stores.base import state_id_for
from pyflink_ndb.stores.factory import create_store
from pyflink_ndb.testing import LocalSubtask

FORMAT1_DDL = [
    "CREATE TABLE {ns}_state (key_group SMALLINT NOT NULL, state_id INT NOT NULL, "
    "ukey VARBINARY(2048) NOT NULL, epoch BIGINT NOT NULL, chunk SMALLINT NOT NULL, "
    "tombstone TINYINT NOT NULL, chunks SMALLINT NOT NULL, expires_at_ms BIGINT NULL, "
    "fmt TINYINT NOT NULL, vbytes LONGBLOB NULL, vjson TEXT NULL, kjson TEXT NULL, "
    "PRIMARY KEY (key_group, state_id, ukey, epoch, chunk))",
    "CREATE TABLE {ns}_epochs (operator VARCHAR(255) NOT NULL, epoch BIGINT NOT NULL, "
    "is_savepoint TINYINT NOT NULL, committed_at_ms BIGINT NOT NULL, "
    "job_id VARCHAR(64) NOT NULL, PRIMARY KEY (operator, epoch, is_savepoint))",
    "CREATE TABLE {ns}_catalog (state_id INT NOT NULL PRIMARY KEY, operator VARCHAR(255) "
    "NOT NULL, state_name VARCHAR(255) NOT NULL, state_kind VARCHAR(32) NOT NULL, "
    "serializer VARCHAR(64) NOT NULL, ttl_ms BIGINT NULL, format_version INT NOT NULL)",
]


def write_format1(url: str, ns: str) -> None:
    """A namespace as release 1 left it: operator `op`, ValueState `v`, key "k" = 1 at
    epoch 3 (checkpoint 2 of a run resumed at offset 1), 2 at epoch 4 (pinned savepoint),
    3 at epoch 5 (never completed)."""
    store = create_store(NdbStateOptions(url=url, namespace=ns))
    store.connect()
    sid = state_id_for("op", "v")
    kg = zlib.crc32(encode_key("k")) % 128  # as LocalSubtask routes it
    rows = [(kg, sid, encode_key("k"), epoch, 0, 0, 1, None, 1, encode_value(value),
             str(value), '"k"') for epoch, value in ((3, 1), (4, 2), (5, 3))]

    def unit() -> None:
        for statement in FORMAT1_DDL:
            store._execute(statement.format(ns=ns))
        store._executemany(f"INSERT INTO {ns}_state VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                           rows)
        store._executemany(f"INSERT INTO {ns}_epochs VALUES (?, ?, ?, 0, 'old')",
                           [("op", 3, 0), ("op", 4, 1)])
        store._execute(f"INSERT INTO {ns}_catalog VALUES (?, 'op', 'v', 'value', "
                       "'pickle-5', NULL, 1)", (sid,))
    store._txn("write format 1", unit)
    store.close()


def test_format1_is_refused_then_migrated(store_kind, tmp_path, local_dir, request):
    from conftest import drop_namespace, unique_namespace

    ns = unique_namespace("f")
    url = (f"sqlite:///{tmp_path / 'f1.sqlite'}" if store_kind == "sqlite"
           else request.getfixturevalue("mysql_url"))
    write_format1(url, ns)
    if store_kind == "mysql":
        request.addfinalizer(lambda: drop_namespace(url, ns))
    with pytest.raises(StateCompatibilityError, match="pyflink-ndb migrate --url URL"):
        open_store(NdbStateOptions(url=url, namespace=ns))
    out = CliRunner().invoke(cli, ["migrate", "--url", url, "--namespace", ns])
    assert out.exit_code == 0, out.output
    assert "1 operator(s), 3 rows, 1 checkpoint(s), 1 savepoint(s)" in out.output
    store = open_store(NdbStateOptions(url=url, namespace=ns))
    assert store.latest_committed_checkpoint("op") == 3

    def value_after(restored: int, offset: int) -> object:
        t = LocalSubtask(store, NdbStateOptions(cache_max_entries=1), restored_tokens=(),
                         restored_checkpoint_id=restored, restored_epoch_offset=offset,
                         local_dir=local_dir)
        v = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
        t.key("k")
        found = v.value()
        t.close()
        return found

    assert value_after(2, 1) == 1  # a checkpoint Flink took with release 1
    assert value_after(3, 1) == 2  # its savepoint
    out = CliRunner().invoke(cli, ["migrate", "--url", url, "--namespace", ns])
    assert out.exit_code == 0 and "nothing to migrate" in out.output
    store.close()
