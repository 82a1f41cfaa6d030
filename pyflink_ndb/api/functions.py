"""Wrappers that run the user's keyed function on tiered state.

The wrapper is what PyFlink pickles; inside the TaskManager its `open()` claims the
backend the bridge bound on this task thread and hands the user a
:class:`TieredRuntimeContext`. Before each record the backend learns the current key: from
the record itself when the bridge could hook the operation (no call into Java), otherwise
from `ctx.get_current_key()`; before each timer always from the timer context. When the
key comes from the record, the record context's own `get_current_key()` answers it too
(:func:`pyflink_ndb._pyflink.answer_key_from_record`): a user's function that asks its
key per record does not call into Java either.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pyflink.datastream import (
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    RuntimeContext,
)
from pyflink.datastream.functions import InternalWindowFunction

from pyflink_ndb import _pyflink
from pyflink_ndb.api.context import TieredRuntimeContext, TieredStates
from pyflink_ndb.errors import ConfigurationError, NdbStateError
from pyflink_ndb.runtime.bridge import claim_bound_backend
from pyflink_ndb.runtime.metrics import register as register_metrics

log = logging.getLogger(__name__)


class _TieredFunction:
    """Life cycle shared by the wrappers: `function` is the user's keyed function.

    An error of the tiered state (a value too large, one that cannot be serialized, an
    unreachable database: :class:`~pyflink_ndb.errors.NdbStateError`, whose message says
    the fix) is logged once per subtask attempt at ERROR, then re-raised: Flink's restart
    strategy decides what follows.
    """

    def __init__(self, function: Any) -> None:
        self.function = function
        self._backend: Any = None
        self._logged: set[str] = set()
        self._contexts: list[Any] = []  # record contexts that answer the key themselves

    def _guard(self, result: Any) -> Iterator[Any]:
        """Iterate the user's results (a generator runs the state calls lazily)."""
        try:
            if result is not None:
                yield from result
        except NdbStateError as err:
            self._log_once(err)
            raise

    def _log_once(self, err: NdbStateError) -> None:
        kind = type(err).__name__
        if kind not in self._logged:
            self._logged.add(kind)
            log.error("pyflink-ndb: the job failed on its tiered state: %s: %s", kind, err)

    def _claim(self, runtime_context: RuntimeContext) -> None:
        """Take the backend the bridge bound on this thread; register its metrics."""
        self._backend = claim_bound_backend()
        self._backend.metrics = register_metrics(runtime_context, self._backend)

    def open(self, runtime_context: RuntimeContext) -> None:
        self._claim(runtime_context)
        self.function.open(TieredRuntimeContext(runtime_context, self._backend))

    def close(self) -> None:
        self.function.close()

    def _record_key(self, ctx: Any) -> None:
        if not self._backend.keys_from_records:
            self._backend.set_current_key(ctx.get_current_key())
        elif ctx not in self._contexts:  # identity first: PyFlink passes one context
            self._contexts.append(ctx)
            _pyflink.answer_key_from_record(ctx, self._backend)
            if (self._backend.bundle_contexts
                    and not _pyflink.answer_from_bundle(ctx, self._backend)
                    and self._backend.bundle is not None):
                raise ConfigurationError(
                    "pyflink-ndb cannot give the records of a bundle their own context "
                    "(this apache-flink version's record context has another shape): set "
                    "state.backend.ndb.bundle.records to 0.")

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        self._backend.set_current_key(ctx.get_current_key())
        return self._call(self.function.on_timer, timestamp, ctx)

    def _invoke(self, method: Any, *args: Any) -> Any:
        """`method(*args)`, an NdbStateError logged once."""
        try:
            return method(*args)
        except NdbStateError as err:
            self._log_once(err)
            raise

    def _call(self, method: Any, value: Any, ctx: Any) -> Any:
        return self._guard(self._invoke(method, value, ctx))


