"""Module-level functions of the benchmark jobs (pickled by reference, never by value:
cloudpickle shares closure cells and class attributes of dynamic classes between the
subtasks that unpickle them, so nothing mutable lives outside instance attributes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction, KeySelector, RuntimeContext
from pyflink.datastream.state import ValueStateDescriptor

#: Keys of this prefix mark the end of the input of the state-building job.
END_PREFIX = "end-"
PAYLOAD = "x" * 100
#: Longest wait at the gate of :class:`KeyedCounter` (then it goes on regardless).
GATE_TIMEOUT_S = 300.0


def parse_key_line(line: str) -> str | None:
    """A line of a generated key file: the key itself (None for an empty line)."""
    key = line.strip()
    return key or None


#: pyflink-ndb's option; `--flink-conf` of bench.profile and bench.recovery with it set
#: pins pyflink-ndb's TaskManager threads (the option) and Flink's backends' (the jobs'
#: functions call :func:`pin_like_the_option`) alike.
CPU_PIN_OPTION = "state.backend.ndb.python.cpu-pin"


def pin_like_the_option(setting: str) -> None:
    """For Flink's own backends, what pyflink-ndb's `state.backend.ndb.python.cpu-pin` does
    (`setting`: `off`, `auto` or a CPU): the TaskManager's Python threads on one CPU,
    pinned from the calling operator's thread (:mod:`pyflink_ndb.cpu_pin`; it stays for the
    JVM's later jobs). Call :func:`release_inherited` now and then (the backend does it at
    every completed checkpoint) so that Flink's asynchronous checkpoint threads, started
    from a pinned task thread, keep every CPU."""
    from pyflink_ndb.cpu_pin import cpu_of_setting, pin_python_threads

    cpu = cpu_of_setting(setting)
    if cpu is not None:
        pin_python_threads(cpu)


def release_inherited() -> None:
    """:func:`pyflink_ndb.cpu_pin.release_inherited` (nothing when not pinned)."""
    from pyflink_ndb.cpu_pin import release_inherited as release

    release()


class KeyedCounter(KeyedProcessFunction):
    """A ValueState of (updates, 100-character payload) per key.

    `marker_dir`: per subtask, writes `end-<i>` when the first key starting with
    :data:`END_PREFIX` arrives (all the subtask's earlier records are then processed: the
    input comes from one source split, in order) and `first-<i>` holding `time.time()`
    after the first record's state access (restore time probe).

    `gate`: when given, each subtask waits after writing `first-<i>` until that file exists
    (polling, at most :data:`GATE_TIMEOUT_S`): while a subtask waits, no checkpoint of the
    job can complete, so nothing of pyflink-ndb's background cleanup runs and the bench
    sees the state rows as they were at the first record. Create the file after
    cancelling the job (Flink cannot interrupt the waiting Python code).
    """

    def __init__(self, marker_dir: str, gate: str | None = None) -> None:
        self.marker_dir = marker_dir
        self.gate = gate

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(
            ValueStateDescriptor("counter", Types.PICKLED_BYTE_ARRAY()))
        self.subtask = runtime_context.get_index_of_this_subtask()
        self.first_done = False
        self.end_done = False

    def _mark(self, name: str, text: str) -> None:
        path = Path(self.marker_dir) / f"{name}-{self.subtask}"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        if value.startswith(END_PREFIX):
            if not self.end_done:
                self.end_done = True
                self._mark("end", "1")
            return
        current = self.state.value()
        self.state.update((1 if current is None else current[0] + 1, PAYLOAD))
        if not self.first_done:
            self.first_done = True
            self._mark("first", repr(time.time()))
            if self.gate is not None:
                deadline = time.monotonic() + GATE_TIMEOUT_S
                while not os.path.exists(self.gate) and time.monotonic() < deadline:
                    time.sleep(0.01)
        yield value


class ModuloKey(KeySelector):
    """Key of a number of the sequence source: `value % keys` (an int)."""

    def __init__(self, keys: int) -> None:
        self.keys = keys

    def get_key(self, value: int) -> int:
        return value % self.keys


class RateCounter(KeyedProcessFunction):
    """A ValueState counter (LONG) per key, updated for every record; emits nothing.

    Counts the records it processed per wall-clock second (`int(time.time())`) and appends
    a line `second count` to `<rate_dir>/rate-<subtask>` when a second is over (one
    small file write per second; the last, partial second of a cancelled job is lost).

    `cpu_pin`: run the TaskManager's Python threads on one CPU (:mod:`pyflink_ndb.cpu_pin`),
    for Flink's own backends (pyflink-ndb's runs set `python.cpu-pin` instead).

    `or_terms` (an experiment, None: off): sets pyflink-ndb's `StateStore.max_or_terms`
    (OR-terms per point-read/delete statement) in the TaskManager's interpreter, to
    measure the checkpoint job with smaller statements without changing the package.
    """

    def __init__(self, rate_dir: str, or_terms: int | None = None,
                 cpu_pin: bool = False) -> None:
        self.rate_dir = rate_dir
        self.or_terms = or_terms
        self.cpu_pin = cpu_pin

    def open(self, runtime_context: RuntimeContext) -> None:
        if self.cpu_pin:
            pin_like_the_option("auto")
        if self.or_terms is not None:
            # The TaskManager's interpreter outlives the job: later jobs of the same JVM
            # see the value too (the bench runs this experiment last).
            from pyflink_ndb.stores.base import StateStore

            StateStore.max_or_terms = self.or_terms
        self.state = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.path = Path(self.rate_dir) / f"rate-{runtime_context.get_index_of_this_subtask()}"
        self.second = 0
        self.count = 0

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context) -> Any:
        current = self.state.value()
        self.state.update(1 if current is None else current + 1)
        now = int(time.time())
        if now != self.second:
            if self.cpu_pin:
                release_inherited()
            if self.count:
                with self.path.open("a") as f:
                    f.write(f"{self.second} {self.count}\n")
            self.second = now
            self.count = 0
        self.count += 1
        yield from ()
