"""Bounded retries of idempotent database work: exponential backoff with full jitter.

A unit of work is one whole transaction (or one autocommit statement). When its connection
dies the server rolls the transaction back, so the unit is re-run from its start on a fresh
connection; that is only correct when the unit is idempotent (REPLACE, INSERT IGNORE,
DELETE by key, reads). Which errors are transient is the driver's business
(:func:`pyflink_ndb.stores.mysql.is_transient_error`); this module knows no driver.

Backoff: "full jitter" (AWS Architecture Blog, "Exponential Backoff And Jitter"): the sleep
before retry `n` (0-based) is uniform in `[0, min(max_backoff, initial * 2**n))`, which
spreads the retries of many subtasks that lost the same server.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from pyflink_ndb.errors import ConfigurationError, StoreUnavailableError

T = TypeVar("T")

_log = logging.getLogger(__name__)

#: Longest excerpt of a driver message put in a retry log line.
_LOG_MESSAGE_CHARS = 200


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long one unit of work is tried.

    :param max_attempts: total tries of one unit of work (the first one included), >= 1;
        1 means no retry. Default 10.
    :param initial_backoff_ms: cap of the first sleep (ms), >= 0. Default 50.
    :param max_backoff_ms: largest cap of any sleep (ms), >= 0. Default 5000.
    :param deadline_ms: give up when the next sleep would end more than this many ms after
        the first try started, >= 0. A try that is running is never cut short by the
        deadline (socket timeouts bound it). Default 90000.
    :raises ConfigurationError: a value is out of range.
    """

    max_attempts: int = 10
    initial_backoff_ms: int = 50
    max_backoff_ms: int = 5_000
    deadline_ms: int = 90_000

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError(
                f"RetryPolicy.max_attempts must be at least 1 (got {self.max_attempts}).")
        for name in ("initial_backoff_ms", "max_backoff_ms", "deadline_ms"):
            if getattr(self, name) < 0:
                raise ConfigurationError(
                    f"RetryPolicy.{name} must be at least 0 (got {getattr(self, name)}).")


#: `RetryPolicy()`, shared (it is frozen): a default argument value.
DEFAULT_RETRY_POLICY = RetryPolicy()


def backoff_delays_ms(policy: RetryPolicy,
                      rng: Callable[[], float] = random.random) -> Iterator[float]:
    """The sleeps (ms) between the tries of one unit of work, full jitter.

    Yields `policy.max_attempts - 1` values (one before each retry); value `n` (0-based)
    is `rng() * min(policy.max_backoff_ms, policy.initial_backoff_ms * 2**n)`, so it lies
    in `[0, cap)` for an `rng` in `[0, 1)` like :func:`random.random`. The deadline is
    time-based and is applied by :func:`run_with_retries`, not here.

    :param policy: the caps and the number of tries.
    :param rng: a source of floats in [0, 1); inject a constant to make delays exact.
    """
    cap = float(min(policy.initial_backoff_ms, policy.max_backoff_ms))
    for _ in range(policy.max_attempts - 1):
        yield rng() * cap
        cap = min(cap * 2, float(policy.max_backoff_ms))


class RetriesExhaustedError(StoreUnavailableError):
    """The attempts or the deadline of a :class:`RetryPolicy` are spent.

    A :class:`StoreUnavailableError`, raised `from` the last transient error. Never itself
    transient: an outer retry loop does not multiply the attempts of an inner one.

    :ivar what: the unit of work that failed (e.g. "write of epoch 7").
    :ivar where: the server, `host:port`.
    :ivar attempts: tries made (each a `recover()` plus the work, the first without
        `recover()`).
    :ivar elapsed_s: seconds from the start of the first try to giving up.
    :ivar last_error: the last transient error (also `__cause__`).
    """

    def __init__(self, what: str, where: str, attempts: int, elapsed_s: float,
                 last_error: BaseException) -> None:
        super().__init__(f"{what} failed at {where} after {attempts} attempts in "
                         f"{elapsed_s:.1f} s: {describe_error(last_error)}")
        self.what = what
        self.where = where
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.last_error = last_error


