"""The backend's metrics push deltas to Flink once per checkpoint notification (the real
metric system over REST is tested on the local cluster in test_cluster.py)."""

from __future__ import annotations

from pyflink.common import Types
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.runtime.metrics import COUNTERS, DISTRIBUTIONS, register
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.testing import LocalSubtask


class FakeCounter:
    def __init__(self) -> None:
        self.count = 0
        self.calls = 0

    def inc(self, n: int = 1) -> None:
        self.count += n
        self.calls += 1


class FakeDistribution:
    def __init__(self) -> None:
        self.values: list[int] = []

    def update(self, value: int) -> None:
        self.values.append(value)


class FakeGroup:
    """Stands in for PyFlink's MetricGroup (Java objects in thread mode)."""

    def __init__(self) -> None:
        self.groups: dict[str, FakeGroup] = {}
        self.counters: dict[str, FakeCounter] = {}
        self.distributions: dict[str, FakeDistribution] = {}

    def add_group(self, name: str) -> FakeGroup:
        return self.groups.setdefault(name, FakeGroup())

    def counter(self, name: str) -> FakeCounter:
        return self.counters.setdefault(name, FakeCounter())

    def distribution(self, name: str) -> FakeDistribution:
        return self.distributions.setdefault(name, FakeDistribution())


class Context:
    def __init__(self, group: FakeGroup) -> None:
        self.group = group

    def get_metrics_group(self) -> FakeGroup:
        return self.group


def test_counts_stay_in_python_until_a_notification_pushes_the_deltas(tmp_path):
    options = NdbStateOptions(url=f"sqlite:///{tmp_path}/s.sqlite", namespace="m",
                              cache_max_entries=2)
    store = open_store(options)
    sub = LocalSubtask(store, options, local_dir=str(tmp_path / "l"))
    root = FakeGroup()
    sub.backend.metrics = register(Context(root), sub.backend)
    group = root.groups["pyflink_ndb"]
    assert set(group.counters) == set(COUNTERS)
    assert set(group.distributions) == set(DISTRIBUTIONS)
    state = sub.context.get_state(ValueStateDescriptor("v", Types.PICKLED_BYTE_ARRAY()))
    for i in range(10):
        sub.key(i)
        state.update(i)
        assert state.value() == i
    assert all(c.calls == 0 for c in group.counters.values()), "a read crossed into Java"
    sub.checkpoint(1)
    assert group.counters["entriesWritten"].count == 10
    assert group.counters["checkpointsWritten"].count == 1
    assert group.counters["tier1Hits"].count == 10
    assert group.distributions["dirtyEntries"].values == [10]
    for i in range(3):
        sub.key(i)
        assert state.value() == i  # evicted to tier 2 since: tier-2 hits
    sub.checkpoint(2)
    assert group.counters["entriesWritten"].count == 10, "nothing new was dirty"
    assert group.counters["tier2Hits"].count == 3
    assert group.counters["checkpointsWritten"].count == 2
    assert register(object(), sub.backend) is None, "no metrics outside Flink"
    sub.close()
    store.close()


def test_a_tiered_state_error_is_logged_once_with_its_fix_and_reraised(caplog):
    import pytest

    from pyflink_ndb.api.functions import TieredKeyedProcessFunction
    from pyflink_ndb.errors import ValueTooLargeError

    class Failing:
        def process_element(self, value, ctx):
            yield value
            raise ValueTooLargeError("State 'v', key \"k\": ... raise the limit.")

    fn = TieredKeyedProcessFunction(Failing())
    fn._backend = type("B", (), {"keys_from_records": True, "bundle_contexts": False})()
    for _ in range(3):
        out = []
        with pytest.raises(ValueTooLargeError):
            for v in fn.process_element(1, None):
                out.append(v)
        assert out == [1]
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "raise the limit" in errors[0].getMessage()
