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



def test_the_rest_of_a_records_outputs_runs_with_the_bundle_current(subtask):
    """What a record does after its first OUTPUTS_PER_CALL outputs (delete its firing
    timeout) goes through the bundle, as before them: the bridge iterates the rest after
    process_bundle returned (a breaker's find: the bundle was gone by then)."""
    backend = subtask.backend
    current: list[Any] = []

    def outputs(key: str, total: int) -> Any:
        for i in range(OUTPUTS_PER_CALL + 2):
            current.append(backend.bundle)
            yield i
    backend._operation = _Operation(subtask, outputs)
    _, _, rest = backend.process_bundle([("a", 1)], [local_key_group("a")], [5], 0, False)
    assert backend.bundle is None
    assert list(rest) == [OUTPUTS_PER_CALL, OUTPUTS_PER_CALL + 1]
    bundle = current[0]
    assert bundle is not None and all(b is bundle for b in current), "the record's bundle"
    assert bundle.index == 0 and bundle.timestamp == 5
    assert backend.bundle is None, "current only inside each step of the rest"



def test_a_rest_abandoned_by_the_bridge_closes_in_the_bundle(subtask):
    """The bridge closes the rest's iterator when it stops early: the function's own
    `finally` (a timer deleted there) runs with its record's bundle current too."""
    backend = subtask.backend
    at_close: list[Any] = []

    def outputs(key: str, total: int) -> Any:
        try:
            yield from range(OUTPUTS_PER_CALL + 5)
        finally:
            at_close.append(backend.bundle)
    backend._operation = _Operation(subtask, outputs)
    _, _, rest = backend.process_bundle([("a", 1)], [local_key_group("a")], [5], 0, False)
    assert next(rest) == OUTPUTS_PER_CALL
    rest.close()
    assert len(at_close) == 1 and at_close[0] is not None and at_close[0].index == 0
    assert backend.bundle is None

def test_equal_keys_that_flink_puts_in_two_key_groups_fail_clearly(subtask):
    """Two records whose keys are equal by value (one key to the tiers) but that Flink put
    in two key groups (two keys to Flink: a pickled `(s, s)` and `(s, copy of s)`, a
    breaker's find) are refused with an error naming the fix, before the second record is
    processed; also when the second is met while reading a bundle ahead."""
    from pyflink_ndb.errors import SerializationError

    backend = subtask.backend
    operation = _Operation(subtask, lambda key, total: [])
    backend._operation = operation
    s = "key-1"
    t = "".join(list(s))
    records = [((s, s), 1), ((s, t), 1)]
    kg = local_key_group((s, s))
    with pytest.raises(SerializationError, match="key_type") as err:
        backend.process_bundle(records, [kg, (kg + 1) % 128], [0, 0], 0, False)
    assert f"key group {kg}, but Flink put this record in key group {(kg + 1) % 128}" in str(
        err.value)
    assert len(operation.seen) == 1, "the second record was not processed"
    assert backend.bundle is None
    # The same key in the same key group is one key, as before.
    backend.process_bundle(records, [kg, kg], [0, 0], 0, False)
    assert [k for k, _, _ in operation.seen[1:]] == [(s, s), (s, t)]
    # Read ahead: the bundle's keys are checked before anything is read.
    backend._record_key = lambda record: record[0]
    with pytest.raises(SerializationError, match="key_type"):
        backend.read_ahead(records, [kg, (kg + 2) % 128])

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