class RetryCounter:
    """Counts retries; pass an instance as `on_retry=` of :func:`run_with_retries`.

    One per store (per subtask): never shared between threads.

    :ivar retries: retries so far (sleeps taken after a transient error).
    :ivar last_error_number: the error number of the last retried error, or None.
    """

    def __init__(self) -> None:
        self.retries = 0
        self.last_error_number: int | None = None

    def __call__(self, attempt: int, err: BaseException, delay_ms: float) -> None:
        self.retries += 1
        self.last_error_number = error_number(err)


def error_number(err: BaseException) -> int | None:
    """The first integer `args[0]` along `err` and its causes (a driver's error number,
    or an errno), or None; for log lines and metrics."""
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return None
        if seen.args and isinstance(seen.args[0], int) and not isinstance(seen.args[0], bool):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


def describe_error(err: BaseException) -> str:
    """`ClassName: message` of an error, for messages (driver messages carry no password)."""
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def run_with_retries(work: Callable[[], T], *, is_transient: Callable[[BaseException], bool],
                     recover: Callable[[], None], policy: RetryPolicy, what: str,
                     where: str, sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic,
                     on_retry: Callable[[int, BaseException, float], None] | None = None
                     ) -> T:
    """Run one idempotent unit of work, retrying it after transient errors.

    Sequence: `work()`; on an exception `e` with `is_transient(e)`: check the budget, call
    `on_retry(attempt, e, delay_ms)`, log one WARNING, `sleep(delay_ms / 1000)`, then
    `recover()` (reconnect: a fresh connection with the session settings re-applied) and
    `work()` again. A `recover()` plus a `work()` is one attempt; a transient error raised
    by `recover()` fails that attempt like one from `work()` (the next attempt calls
    `recover()` again). Only :class:`Exception` is caught: KeyboardInterrupt and
    SystemExit propagate.

    :param work: the unit of work (a whole transaction, re-run from its start); must be
        idempotent. Its return value is returned.
    :param is_transient: True for errors worth a retry (lost connection, lock wait
        timeout, deadlock, NDB temporary error).
    :param recover: called before each retry; must leave the state so that `work()` can
        start over (close the broken connection, open a new one).
    :param policy: attempts, backoff caps and deadline.
    :param what: the unit of work, for messages ("write of epoch 7").
    :param where: the server, `host:port`, for messages (never a URL with a password).
    :param sleep: sleeps seconds (injectable for tests). Default :func:`time.sleep`.
    :param clock: monotonic seconds (injectable for tests). Default :func:`time.monotonic`.
    :param on_retry: called before each sleep with the 1-based number of the attempt that
        failed, its error and the coming sleep in ms (metrics, e.g. :class:`RetryCounter`).
    :returns: what `work()` returned.
    :raises RetriesExhaustedError: (a :class:`StoreUnavailableError`) the attempts are
        spent, or the next sleep would end after `policy.deadline_ms`; raised from the last
        transient error; the message names `what`, `where`, the attempts, the seconds and
        the last error.
    :raises Exception: any non-transient error of `work()` or `recover()`, unchanged, at
        once.
    """
    start = clock()
    deadline_s = policy.deadline_ms / 1000.0
    delays = backoff_delays_ms(policy)
    attempt = 0
    while True:
        attempt += 1
        try:
            if attempt > 1:
                recover()
            return work()
        except Exception as err:
            if not is_transient(err):
                raise
            last = err
        elapsed_s = clock() - start
        delay_ms = next(delays, None)
        if delay_ms is None or elapsed_s + delay_ms / 1000.0 > deadline_s:
            raise RetriesExhaustedError(what, where, attempt, elapsed_s, last) from last
        if on_retry is not None:
            on_retry(attempt, last, delay_ms)
        number = error_number(last)
        message = str(last)[:_LOG_MESSAGE_CHARS]
        _log.warning("%s failed at %s (attempt %d of %d, %s, %s%s); retrying in %.0f ms "
                     "on a new connection", what, where, attempt, policy.max_attempts,
                     "no error number" if number is None else f"error {number}",
                     type(last).__name__, f": {message}" if message else "", delay_ms)
        sleep(delay_ms / 1000.0)
