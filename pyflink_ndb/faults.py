"""Fault-injection harness: a job whose committed state can be checked exactly.

The idea is Flink's `SemanticsCheckMapper`: key `k` receives the records `1 .. N_k` in
order, and its state is `(last sequence number seen, records counted, gaps seen)`. With
exactly-once state the committed state of every completed checkpoint has
`count == last` for every key, and the final state has `count == last == N_k`: a record
whose update was lost leaves `count < N_k`, one applied twice `count > N_k`. A record
replayed after a restore is not a double (the restored state does not contain it).

* :func:`write_sequence_input` writes the input file (lines `key,seq`), returns the model.
* :class:`ParseSequence` (a `MapFunction`, optionally throttled through a control file)
  and :class:`SequenceCheck` (the keyed function) make the job; :class:`RandomCrashes`
  wraps any `KeyedProcessFunction` to fail at random points of its first attempts.
* :func:`read_sequence_state` and :func:`check_sequence_state` compare the committed
  state with the model (:class:`Verdict`).

Events (crashes, attempts opening, first records, errors of state updates) are appended
as JSON lines to a file that the driver reads (one `os.write` per line, `O_APPEND`).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction, MapFunction
from pyflink.datastream.state import ValueStateDescriptor

from pyflink_ndb.errors import NdbStateError
from pyflink_ndb.testing import InjectedFailure

OPERATOR_UID = "seq-check"
STATE_NAME = "seq"
#: Output type of :class:`ParseSequence`: (key, sequence number, flag).
RECORD_TYPE = Types.TUPLE([Types.STRING(), Types.LONG(), Types.STRING()])
#: Crash points of :class:`RandomCrashes`: at open (after the claim of a restore, before
#: the first record), after a random number of records, while the background writer
#: writes an epoch, right after a checkpoint completed (completion and GC under way).
CRASH_MODES = ("open", "records", "writing", "completed")
#: A fault that is no crash (name it in `modes` to use it): SIGKILL the subtask's write
#: process (`write.process`) while the writer writes an epoch, up to
#: :data:`WRITE_PROCESS_KILLS` times; the attempt goes on (the writer writes the rest).
KILL_WRITE_PROCESS = "kill-write-process"
WRITE_PROCESS_KILLS = 2


def log_event(path: str | None, event: str, **fields: Any) -> None:
    """Append `{"event": event, "t": unix seconds, **fields}` to `path` (None: nothing)."""
    if not path:
        return
    line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **fields})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of :func:`log_event`, in file order (a torn last line is skipped)."""
    out: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def write_sequence_input(path: str | Path, keys: int, min_per_key: int, max_per_key: int,
                         seed: int = 0) -> dict[str, int]:
    """Write `N_k` records per key (`N_k` uniform in [min_per_key, max_per_key]) as lines
    `key,seq`, keys interleaved at random, each key's records in order.

    :returns: the model, key -> N_k.
    """
    rng = random.Random(seed)
    model = {f"k{i:05d}": rng.randint(min_per_key, max_per_key) for i in range(keys)}
    slots = [key for key, n in model.items() for _ in range(n)]
    rng.shuffle(slots)
    nxt = dict.fromkeys(model, 0)
    with open(path, "w") as out:
        for key in slots:
            nxt[key] += 1
            out.write(f"{key},{nxt[key]}\n")
    return model


def mark_bad_record(path: str | Path, line_no: int, flag: str) -> str:
    """Turn line `line_no` (0-based) into a bad record (`key,seq,flag`, e.g. `unpicklable`
    or `oversized`); returns the original line. :func:`fix_bad_record` restores it padded
    to the same length, so that a checkpointed file offset stays valid."""
    lines = Path(path).read_text().splitlines(keepends=True)
    original = lines[line_no].rstrip("\n")
    lines[line_no] = f"{original},{flag}\n"
    Path(path).write_text("".join(lines))
    return original


def fix_bad_record(path: str | Path, line_no: int) -> None:
    """Drop the flag of a line that :func:`mark_bad_record` changed, keeping its length."""
    lines = Path(path).read_text().splitlines(keepends=True)
    bad = lines[line_no].rstrip("\n")
    fixed = ",".join(bad.split(",")[:2])
    lines[line_no] = fixed.ljust(len(bad)) + "\n"
    Path(path).write_text("".join(lines))


