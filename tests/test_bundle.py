"""A bundle of records in one call (`SubtaskStateBackend.process_bundle`, the Python side
of `state.backend.ndb.bundle.records`): each record is processed in order with its own key
group and timestamp at hand, and its outputs come back in the shape the bridge emits. The
bridge's side (holding records back, the record context, timers) runs on Flink's
MiniCluster in tests/test_bundle_flink.py."""

from __future__ import annotations

from typing import Any

import pytest
from pyflink.common import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.runtime.backend import OUTPUTS_PER_CALL
from pyflink_ndb.testing import LocalSubtask, local_key_group


class _Operation:
    """A keyed operation as the bridge's backend sees it: `process_element` gets the
    external `(key, value)` row, sets the key (as `hook_record_keys` does) and yields what
    `outputs(key, value)` says, after adding the value to the key's sum."""

    def __init__(self, subtask: LocalSubtask, outputs: Any) -> None:
        self.backend = subtask.backend
        self.total = subtask.context.get_state(ValueStateDescriptor("sum", Types.LONG()))
        self.outputs = outputs
        self.seen: list[tuple[Any, int, int]] = []

    def process_element(self, value: Any) -> Any:
        key, n = value
        self.backend.set_current_key(key)
        record = self.backend.bundle
        self.seen.append((key, self.backend.current_key_group, record.timestamp))
        self.total.update((self.total.value() or 0) + n)
        yield from self.outputs(key, self.total.value())


@pytest.fixture
def subtask(store_factory, local_dir):
    sub = LocalSubtask(store_factory("sqlite"), NdbStateOptions(), local_dir=local_dir)
    yield sub
    sub.close()


def test_records_are_processed_in_order_with_their_own_key_group_and_timestamp(subtask):
    operation = _Operation(subtask, lambda key, total: [f"{key}={total}"] if total > 2 else [])
    subtask.backend._operation = operation
    records = [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 5)]
    # Key groups from Java that the local oracle would not give: the bundle's are used.
    groups = [(local_key_group(k) + 7) % 128 for k, _ in records]
    gain, outputs, rest = subtask.backend.process_bundle(records, groups,
                                                         [10, 11, 12, 13, 14], 0, False)
    assert (gain, rest) == (0, None)
    assert outputs == [None, None, ["a=3"], None, ["b=6"]]
    assert operation.seen == [(k, g, t) for (k, _), g, t in zip(records, groups,
                                                                 range(10, 15), strict=True)]
    assert subtask.backend.bundle is None
    # A bundle without outputs returns None for them; `start` skips processed records.
    _, outputs, _ = subtask.backend.process_bundle(records, groups, [0] * 5, 4, False)
    assert outputs == [["b=11"]] and [k for k, _, _ in operation.seen[5:]] == ["b"]
    _, outputs, _ = subtask.backend.process_bundle([("d", 1)], [3], [0], 0, False)
    assert outputs is None


def test_a_record_with_more_outputs_than_one_call_ends_the_call(subtask):
    many = OUTPUTS_PER_CALL + 3
    operation = _Operation(subtask, lambda key, total: (
        (f"{key}:{i}" for i in range(many)) if key == "m" else [key]))
    subtask.backend._operation = operation
    records = [("x", 1), ("m", 1), ("y", 1)]
    groups = [local_key_group(k) for k, _ in records]
    _, outputs, rest = subtask.backend.process_bundle(records, groups, [0, 0, 0], 0, False)
    assert outputs[0] == ["x"] and len(outputs) == 2
    assert outputs[1] == [f"m:{i}" for i in range(OUTPUTS_PER_CALL)]
    assert list(rest) == [f"m:{i}" for i in range(OUTPUTS_PER_CALL, many)]
    assert [k for k, _, _ in operation.seen] == ["x", "m"]
    _, outputs, rest = subtask.backend.process_bundle(records, groups, [0, 0, 0], 2, False)
    assert (outputs, rest) == ([["y"]], None)


def test_a_subtask_that_processes_bundles_says_so_in_the_log(subtask, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="pyflink_ndb.runtime.backend"):
        subtask.backend.enable_bundles(object())
    assert any("records in bundles of up to 100, each held back at most 5 ms" in r.getMessage()
               for r in caplog.records)


def test_bundles_are_offered_only_with_record_contexts_and_keys_from_records(subtask):
    backend = subtask.backend
    backend.options = NdbStateOptions(bundle_records=64, bundle_max_wait_ms=3)
    backend._record_key = None
    assert backend.read_ahead_settings()[2:] == [0, 3]
    backend._record_key = lambda record: record[1][0]
    assert backend.read_ahead_settings()[2:] == [0, 3]  # no wrapper answered for contexts
    backend.bundle_contexts = True
    assert backend.read_ahead_settings()[2:] == [0, 3]  # chained contexts do not answer
    backend._chain_answers = True
    assert backend.read_ahead_settings() == [100, 5, 64, 3]
