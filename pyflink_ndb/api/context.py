"""The runtime context handed to the user's `open()`: PyFlink's own, except that keyed
state comes from the tiered backend."""

from __future__ import annotations

from typing import Any

from pyflink.datastream import RuntimeContext
from pyflink.datastream.state import (
    AggregatingStateDescriptor,
    ListStateDescriptor,
    MapStateDescriptor,
    ReducingStateDescriptor,
    ValueStateDescriptor,
)

from pyflink_ndb._pyflink import stable_state_name
from pyflink_ndb.errors import StateCompatibilityError
from pyflink_ndb.runtime.backend import SubtaskStateBackend
from pyflink_ndb.state import (
    TieredAggregatingState,
    TieredListState,
    TieredMapState,
    TieredReducingState,
    TieredValueState,
)
from pyflink_ndb.state.base import TieredState

#: The tiered state class of each kind of PyFlink descriptor.
STATE_CLASSES: dict[type, type[TieredState]] = {
    ValueStateDescriptor: TieredValueState,
    ListStateDescriptor: TieredListState,
    MapStateDescriptor: TieredMapState,
    ReducingStateDescriptor: TieredReducingState,
    AggregatingStateDescriptor: TieredAggregatingState,
}


class TieredStates:
    """The tiered states of one operator instance, by name.

    Asking twice for a state of the same name returns the same object (its namespace reset
    to none, as Flink's `getPartitionedState` does); asking for it as another kind raises
    :class:`StateCompatibilityError`, as Flink does.
    """

    def __init__(self, backend: SubtaskStateBackend) -> None:
        self.backend = backend
        self._states: dict[str, TieredState] = {}

    def get(self, descriptor: Any) -> Any:
        """The state of `descriptor` (a PyFlink state descriptor).

        :raises StateCompatibilityError: the name is declared as another kind.
        :raises TypeError: not one of PyFlink's five keyed-state descriptors.
        """
        cls = STATE_CLASSES.get(type(descriptor))
        if cls is None:
            cls = next((c for d, c in STATE_CLASSES.items() if isinstance(descriptor, d)),
                       None)
        if cls is None:
            raise TypeError(f"Not a keyed state descriptor: {type(descriptor).__name__}.")
        name = stable_state_name(descriptor.get_name())
        state = self._states.get(name)
        if state is None:
            state = cls(self.backend, descriptor)
            self._states[name] = state
        elif not isinstance(state, cls):
            raise StateCompatibilityError(
                f"State {name!r} is already declared as {state.kind}, not {cls.kind}.")
        state.set_current_namespace(None)
        return state


class TieredRuntimeContext(RuntimeContext):
    """Delegates to PyFlink's runtime context; `get_*_state` return tiered states
    (:class:`TieredStates`)."""

    def __init__(self, delegate: RuntimeContext, backend: SubtaskStateBackend) -> None:
        self._delegate = delegate
        self._backend = backend
        self._states = TieredStates(backend)

    def get_state(self, state_descriptor: ValueStateDescriptor) -> Any:
        return self._states.get(state_descriptor)

    def get_list_state(self, state_descriptor: ListStateDescriptor) -> Any:
        return self._states.get(state_descriptor)

    def get_map_state(self, state_descriptor: MapStateDescriptor) -> Any:
        return self._states.get(state_descriptor)

    def get_reducing_state(self, state_descriptor: ReducingStateDescriptor) -> Any:
        return self._states.get(state_descriptor)

    def get_aggregating_state(self, state_descriptor: AggregatingStateDescriptor) -> Any:
        return self._states.get(state_descriptor)

    def get_task_name(self) -> str:
        return self._delegate.get_task_name()

    def get_number_of_parallel_subtasks(self) -> int:
        return self._delegate.get_number_of_parallel_subtasks()

    def get_max_number_of_parallel_subtasks(self) -> int:
        return self._delegate.get_max_number_of_parallel_subtasks()

    def get_index_of_this_subtask(self) -> int:
        return self._delegate.get_index_of_this_subtask()

    def get_attempt_number(self) -> int:
        return self._delegate.get_attempt_number()

    def get_task_name_with_subtasks(self) -> str:
        return self._delegate.get_task_name_with_subtasks()

    def get_job_parameter(self, key: str, default_value: str) -> str:
        return self._delegate.get_job_parameter(key, default_value)

    def get_metrics_group(self) -> Any:
        return self._delegate.get_metrics_group()

    @property
    def backend(self) -> SubtaskStateBackend:
        """The subtask's tiered backend (for diagnostics and tests)."""
        return self._backend
