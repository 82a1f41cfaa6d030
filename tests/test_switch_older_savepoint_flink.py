"""The job-wide switch (a breaker's attack, kept): restore an OLDER savepoint of the
switched job after a newer one was taken,
then the newer one (MariaDB, cache of 4, the job of test_switch_odd_keys_flink).

Run 1 (keyed parallelism 2) takes savepoint S1 while running (`trigger_savepoint`), goes
on, and stops with savepoint S2 (no drain). Run 2 restores S1 at parallelism 3 and runs
to the end: every window that fires at the end of input must hold exactly its records
(a window that also saw run 1's records after S1 would hold duplicates), and the
per-record counters must end at their exact totals. Run 3 then restores S2 at
parallelism 1: run 1's outputs plus run 3's must equal the expected outputs exactly.
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, unique_namespace
from test_switch_odd_keys_flink import diff, expected, make_records
from test_switch_rescale_windows_flink import outputs, start, wait_for_commit

import pyflink_ndb  # noqa: F401
from pyflink_ndb.config import NdbStateOptions

pytestmark = pytest.mark.flink

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Tags whose outputs all come at the end of input (event-time windows).
END_TAGS = {"tumble", "tumble-row", "session", "session-list", "dyn"}


def lines_with(path: Any, tag: str) -> int:
    return sum(1 for line in path.read_text().splitlines() if f"'{tag}'" in line) \
        if path.exists() else 0


def test_restore_older_savepoint_then_newer(tmp_path, mysql_url):
    records = make_records(1800)
    want = expected(records)
    ns = unique_namespace("brko")
    options = NdbStateOptions(url=mysql_url, namespace=ns)
    switched = {"state.backend.ndb.enabled": "true", "state.backend.ndb.url": mysql_url,
                "state.backend.ndb.namespace": ns, "state.backend.ndb.cache.max-entries": "4"}
    try:
        first_path = tmp_path / "first.txt"
        first = start(records, 2, switched, first_path, throttle_ms=6.0)
        try:
            wait_for_commit(options, first_path, min_lines=len(records) // 5)
            s1 = first.trigger_savepoint(str(tmp_path / "sp1")).result()
            at_s1 = lines_with(first_path, "bcast")
            deadline = time.monotonic() + 60
            while lines_with(first_path, "bcast") < at_s1 + len(records) // 4:
                assert time.monotonic() < deadline, "run 1 made no progress after S1"
                time.sleep(0.2)
        except BaseException:
            first.cancel().result()
            raise
        s2 = first.stop_with_savepoint(False, str(tmp_path / "sp2")).result()
        first.get_job_execution_result().result()
        got1 = outputs(first_path)
        assert sum(n for o, n in got1.items() if o[0] == "bcast") < len(records)

        # Run 2: the older savepoint, at parallelism 3.
        second_path = tmp_path / "second.txt"
        second = start(records, 3, {**switched, "execution.savepoint.path": s1},
                       second_path, throttle_ms=0)
        second.get_job_execution_result().result()
        got2 = outputs(second_path)
        problems = []
        w_end = Counter({o: n for o, n in want.items() if o[0] in END_TAGS})
        g_end = Counter({o: n for o, n in got2.items() if o[0] in END_TAGS})
        if w_end != g_end:
            problems.append(("end-of-input windows from S1", diff(w_end, g_end)))
        totals: dict = defaultdict(int)
        for o in want:
            if o[0] in ("bcast", "co", "reduce"):
                totals[(o[0], o[1])] = max(totals[(o[0], o[1])], o[2])
        for tag in ("bcast", "co", "reduce"):
            per_key: dict = defaultdict(list)
            for o, n in got2.items():
                if o[0] == tag:
                    per_key[o[1]] += [o[2]] * n
            for (t, k), total in totals.items():
                if t == tag and per_key.get(k) and max(per_key[k]) != total:
                    problems.append((tag, k, "final", max(per_key[k]), "expected", total))
                if t == tag and tag != "reduce" and per_key.get(k):
                    ns_ = sorted(per_key[k])
                    if ns_ != list(range(ns_[0], total + 1)):
                        problems.append((tag, k, "not contiguous", ns_[:3], len(ns_)))
        assert not problems, problems

        # Run 3: the newer savepoint, at parallelism 1.
        third_path = tmp_path / "third.txt"
        third = start(records, 1, {**switched, "execution.savepoint.path": s2},
                      third_path, throttle_ms=0)
        third.get_job_execution_result().result()
        got = got1 + outputs(third_path)
        assert got == want, diff(want, got)
    finally:
        drop_namespace(mysql_url, ns)