class ParseSequence(MapFunction):
    """`key,seq[,flag]` -> (key, seq, flag). Waits `throttle_ms` per record; with
    `control_file`, the throttle (ms, a float) is re-read from that file every 200
    records, so a driver can slow a job down while it injects faults and speed it up to
    finish."""

    def __init__(self, throttle_ms: float = 0.0, control_file: str | None = None) -> None:
        self.throttle_ms = throttle_ms
        self.control_file = control_file
        self.seen = 0

    def map(self, value: str) -> tuple[str, int, str]:
        self.seen += 1
        if self.control_file and self.seen % 200 == 1:
            try:
                self.throttle_ms = float(Path(self.control_file).read_text() or 0)
            except (OSError, ValueError):
                pass
        if self.throttle_ms > 0:
            time.sleep(self.throttle_ms / 1000)
        parts = value.strip().split(",")
        return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else ""


class SequenceCheck(KeyedProcessFunction):
    """Per key `(last, count, gaps)`: `seq != last + 1` counts a gap (a lost or repeated
    update as the function sees it). A record flagged `unpicklable` stores a lock (a
    SerializationError), one flagged `oversized` a value of `oversize_bytes` (a
    ValueTooLargeError when over `value.max-bytes`); the error is logged to `events`."""

    def __init__(self, events: str | None = None, oversize_bytes: int = 1 << 20) -> None:
        self.events = events
        self.oversize_bytes = oversize_bytes

    def open(self, runtime_context: Any) -> None:
        self.state = runtime_context.get_state(
            ValueStateDescriptor(STATE_NAME, Types.PICKLED_BYTE_ARRAY()))

    def process_element(self, value: Any, ctx: Any) -> Any:
        key, seq, flag = value[0], value[1], value[2]
        last, count, gaps = self.state.value() or (0, 0, 0)
        if seq != last + 1:
            gaps += 1
        updated: tuple[Any, ...] = (seq, count + 1, gaps)
        if flag == "unpicklable":
            updated += (threading.Lock(),)
        elif flag == "oversized":
            updated += (b"x" * self.oversize_bytes,)
        try:
            self.state.update(updated)
        except NdbStateError as err:
            log_event(self.events, "error", key=key, seq=seq, flag=flag,
                      error=type(err).__name__, message=str(err)[:300])
            raise
        yield key, seq


