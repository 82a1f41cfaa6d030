"""`ReducingState` on tiered storage: one entry per key holding the reduced value."""

from __future__ import annotations

from typing import Any

from pyflink.datastream.functions import ReduceFunction
from pyflink.fn_execution.internal_state import InternalReducingState

from pyflink_ndb.serialization.values import decode_value, encode_value
from pyflink_ndb.state.base import TieredState


class TieredReducingState(TieredState, InternalReducingState):
    """A `ReducingState` with the descriptor's `ReduceFunction`.

    `get()` is None when empty. `add(None)` clears the state, as PyFlink's own
    `ReducingState` does.
    """

    kind = "reducing"

    def __init__(self, backend: Any, descriptor: Any) -> None:
        super().__init__(backend, descriptor)
        fn = descriptor.get_reduce_function()
        self._reduce = fn.reduce if isinstance(fn, ReduceFunction) or hasattr(fn, "reduce") \
            else fn

    def get(self) -> Any:
        key_bytes, key_group = self._key()
        data = self._read(key_bytes, key_group)
        return None if data is None else decode_value(data)

    def add(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        current = self.get()
        result = value if current is None else self._reduce(current, value)
        key_bytes, key_group = self._key()
        self._write(key_bytes, key_group, encode_value(result))

    def clear(self) -> None:
        key_bytes, key_group = self._key()
        self._write(key_bytes, key_group, None)

    def merge_namespaces(self, target: Any, sources: Any) -> None:
        """Reduce the values of the `sources` namespaces into that of `target` and clear
        them; `target` is current afterwards. As Flink's
        `AbstractHeapMergingState.mergeNamespaces`: target = reduce(target, merged sources)
        (PyFlink 1.20's own `ReducingStateImpl` overwrites the target instead)."""
        merged = None
        for source in sources:
            self.set_current_namespace(source)
            value = self.get()
            if value is None:
                continue
            self.clear()
            merged = value if merged is None else self._reduce(merged, value)
        self.set_current_namespace(target)
        if merged is not None:
            self.add(merged)
