"""`ValueState` on tiered storage: one entry per key."""

from __future__ import annotations

from typing import Any

from pyflink.fn_execution.internal_state import InternalValueState

from pyflink_ndb.serialization.values import decode_value, encode_value
from pyflink_ndb.state.base import TieredState


class TieredValueState(TieredState, InternalValueState):
    """A `ValueState`: `value()` is None when unset; `update(None)` clears (Flink's contract).
    `value()` returns a fresh copy each call; mutating it changes nothing stored."""

    kind = "value"

    def value(self) -> Any:
        key_bytes, key_group = self._key()
        data = self._read(key_bytes, key_group)
        return None if data is None else decode_value(data)

    def update(self, value: Any) -> None:
        key_bytes, key_group = self._key()
        self._write(key_bytes, key_group, None if value is None else encode_value(value))

    def clear(self) -> None:
        key_bytes, key_group = self._key()
        self._write(key_bytes, key_group, None)