class RandomCrashes(KeyedProcessFunction):
    """Wraps a `KeyedProcessFunction`; attempt `a < crashes` of the job fails once, in
    one subtask drawn from `Random(seed * 1000 + a)`, in mode `modes[(seed + a) %
    len(modes)]` (:data:`CRASH_MODES`: every mode in turn) after a record count drawn
    from [1, max_records]. Logs `open` and
    `first_record` for every attempt, `crash` before it raises :class:`InjectedFailure`.

    Attempt numbers are Flink's (`get_attempt_number`): a failover of the region restarts
    every subtask with the next one, so the plan holds for any restart, also one that a
    fault outside this wrapper caused. A "writing" crash that never sees the writer busy
    fails after 3 × its record count anyway (logged with `writing: null`).
    """

    def __init__(self, function: KeyedProcessFunction, events: str | None, crashes: int,
                 seed: int = 0, max_records: int = 2000,
                 modes: Iterable[str] = CRASH_MODES) -> None:
        self.function = function
        self.events = events
        self.crashes = crashes
        self.seed = seed
        self.max_records = max_records
        self.modes = tuple(modes)

    def open(self, runtime_context: Any) -> None:
        self.backend = runtime_context.backend
        self.attempt = runtime_context.get_attempt_number()
        self.subtask = runtime_context.get_index_of_this_subtask()
        parallelism = runtime_context.get_number_of_parallel_subtasks()
        self.seen = 0
        self.kills = 0
        self.killed_pid: int | None = None
        self.mode: str | None = None
        self.completed_at: int | None = None
        if self.attempt < self.crashes:
            rng = random.Random(self.seed * 1000 + self.attempt)
            if rng.randrange(parallelism) == self.subtask:
                self.mode = self.modes[(self.seed + self.attempt) % len(self.modes)]
                self.threshold = rng.randint(1, self.max_records)
        log_event(self.events, "open", attempt=self.attempt, subtask=self.subtask,
                  parallelism=parallelism, plan=self.mode)
        self.function.open(runtime_context)
        if self.mode == "open":
            self._crash()

    def close(self) -> None:
        process = self.backend.protocol.render_process
        if process is not None:
            log_event(self.events, "write_process", attempt=self.attempt,
                      subtask=self.subtask, written_epochs=process.written_epochs,
                      fallbacks=process.fallbacks, starts=process.starts)
        self.function.close()

    def _crash(self, writing: int | None = None) -> None:
        protocol = self.backend.protocol
        log_event(self.events, "crash", attempt=self.attempt, subtask=self.subtask,
                  mode=self.mode, records=self.seen, completed=protocol.completed,
                  writing=writing)
        raise InjectedFailure(f"injected {self.mode} crash of attempt {self.attempt} "
                              f"after {self.seen} records (pyflink_ndb.faults)")

    def _kill_write_process(self) -> None:
        """SIGKILL the write process while the writer writes an epoch (each child once);
        log `kill` with the checkpoint; after :data:`WRITE_PROCESS_KILLS` kills the plan
        ends."""
        protocol = self.backend.protocol
        writing = protocol.writer.writing()
        process = protocol.render_process
        pid = process.pid if process is not None else None
        if writing is None or pid is None or pid == self.killed_pid:
            return
        os.kill(pid, signal.SIGKILL)
        self.killed_pid = pid
        self.kills += 1
        log_event(self.events, "kill", attempt=self.attempt, subtask=self.subtask,
                  records=self.seen, writing=writing, pid=pid)
        if self.kills >= WRITE_PROCESS_KILLS:
            self.mode = None

    def process_element(self, value: Any, ctx: Any) -> Any:
        self.seen += 1
        if self.seen == 1:
            log_event(self.events, "first_record", attempt=self.attempt,
                      subtask=self.subtask)
        elif self.seen % 1000 == 0:
            backend = self.backend
            retries = backend.store.retries + (backend.write_store.retries
                                               if backend.write_store is not None else 0)
            log_event(self.events, "progress", attempt=self.attempt, subtask=self.subtask,
                      records=self.seen, retries=retries,
                      completed=backend.protocol.completed)
        if self.mode is not None and self.seen >= self.threshold:
            protocol = self.backend.protocol
            if self.mode == "records":
                self._crash()
            elif self.mode == "writing":
                writing = protocol.writer.writing()
                if writing is not None or self.seen >= 3 * self.threshold:
                    self._crash(writing)
            elif self.mode == KILL_WRITE_PROCESS:
                self._kill_write_process()
            elif self.mode == "completed":
                if self.completed_at is None:
                    self.completed_at = protocol.completed
                elif (protocol.completed > self.completed_at
                      or self.seen >= 20 * self.threshold):
                    self._crash()
        return self.function.process_element(value, ctx)

    def on_timer(self, timestamp: int, ctx: Any) -> Any:
        return self.function.on_timer(timestamp, ctx)


@dataclass
class Verdict:
    """The committed state against the model (counts of records)."""

    keys: int = 0
    records: int = 0
    lost: int = 0
    doubled: int = 0
    wrong_last: int = 0
    gaps: int = 0
    examples: list[tuple[str, int | None, Any]] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not (self.lost or self.doubled or self.wrong_last or self.gaps)


def read_sequence_state(store: Any, operator: str = OPERATOR_UID
                        ) -> dict[str, tuple[int, int, int]]:
    """key -> (last, count, gaps) of the committed checkpoint (`iter_committed`)."""
    from pyflink_ndb.serialization.keys import decode_key
    from pyflink_ndb.serialization.values import decode_value

    return {decode_key(row["ukey"]): tuple(decode_value(row["vbytes"])[:3])
            for row in store.iter_committed(operator, STATE_NAME)}


def check_sequence_state(state: Mapping[str, tuple[int, int, int]],
                         model: Mapping[str, int] | None = None) -> Verdict:
    """Compare: with `model` (key -> N_k) the final state (`count == last == N_k`);
    without it any committed checkpoint mid-run (`count == last`). Lost = records the
    state misses, doubled = records it holds twice."""
    verdict = Verdict(keys=len(model if model is not None else state))
    keys = set(state) | set(model or ())
    for key in sorted(keys):
        last, count, gaps = state.get(key, (0, 0, 0))
        wanted = last if model is None else model.get(key, 0)
        verdict.records += wanted
        verdict.lost += max(0, wanted - count)
        verdict.doubled += max(0, count - wanted)
        verdict.gaps += gaps
        bad = count != wanted or gaps
        if model is not None and last != wanted:
            verdict.wrong_last += 1
            bad = True
        if bad and len(verdict.examples) < 5:
            verdict.examples.append((key, wanted, state.get(key)))
    return verdict
