"""`state.backend.ndb.python.gc-freeze` (pyflink_ndb.runtime.interpreter): the first
completed checkpoint a subtask hears of leaves the interpreter's start-up heap out of
later full garbage collections, once per interpreter; `false` leaves the collector
alone. Each case runs in a fresh interpreter (the freeze is once per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import gc, json, logging, sys, tempfile
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.stores import open_store
from pyflink_ndb.testing import LocalSubtask

folder = tempfile.mkdtemp()
options = NdbStateOptions(url=f"sqlite:///{folder}/state.sqlite", namespace="gcfreeze",
                          on_fresh_start="resume",
                          python_gc_freeze=sys.argv[1] == "true")
counts = []
for attempt in range(2):  # a failover: the next attempt opens in the same interpreter
    store = open_store(options)
    subtask = LocalSubtask(store, options, local_dir=folder, attempt=attempt)
    counts.append(gc.get_freeze_count())  # opened, no checkpoint yet
    subtask.snapshot(attempt + 1)
    subtask.complete(attempt + 1)
    counts.append(gc.get_freeze_count())
    subtask.close()
    store.close()
print(json.dumps(counts))
"""


def freeze_counts(enabled: bool) -> tuple[list[int], int]:
    """Objects in the collector's permanent generation after the open and after the first
    completed checkpoint of each of two attempts, and how many times the backend logged a
    freeze."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, "true" if enabled else "false"],
                          capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    return counts, done.stderr.count("objects of the interpreter's start-up heap")


@pytest.mark.parametrize("enabled", [True, False], ids=["gc-freeze", "no-gc-freeze"])
def test_the_first_completed_checkpoint_freezes_the_start_up_heap_once(enabled: bool) -> None:
    (opened, first_done, _, second_done), freezes = freeze_counts(enabled)
    assert opened == 0  # nothing before a checkpoint completed
    if enabled:
        # PyFlink's and the package's modules are imported by then: tens of thousands.
        assert first_done > 10_000
        # The second attempt froze nothing more (the count only shrinks as frozen objects
        # are freed by reference counting).
        assert freezes == 1
        assert 0 < second_done <= first_done + 100
    else:
        assert freezes == 0
        assert first_done == second_done == 0
