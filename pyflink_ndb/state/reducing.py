"""`ReducingState` on tiered storage: one entry per key holding the reduced value."""

from __future__ import annotations

from typing import Any

from pyflink.datastream.functions import ReduceFunction
from pyflink.datastream.state import ReducingState

from pyflink_ndb.serialization.values import decode_value, encode_value
from pyflink_ndb.state.base import TieredState


class TieredReducingState(TieredState, ReducingState):
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
        key_bytes, key_group = self._backend.require_key()
        data = self._read(key_bytes, key_group)
        return None if data is None else decode_value(data)

    def add(self, value: Any) -> None:
        if value is None:
            self.clear()
            return
        current = self.get()
        result = value if current is None else self._reduce(current, value)
        key_bytes, key_group = self._backend.require_key()
        self._write(key_bytes, key_group, encode_value(result))

    def clear(self) -> None:
        key_bytes, key_group = self._backend.require_key()
        self._write(key_bytes, key_group, None)
