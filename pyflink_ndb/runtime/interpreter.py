"""The TaskManager's Python interpreter as the backend leaves it:
`state.backend.ndb.python.gc-freeze` (and `python.cpu-pin`: :mod:`pyflink_ndb.cpu_pin`).

In PyFlink's thread mode every Python operator of a TaskManager runs in one interpreter
embedded in the JVM (PEMJA; java-bridge/README.md). CPython's cyclic garbage collector
stops every thread of it while it runs a full collection, and a full collection walks every
tracked object: PyFlink's, Apache Beam's and the job's modules, classes and functions
(about 145,000 objects in the checkpoint job of `make bench`) on top of the state's own. On
that job full collections ran every 4–5 s and took 81–128 ms each: a stall of the task
threads and of the background writer each time.

:func:`freeze_start_up_heap` moves the objects alive when a subtask first hears that a
checkpoint completed (the job has started: PyFlink's operators and the user functions are
open) into the collector's permanent generation (:func:`gc.freeze`, Python 3.7+; it
splices a list, whatever the heap's size): later full collections skip them. Reference
counting still frees them when they are no longer used; only a reference cycle among them
that becomes garbage is never collected — the start-up heap is modules, classes, functions
and the operators that live as long as the job. It runs once per interpreter, not at every
attempt: a failover's later attempt would also freeze the cancelled attempt's not yet
collected cycles. A job without checkpoints never freezes.

Measured on that job (MariaDB, `write.render-process`, one run each, 2026-12-04): without
the freeze, full collections of 81–128 ms every 4–5 s; with it, 143,000 objects frozen at
the first completed checkpoint and full collections of 7–36 ms after it.
"""

from __future__ import annotations

import gc
import logging
import threading

log = logging.getLogger(__name__)

_lock = threading.Lock()
_frozen = False


def freeze_start_up_heap() -> int | None:
    """Once per interpreter: :func:`gc.freeze` the objects alive now.

    :returns: the number of objects in the permanent generation after the freeze, or None
        when an earlier call froze already (nothing done).
    """
    global _frozen
    with _lock:
        if _frozen:
            return None
        _frozen = True
        gc.freeze()
    count = gc.get_freeze_count()
    log.info("pyflink-ndb: %d objects of the interpreter's start-up heap left out of future "
             "garbage collections (gc.freeze; state.backend.ndb.python.gc-freeze)", count)
    return count
