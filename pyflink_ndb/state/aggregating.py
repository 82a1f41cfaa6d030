"""`AggregatingState` on tiered storage: one entry per key holding the accumulator."""

from __future__ import annotations

from typing import Any

from pyflink.fn_execution.internal_state import InternalAggregatingState

from pyflink_ndb.serialization.values import decode_value, encode_value
from pyflink_ndb.state.base import TieredState


class TieredAggregatingState(TieredState, InternalAggregatingState):
    """An `AggregatingState` with the descriptor's `AggregateFunction`; the accumulator is
    stored. `get()` is None when empty; `add(None)` clears the state, as PyFlink's own
    `AggregatingState` does."""

    kind = "aggregating"

    def __init__(self, backend: Any, descriptor: Any) -> None:
        super().__init__(backend, descriptor)
        self._agg = descriptor.get_agg_function()

    def _accumulator(self) -> Any:
        key_bytes, key_group = self._key()
        data = self._read(key_bytes, key_group)
        return None if data is None else decode_value(data)

    def get(self) -> Any:
        acc = self._accumulator()
        return None if acc is None else self._agg.get_result(acc)

    def add(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        acc = self._accumulator()
        if acc is None:
            acc = self._agg.create_accumulator()
        acc = self._agg.add(value, acc)
        key_bytes, key_group = self._key()
        self._write(key_bytes, key_group, encode_value(acc))

    def clear(self) -> None:
        key_bytes, key_group = self._key()
        self._write(key_bytes, key_group, None)

    def merge_namespaces(self, target: Any, sources: Any) -> None:
        """Merge the accumulators of the `sources` namespaces into that of `target` with
        the function's `merge` and clear them; `target` is current afterwards. As Flink's
        `AbstractHeapMergingState.mergeNamespaces`: the sources' accumulators are merged
        in order, then merged into the target's (PyFlink 1.20's own `AggregatingStateImpl`
        overwrites the target with the sources' results instead)."""
        merged = None
        for source in sources:
            self.set_current_namespace(source)
            acc = self._accumulator()
            if acc is None:
                continue
            self.clear()
            merged = acc if merged is None else self._agg.merge(merged, acc)
        self.set_current_namespace(target)
        if merged is None:
            return
        current = self._accumulator()
        if current is not None:
            merged = self._agg.merge(current, merged)
        key_bytes, key_group = self._key()
        self._write(key_bytes, key_group, encode_value(merged))