class TieredKeyedProcessFunction(_TieredFunction, KeyedProcessFunction):
    """Runs `function` (a `KeyedProcessFunction`) with tiered keyed state; its records
    may come in bundles (`bundle.records`: the record context answers for each record,
    :func:`pyflink_ndb._pyflink.answer_from_bundle`)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        super().open(runtime_context)
        self._backend.bundle_contexts = True

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        self._record_key(ctx)
        return self._call(self.function.process_element, value, ctx)


class TieredKeyedCoProcessFunction(_TieredFunction, KeyedCoProcessFunction):
    """Runs `function` (a `KeyedCoProcessFunction`) with tiered keyed state."""

    def process_element1(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
        self._record_key(ctx)
        return self._call(self.function.process_element1, value, ctx)

    def process_element2(self, value: Any, ctx: KeyedCoProcessFunction.Context) -> Any:
        self._record_key(ctx)
        return self._call(self.function.process_element2, value, ctx)


class TieredKeyedBroadcastProcessFunction(_TieredFunction, KeyedBroadcastProcessFunction):
    """Runs `function` (a `KeyedBroadcastProcessFunction`) with tiered keyed state; the
    broadcast state stays in Flink (operator state, `ctx.get_broadcast_state(...)`).

    A broadcast element has no key of its own: Flink sets none for it
    (`PythonKeyedBroadcastStateTransformationTranslator` gives the broadcast input no key
    selector), so keyed state touched in `process_broadcast_element` is the last record's
    key's, as on Flink's own backends (PyFlink has no `apply_to_keyed_state`).
    """

    def open(self, runtime_context: RuntimeContext) -> None:
        super().open(runtime_context)
        self._backend.second_input_keyed = False

    def process_element(self, value: Any, ctx: KeyedBroadcastProcessFunction.ReadOnlyContext
                        ) -> Any:
        self._record_key(ctx)
        return self._call(self.function.process_element, value, ctx)

    def process_broadcast_element(self, value: Any,
                                  ctx: KeyedBroadcastProcessFunction.Context) -> Any:
        return self._call(self.function.process_broadcast_element, value, ctx)


class TieredWindowFunction(_TieredFunction, InternalWindowFunction):
    """Runs PyFlink's window operator (`fn_execution/datastream/window/window_operator.py`)
    on tiered state: wraps the descriptor's internal window function, whose `open()` the
    window operator calls first, before it declares any state.

    `open()` routes the operation's keyed state backend to :class:`TieredStates`, so the
    window contents (namespace = the window), trigger state, the merging window set,
    `window_state()` and `global_state()` are tiered; the timers stay in Flink (the Java
    `NdbWindowOperator`). The current key comes from each record and each timer
    (:meth:`SubtaskStateBackend.attach_operation`).
    """

    @staticmethod
    def wrap_descriptor(descriptor: Any) -> Any:
        """A copy of PyFlink's `WindowOperationDescriptor` whose internal window function
        is wrapped."""
        import copy

        wrapped = copy.copy(descriptor)
        wrapped.internal_window_function = TieredWindowFunction(
            descriptor.internal_window_function)
        return wrapped

    def open(self, runtime_context: RuntimeContext) -> None:
        self._claim(runtime_context)
        states = TieredStates(self._backend)
        if not _pyflink.route_keyed_state(runtime_context, states.get):
            raise ConfigurationError(
                "pyflink-ndb could not reach the keyed state of PyFlink's window operation "
                "(this apache-flink version is not supported: see README, \"Install from a "
                "wheel\": Flink 1.20). Turn state.backend.ndb.enabled off for this job.")
        self._backend.timer_keys_from_context = True
        self.function.open(runtime_context)

    def process(self, key: Any, window: Any, context: Any, input_data: Any) -> Any:
        return list(self._guard(
            self._invoke(self.function.process, key, window, context, input_data)))

    def clear(self, window: Any, context: Any) -> None:
        self._invoke(self.function.clear, window, context)
