"""Wrappers that run the user's keyed function on tiered state.

The wrapper is what PyFlink pickles; inside the TaskManager its `open()` claims the
backend the bridge bound on this task thread, hands the user a
:class:`TieredRuntimeContext`, and before each record or timer tells the backend the
current key.
"""

from __future__ import annotations

from typing import Any

from pyflink.datastream import KeyedCoProcessFunction, KeyedProcessFunction, RuntimeContext

from pyflink_ndb.api.context import TieredRuntimeContext
from pyflink_ndb.runtime.bridge import claim_bound_backend


class TieredKeyedProcessFunction(KeyedProcessFunction):
    """Runs `function` (a `KeyedProcessFunction`) with tiered keyed state."""

    def __init__(self, function: KeyedProcessFunction) -> None:
        self.function = function
        self._backend: Any = None

    def open(self, runtime_context: RuntimeContext) -> None:
        self._backend = claim_bound_backend()
        self.function.open(TieredRuntimeContext(runtime_context, self._backend))

    def close(self) -> None:
        self.function.close()

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        if not self._backend.keys_from_records:
            self._backend.set_current_key(ctx.get_current_key())
        return self.function.process_element(value, ctx)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext) -> Any:
        self._backend.set_current_key(ctx.get_current_key())
        return self.function.on_timer(timestamp, ctx)


class TieredKeyedCoProcessFunction(KeyedCoProcessFunction):
    """Runs `function` (a `KeyedCoProcessFunction`) with tiered keyed state."""

    def __init__(self, function: KeyedCoProcessFunction) -> None:
        self.function = function
        self._backend: Any = None

    def open(self, runtime_context: RuntimeContext) -> None:
        self._backend = claim_bound_backend()
        self.function.open(TieredRuntimeContext(runtime_context, self._backend))

    def close(self) -> None:
        self.function.close()

    def process_element1(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
        if not self._backend.keys_from_records:
            self._backend.set_current_key(ctx.get_current_key())
        return self.function.process_element1(value, ctx)

    def process_element2(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
        if not self._backend.keys_from_records:
            self._backend.set_current_key(ctx.get_current_key())
        return self.function.process_element2(value, ctx)

    def on_timer(self, timestamp: int, ctx: KeyedCoProcessFunction.OnTimerContext) -> Any:
        self._backend.set_current_key(ctx.get_current_key())
        return self.function.on_timer(timestamp, ctx)
