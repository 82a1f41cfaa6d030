"""`pyflink_ndb.testing.crash_open_subtasks`: a LocalSubtask a test leaves open is crashed
before its folder goes (found in this suite: subtasks left open kept their writer threads
and tier-2 RocksDBs after their folders were deleted, and one such RocksDB, dropped by a
garbage collection in a later test, hung in its flush at close holding the interpreter
lock)."""

from __future__ import annotations

from pathlib import Path

from pyflink.common import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores import open_store
from pyflink_ndb.testing import LocalSubtask, crash_open_subtasks, open_subtasks


def _subtask(tmp_path: Path, name: str) -> LocalSubtask:
    url = f"sqlite:///{tmp_path / (name + '.sqlite')}"
    options = NdbStateOptions(url=url, namespace=name, cache_max_entries=1)
    sub = LocalSubtask(open_store(options), options, local_dir=str(tmp_path / name))
    value = sub.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    for key in ("a", "b", "c"):  # a cache of 1: two of them are in tier 2
        sub.key(key)
        value.update(key)
    sub.snapshot(1)
    return sub


def test_only_the_subtasks_under_the_folder_and_not_kept_are_crashed(tmp_path: Path) -> None:
    kept = _subtask(tmp_path, "kept")
    before = open_subtasks()
    inside = _subtask(tmp_path / "inside", "inside")
    elsewhere = _subtask(tmp_path, "elsewhere")
    assert {kept, inside, elsewhere} <= open_subtasks()
    tier = inside.backend.table.local
    assert tier is not None and tier.path.exists()

    assert crash_open_subtasks(under=str(tmp_path / "inside")) == 1
    assert not inside.backend.protocol.writer.alive
    assert not tier.path.exists()  # tier 2 closed and its folder deleted
    assert inside not in open_subtasks() and elsewhere in open_subtasks()
    inside.crash()  # a second stop does nothing

    assert crash_open_subtasks(keep=before) == 1  # `elsewhere`; `kept` stays
    assert open_subtasks() & {kept, elsewhere} == {kept}
    kept.close()
    assert kept not in open_subtasks()
