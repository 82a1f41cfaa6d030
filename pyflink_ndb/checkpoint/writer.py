"""The background writer of one subtask: the store work of the checkpoint protocol, off the
task thread (docs/protocol.md, "Asynchronous flush").

Flink splits a snapshot into a synchronous phase on the task thread, which must be short
(records wait meanwhile), and an asynchronous phase that Flink's `AsyncCheckpointRunnable`
waits for on a thread of its own before the task acknowledges the checkpoint
(`org.apache.flink.streaming.runtime.tasks.AsyncCheckpointRunnable`,
`OperatorSnapshotFinalizer`). The synchronous phase of this backend only freezes the dirty
set; the jobs of this module render and write it, and report each checkpoint's outcome
(`on_durable` / `on_failed`) to the Java bridge, which completes the future that Flink's
asynchronous phase waits for.

Jobs run one at a time, in the order they were submitted (a single thread with a FIFO
queue): epochs are written in checkpoint order, and a completion or an abort runs after
the write it refers to. Background jobs (garbage collection, prefetch pages) run only when
nothing else waits, so they never hold a checkpoint back. The task thread only submits
jobs and, at each hook, takes the outcomes (:meth:`BackgroundWriter.take_outcomes`).

Threads and the GIL (measured with PEMJA 0.5.7, java-bridge/README.md): PEMJA releases
the GIL whenever a call from Java into Python returns, so this thread runs while the task
thread is in Java; it competes for the GIL while the task thread runs Python, and yields it
between statements and every few hundred rendered rows, sleeping as long as the CPU time
it used since the last yield (:data:`WRITER_PACE`): the task threads get the GIL at least
half of the time while a write renders, and the write's waits for the database cost no
sleep. While the write process (`write.process`) runs the epochs' statements and garbage
collection's deletes, the writer neither sleeps nor yields (:data:`WRITER_PACE_WITH_PROCESS`):
the interpreter's switch interval shares the lock, and under the task threads' load each
yield cost the writer up to a switch interval (5 ms) to get the lock back.

`inline=True` runs each job at once on the caller's thread (no thread): the synchronous
flush of `state.backend.ndb.write.async: false`, and of stores that cannot be opened
twice (`sqlite:///:memory:`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pyflink_ndb.cpu_pin import forget_current_thread, pin_current_thread
from pyflink_ndb.errors import CheckpointError, FencedError

log = logging.getLogger(__name__)

#: Seconds that :meth:`BackgroundWriter.close` waits for a running job to stop.
CLOSE_WAIT_SECONDS = 10.0
#: Seconds :meth:`BackgroundWriter.close` waits for a running checkpoint job (a write or
#: completion) to reach its next cancellation point before it interrupts the statement in
#: flight (when given a way to) on a drained close. Background work (garbage collection,
#: prefetch pages) and every job of a cancel or failure are interrupted at once: what the
#: interrupt loses is redone or dropped anyway, and Flink deploys the next attempt only
#: once this close returns.
INTERRUPT_AFTER_SECONDS = 0.05
#: Seconds an idle writer thread lives on (a new one starts with the next job).
IDLE_EXIT_SECONDS = 5.0
#: The writer's pace: at each yield it sleeps this many times the CPU time it used since
#: the previous one, so that it holds the GIL at most 1 / (1 + WRITER_PACE) of the time
#: while it renders and builds statements (its waits for the database hold no GIL and
#: cost no sleep). 0: no pause and no yield (the interpreter's switch interval alone
#: shares the GIL).
#: Measured on the checkpoint job of `make bench` (MariaDB, two runs each): the seconds in
#: which a write ran processed 0.83× the records of the other seconds with 0, 0.90× with 1.
WRITER_PACE = 1.0
#: The pace of a writer while the write process runs the epochs' statements and garbage
#: collection's deletes (`write.process`, the default with 2 CPUs or more): none, not
#: even a yield (`time.sleep(0)`): under the task threads' load, taking the GIL back after
#: a yield waits up to a switch interval (5 ms), and the writer yielded every 256 rows it
#: read (2026-12-06: an epoch of 33,000 entries with two busy Python threads took 5.4 s
#: to write with the yields and 64 KiB pipes to the child, 1.3 s without the busy
#: threads).
#: The writer's Python work then is the epoch's rows collected from tiers 1-2, its
#: frames to the child, the ledger and garbage collection's decisions, plus the
#: statements it still runs itself (garbage collection's version reads, adoption and
#: cleanup, the snapshot row), whose waits hold no GIL; a pause after that work only
#: lengthened the asynchronous phase: bench part 7 (user-profile job,
#: 2026-12-06, `bench.profile ndb-mariadb rocksdb-full`, two runs each) gave 0.88-1.10×
#: RocksDB's records/s with checkpoints of 6.2-6.6 s end to end (median) with the pace,
#: 1.03-1.07× with 4.4-5.6 s without; a py-spy profile of the writers with the pace put
#: 32% of their busy time in its sleeps.
WRITER_PACE_WITH_PROCESS = 0.0

#: The longest single pacing sleep, seconds.
MAX_PACE_SLEEP_S = 0.02


def _default_pace() -> float:
    """:data:`WRITER_PACE` (a writer that runs its statements itself)."""
    return WRITER_PACE


class WriteCancelled(Exception):
    """Raised inside a job when the writer is closing: the job stops between statements."""


class Preempted(Exception):
    """Raised inside a `preemptible` job at a yield when a job that is not background work
    waits (a checkpoint write or completion): the job stops between statements and, if it
    wants to go on, queues its rest itself (garbage collection does)."""


@dataclass
class Job:
    """One unit of store work.

    :param run: the work; runs on the writer thread (or inline).
    :param checkpoint_id: the checkpoint a write job writes (None for other jobs).
    :param pending_bytes: the estimated bytes the job holds until it finished (counted
        against `write.max-pending-bytes`).
    :param fail_fast: True for epoch writes: once a write failed, the later writes fail
        without running (each builds on the rows of the ones before it).
    :param background: runs only when no other job is queued (garbage collection,
        prefetch pages): checkpoint writes and completions go first.
    :param preemptible: a background job that gives way at its next yield
        (:meth:`BackgroundWriter.check_cancelled` raises :class:`Preempted`) when a job that
        is not background work is queued: a checkpoint's write or completion, including
        the completion a stop-with-savepoint's drained close waits for, never waits for a
        whole run of garbage collection.
    :param skip_at_drain: a drained close (:meth:`BackgroundWriter.wait_idle` with
        `foreground_only`) does not wait for it (prefetch pages: each queues the next, and
        a subtask that ends needs none of them; garbage collection: the attempt that
        restores adopts what is left).
    """

    run: Callable[[], object]
    checkpoint_id: int | None = None
    pending_bytes: int = 0
    fail_fast: bool = False
    name: str = "job"
    background: bool = False
    preemptible: bool = False
    skip_at_drain: bool = False


@dataclass
class Outcome:
    """What a finished job left for the task thread."""

    job: Job
    error: BaseException | None = None
    result: object = None


@dataclass
class _State:
    queue: deque[Job] = field(default_factory=deque)
    running: Job | None = None
    pending_bytes: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    #: The first write failure not yet handled by the task thread (poisons later writes).
    failure: BaseException | None = None
    closing: bool = False
    #: Queued jobs that are not background work (read without the lock at a yield).
    foreground_queued: int = 0


class BackgroundWriter:
    """A FIFO of jobs run by one daemon thread (or inline).

    :param name: thread name (shown in thread dumps and py-spy).
    :param max_pending_bytes: bound of the bytes of submitted, unfinished jobs; a submit
        that would exceed it waits (back-pressure), unless nothing else is pending.
    :param on_durable: called on the writer thread with the checkpoint id after a write job
        succeeded (the bridge completes Flink's asynchronous phase).
    :param on_failed: called with the checkpoint id and a message after a write job failed.
    :param inline: run jobs on the submitting thread instead.
    """

    def __init__(self, name: str, max_pending_bytes: int,
                 on_durable: Callable[[int], None] | None = None,
                 on_failed: Callable[[int, str], None] | None = None,
                 inline: bool = False) -> None:
        self.name = name
        self.max_pending_bytes = max_pending_bytes
        self.on_durable = on_durable
        self.on_failed = on_failed
        self.inline = inline
        self._s = _State()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        #: Seconds submitters spent waiting for room (back-pressure), in total.
        self.waited_s = 0.0
        #: The writer thread's CPU time at its last yield (see :data:`WRITER_PACE`).
        self._cpu_mark = 0.0
        #: The pace at each yield: sleep this many times the CPU time used since the
        #: previous one; asked at every yield (:data:`WRITER_PACE`; the protocol's answers
        #: :data:`WRITER_PACE_WITH_PROCESS` while the write process runs the statements).
        self.pace: Callable[[], float] = _default_pace
        #: Set by :meth:`close`: ends a pacing sleep at once (a cancelled task's close
        #: waits for the writer, and Flink deploys the next attempt only after it).
        self._closing = threading.Event()

    # -- task thread ----------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue `job` (inline: run it now; its error is raised).

        Waits while the pending bytes would exceed the bound.

        :raises CheckpointError: the writer is closed.
        """
        if self.inline:
            self._run_inline(job)
            return
        with self._cv:
            if self._s.closing:
                raise CheckpointError(f"The background writer {self.name} is closed.")
            if job.pending_bytes and self._s.pending_bytes:
                start = time.monotonic()
                while (self._s.pending_bytes
                       and self._s.pending_bytes + job.pending_bytes > self.max_pending_bytes
                       and not self._s.closing):
                    self._cv.wait(1.0)
                self.waited_s += time.monotonic() - start
            self._s.queue.append(job)
            self._s.foreground_queued += not job.background
            self._s.pending_bytes += job.pending_bytes
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name,
                                                daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _run_inline(self, job: Job) -> None:
        try:
            result = job.run()
        except BaseException as err:
            self._s.outcomes.append(Outcome(job, err))
            if job.checkpoint_id is not None and self.on_failed is not None:
                self.on_failed(job.checkpoint_id, str(err))
            raise
        self._s.outcomes.append(Outcome(job, None, result))
        if job.fail_fast and job.checkpoint_id is not None and self.on_durable is not None:
            self.on_durable(job.checkpoint_id)

    def take_outcomes(self) -> list[Outcome]:
        """The outcomes of the jobs finished since the last call, in order."""
        with self._cv:
            out, self._s.outcomes = self._s.outcomes, []
            return out

    def failure(self) -> BaseException | None:
        """The write failure that poisons later writes, or None."""
        with self._cv:
            return self._s.failure

    def wait_writes_settled(self) -> None:
        """Wait until no write job is queued or running (after a failure they fail at
        once, so this returns quickly)."""
        with self._cv:
            while any(j.fail_fast for j in self._s.queue) or (
                    self._s.running is not None and self._s.running.fail_fast):
                self._cv.wait(1.0)

    def clear_failure(self) -> None:
        """The task thread took the failed epochs back: later writes run again."""
        with self._cv:
            self._s.failure = None

    def wait_idle(self, timeout_s: float | None = None, foreground_only: bool = False
                  ) -> bool:
        """Wait until every submitted job finished; False on timeout.

        :param foreground_only: do not wait for the jobs marked `skip_at_drain` (they may
            still be queued or running after)."""
        if self.inline:
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s

        def busy() -> bool:
            if not foreground_only:
                return bool(self._s.queue) or self._s.running is not None
            running = self._s.running
            return (running is not None and not running.skip_at_drain) or any(
                not job.skip_at_drain for job in self._s.queue)

        with self._cv:
            while busy():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(1.0 if left is None else min(left, 1.0))
        return True

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Wait until `predicate()` (evaluated under the writer's lock after each job)."""
        if self.inline:
            return predicate()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while not predicate():
                if not self._s.queue and self._s.running is None:
                    return predicate()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(1.0 if left is None else min(left, 1.0))
        return True

    @property
    def alive(self) -> bool:
        """True while the writer thread runs (after close: a statement outlived the wait)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def pending_bytes(self) -> int:
        return self._s.pending_bytes

    @property
    def queued(self) -> int:
        with self._cv:
            return len(self._s.queue) + (self._s.running is not None)

    def writing(self) -> int | None:
        """The checkpoint whose epoch the writer is writing right now, or None."""
        job = self._s.running
        return job.checkpoint_id if job is not None and job.fail_fast else None

    def checkpoint_pending(self, checkpoint_id: int) -> bool:
        """True while a write job of `checkpoint_id` is queued or running."""
        with self._cv:
            jobs = list(self._s.queue) + ([self._s.running] if self._s.running else [])
            return any(j.checkpoint_id == checkpoint_id and j.fail_fast for j in jobs)

    def close(self, interrupt: Callable[[], None] | None = None,
              cancel: bool = False) -> list[Job]:
        """Stop: queued jobs are dropped (returned), a running one stops at its next
        statement boundary (:meth:`check_cancelled`); waits up to
        :data:`CLOSE_WAIT_SECONDS` for it. Idempotent.

        :param interrupt: ends the statement the running job has in flight (the writer's
            :meth:`StateStore.interrupt`), so that a statement the database is slow to
            answer (a read of versions that are not in its buffer pool, a lock wait, a
            write of a large batch) does not hold back Flink's deployment of the next
            attempt, which waits for this close. Called at once when the running job is
            background work (garbage collection, prefetch pages: whoever adopts the
            entries does it again) or with `cancel`; else when the job has not stopped
            after :data:`INTERRUPT_AFTER_SECONDS`. None: wait for the statement. What it
            interrupts is lost the same way as what a close drops: a write without its
            snapshot row is invisible, a transaction in flight is rolled back.
        :param cancel: the subtask is cancelled or failed (Flink's cancel of a task, a
            failure; not a drained end): the running job is interrupted at once, whatever
            it is (its checkpoint fails anyway). Default False.
        :returns: the queued jobs that were dropped, in order."""
        with self._cv:
            self._s.closing = True
            self._closing.set()
            dropped = list(self._s.queue)
            self._s.queue.clear()
            self._s.foreground_queued = 0
            self._cv.notify_all()
            thread = self._thread
            running = self._s.running
        if thread is not None and thread is not threading.current_thread():
            # An idle writer (no running job) leaves its wait at once: give it the time.
            grace = (0.0 if running is not None and (cancel or running.background)
                     else INTERRUPT_AFTER_SECONDS)
            thread.join(grace)
            if thread.is_alive():
                # Named by its job only: formatting the running thread's stack
                # (sys._current_frames, traceback) read frames that thread was popping,
                # and CPython 3.11 crashed with a segmentation fault (CI, 2026-12-06).
                what = running.name if running is not None else "a job"
                if grace:
                    log.info("pyflink-ndb: background writer %s still runs %s %.0f ms after "
                             "close%s", self.name, what, grace * 1000,
                             ": interrupting its statement" if interrupt is not None else "")
                else:  # every cancel with a job running: expected, not news
                    log.debug("pyflink-ndb: background writer %s runs %s at close (%s)%s",
                              self.name, what, "cancel" if cancel else "background work",
                              ": interrupting it at once" if interrupt is not None else "")
                if interrupt is not None:
                    try:
                        interrupt()
                    except Exception:  # the close goes on; the join below bounds it
                        log.debug("interrupt of %s failed", self.name, exc_info=True)
            thread.join(CLOSE_WAIT_SECONDS)
            if thread.is_alive():
                log.warning("pyflink-ndb: background writer %s still runs a statement %.0f s "
                            "after close; it stops at the next one (fenced, invisible)",
                            self.name, CLOSE_WAIT_SECONDS)
        # After the running job reported (durable, or failed when cancelled): in order.
        for job in dropped:
            if job.fail_fast and job.checkpoint_id is not None and self.on_failed is not None:
                try:
                    self.on_failed(job.checkpoint_id, "the subtask closed before it was written")
                except Exception:  # the Java side may already be gone
                    log.debug("on_failed after close", exc_info=True)
        return dropped

    # -- writer thread --------------------------------------------------------------------
    def check_cancelled(self) -> None:
        """Between two statements of a job: raise :class:`WriteCancelled` when closing, and
        let the task thread take the GIL: sleep :attr:`pace` times the CPU time this
        thread used since its previous yield (at most :data:`MAX_PACE_SLEEP_S`; with a
        pace of 0, no sleep and no yield)."""
        if self._s.closing:
            raise WriteCancelled(self.name)
        running = self._s.running
        if running is not None and running.preemptible and self._s.foreground_queued:
            raise Preempted(running.name)
        used = time.thread_time() - self._cpu_mark
        pause = min(used * self.pace(), MAX_PACE_SLEEP_S) if used > 0 else 0.0
        if pause > 0 and self._closing.wait(pause):  # a close ends the pause
            raise WriteCancelled(self.name)
        self._cpu_mark = time.thread_time()

    def check_closing(self) -> None:
        """Raise :class:`WriteCancelled` when closing; nothing else (no pacing, no
        preemption): the cancellation point of a wait for the write process, which a
        preemption would have to stop in the middle of a statement."""
        if self._s.closing:
            raise WriteCancelled(self.name)

    def _loop(self) -> None:
        pin_current_thread()  # state.backend.ndb.python.cpu-pin (nothing when off)
        try:
            self._run_jobs()
        finally:
            forget_current_thread()

    def _run_jobs(self) -> None:
        while True:
            with self._cv:
                if not self._s.queue and not self._s.closing:
                    self._cv.wait(IDLE_EXIT_SECONDS)
                if self._s.closing:
                    return
                if not self._s.queue:
                    self._thread = None  # idle: exit; submit() starts another
                    return
                job = self._s.running = self._next_job()
                poisoned = self._s.failure if job.fail_fast else None
            error: BaseException | None = None
            result: object = None
            if poisoned is not None:
                error = CheckpointError(
                    f"Checkpoint {job.checkpoint_id} was not written: the write of an earlier "
                    f"checkpoint failed ({poisoned}); its entries go into the next one.")
            else:
                cancelled = False
                try:
                    result = job.run()
                except Preempted:
                    log.debug("pyflink-ndb: background %s gave way to a checkpoint job",
                              job.name)
                except WriteCancelled:
                    cancelled = True
                except Exception as err:
                    # After close() interrupted its statement the job fails with the
                    # connection's loss: that is the cancel, not a database outage.
                    cancelled = self._s.closing
                    error = None if cancelled else err
                except BaseException as err:  # reported to the task thread and to Flink
                    error = err
                if cancelled:
                    with self._cv:
                        self._s.running = None
                        self._cv.notify_all()
                    if job.fail_fast and job.checkpoint_id is not None:
                        # Stopped before its snapshot row: it failed (reported once, before
                        # the queued ones that close() reports after joining this thread).
                        self._report(job.checkpoint_id, WriteCancelled(
                            "the subtask closed before it was written"))
                    return
            with self._cv:
                self._s.running = None
                self._s.pending_bytes -= job.pending_bytes
                self._s.outcomes.append(Outcome(job, error, result))
                if error is not None and job.fail_fast and self._s.failure is None:
                    self._s.failure = error
                self._cv.notify_all()
            if job.fail_fast and job.checkpoint_id is not None:
                self._report(job.checkpoint_id, error)
            if error is not None and not job.fail_fast:
                # (A job stopped by close() took the `cancelled` way above: expected.)
                log.warning("pyflink-ndb: background %s failed: %s", job.name, error)

    def _next_job(self) -> Job:
        """Under the lock: the first job that is not a background one, else the first."""
        queue = self._s.queue
        for i, job in enumerate(queue):
            if not job.background:
                del queue[i]
                self._s.foreground_queued -= 1
                return job
        return queue.popleft()

    def _report(self, checkpoint_id: int, error: BaseException | None) -> None:
        try:
            if error is None:
                if self.on_durable is not None:
                    self.on_durable(checkpoint_id)
            elif self.on_failed is not None:
                self.on_failed(checkpoint_id, _describe(error))
        except Exception:
            log.exception("pyflink-ndb: could not report checkpoint %d to the bridge",
                          checkpoint_id)


def _describe(error: BaseException) -> str:
    kind = "fenced" if isinstance(error, FencedError) else type(error).__name__
    return f"{kind}: {error}"
