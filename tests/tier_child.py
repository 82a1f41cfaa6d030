"""What the tier-folder tests' child processes do with a subtask (imported by the scripts
they run; `tests/` is on their `sys.path` through the working directory's `tests`)."""

from __future__ import annotations

from typing import Any

from pyflink.common.typeinfo import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores.base import StateStore
from pyflink_ndb.testing import LocalSubtask

#: Values the subtask holds when opened by :func:`open_filled`.
FILLED = 200
#: Values :func:`overflow_then_check` adds: past RocksDB's 64 MB memtable, so that a flush
#: writes a table file into the tier folder.
OVERFLOW = 80_000


def value_of(k: int) -> bytes:
    """The value of key `k` that :func:`open_filled` writes (300 bytes or more)."""
    return b"%d" % k * 100


def open_filled(store: StateStore, local_dir: str, **subtask: Any) -> tuple[LocalSubtask, Any]:
    """A subtask with tier 2 under `local_dir` and a cache of one entry, its ValueState `v`
    holding :func:`value_of` for keys 0..FILLED-1 (all but one evicted to tier 2);
    `subtask` goes to :class:`LocalSubtask`. Returns the subtask and the state."""
    t = LocalSubtask(store, NdbStateOptions(cache_max_entries=1), local_dir=local_dir,
                     **subtask)
    v = t.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    for k in range(FILLED):
        t.key(k)
        v.update(value_of(k))
    return t, v


def overflow_then_check(t: LocalSubtask, v: Any) -> tuple[str, list[int]]:
    """Write :data:`OVERFLOW` values of 1 KB more, then read the first FILLED back.

    :returns: ("ok" or the write's error, shortened; the keys whose values read back wrong).
    """
    try:
        for k in range(FILLED, FILLED + OVERFLOW):
            t.key(k)
            v.update(b"y" * 1000)
        written = "ok"
    except Exception as e:  # the tests print it: a live folder deleted under the subtask
        written = "failed: " + repr(e)[:400]
    wrong = []
    for k in range(FILLED):
        t.key(k)
        if v.value() != value_of(k):
            wrong.append(k)
    return written, wrong
