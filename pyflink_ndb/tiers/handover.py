"""Task-local recovery of tier 2: a failed or cancelled subtask attempt parks its RocksDB
tier, and the next attempt of the same subtask in the same TaskManager takes it over
instead of starting from an empty tier 2 (`local.recovery`).

Flink's own backends do the same with `state.backend.local-recovery`: a restore reads a
local copy of the snapshot instead of the checkpoint storage. Here the local copy is the
failed attempt's tier 2, made exact for the restored checkpoint by
:meth:`TieredTable.adopt <pyflink_ndb.tiers.table.TieredTable.adopt>` (the entries that
changed after it are deleted; reads of those go to the store, as after any restore).

In thread mode every subtask of a TaskManager runs in one interpreter, so the two
attempts meet here: a registry per interpreter, keyed by the random identity (nonce) of
the branch that parked the tier, which the restored snapshot's token carries. A parked
tier that no attempt takes within :data:`PARKED_TTL_S` (the job was cancelled, or Flink
deployed the next attempt on another TaskManager) is destroyed, and so are the oldest when
more than :data:`PARKED_MAX` wait, and every one when the interpreter ends (`atexit`, which
the JVM's embedded interpreter does not run: there the bridge registers a JVM exit hook for
the process's tier folder, `TierFolders.java`; a breaker's run of a local job that failed
for good still found the folders left, cause not established).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from dataclasses import dataclass

from pyflink_ndb.tiers.local import LocalTier

log = logging.getLogger(__name__)

EntryId = tuple[int, bytes]

#: Seconds a parked tier waits for the next attempt (Flink deploys it after the failed
#: attempt closed and its restart delay: `restart-strategy.*.delay`, 1 s by default).
PARKED_TTL_S = 60.0
#: Parked tiers kept per interpreter at most (the oldest are destroyed first).
PARKED_MAX = 64


@dataclass
class ParkedTier:
    """Tier 2 of an attempt that ended without a normal close, with what the next
    attempt needs to make it exact for the checkpoint it restores.

    :param local: the RocksDB tier, open. Holds, for each entry, nothing or the latest
        content that left tier 1 (entries that tier 1 held newer are in `after_last`).
    :param operator: the operator (checked again at take-over).
    :param kg_start: first key group of the subtask.
    :param kg_end: last key group of the subtask.
    :param changed: per checkpoint id, the entries frozen in that epoch, for every epoch
        after `floor`.
    :param after_last: the entries changed after the last freeze, and those tier 1 held
        with other content than tier 2: never read from this tier.
    :param floor: the newest checkpoint the attempt heard was completed (epochs up to it
        are no longer tracked): a restore of an older one cannot take this tier over.
    """

    local: LocalTier
    operator: str
    kg_start: int
    kg_end: int
    changed: dict[int, set[EntryId]]
    after_last: set[EntryId]
    floor: int
    parked_at: float = 0.0


_lock = threading.Lock()
_parked: dict[str, ParkedTier] = {}
_timer: threading.Timer | None = None
_timer_due = 0.0


def park(nonce: str, tier: ParkedTier) -> None:
    """Leave `tier` for the attempt that restores a snapshot of branch `nonce`."""
    tier.parked_at = time.monotonic()
    with _lock:
        _parked[nonce] = tier
        while len(_parked) > PARKED_MAX:
            oldest = min(_parked, key=lambda n: _parked[n].parked_at)
            _destroy(_parked.pop(oldest), "too many parked")
    _schedule_expiry()


def take(nonce: str | None) -> ParkedTier | None:
    """The tier parked by branch `nonce` (removed from the registry), or None."""
    if nonce is None:
        return None
    with _lock:
        return _parked.pop(nonce, None)


def parked_count() -> int:
    """Tiers waiting (tests, metrics)."""
    with _lock:
        return len(_parked)


def discard_all(under: str | None = None) -> None:
    """Destroy the parked tiers (those in folder `under` only, when given), and wait for
    it: tests call it before they delete their folders (a RocksDB whose folder is gone
    cannot flush at its close)."""
    with _lock:
        gone = [n for n, t in _parked.items()
                if under is None or str(t.local.path).startswith(under)]
        tiers = [_parked.pop(n) for n in gone]
    for tier in tiers:
        _destroy(tier, "discarded", wait=True)


@atexit.register
def _at_exit() -> None:
    """The interpreter ends (a TaskManager or local MiniCluster that stops cancels its
    tasks, which park their tiers): no next attempt will come, so the folders go now."""
    discard_all()


def _expire() -> None:
    global _timer
    now = time.monotonic()
    with _lock:
        _timer = None
        gone = [n for n, t in _parked.items() if now - t.parked_at >= PARKED_TTL_S]
        tiers = [_parked.pop(n) for n in gone]
    for tier in tiers:
        _destroy(tier, f"not taken over within {PARKED_TTL_S:.0f} s")
    _schedule_expiry()


def _schedule_expiry() -> None:
    """Arm one timer for the earliest expiry (again when it moved earlier)."""
    global _timer, _timer_due
    with _lock:
        if not _parked:
            return
        due = min(t.parked_at for t in _parked.values()) + PARKED_TTL_S
        if _timer is not None:
            if _timer_due <= due:
                return
            _timer.cancel()
        _timer_due = due
        _timer = threading.Timer(max(0.0, due - time.monotonic()) + 0.1, _expire)
        _timer.daemon = True
        _timer.start()


def _destroy(tier: ParkedTier, why: str, wait: bool = False) -> None:
    log.info("pyflink-ndb %s (key groups %d-%d): parked tier 2 at %s destroyed (%s)",
             tier.operator, tier.kg_start, tier.kg_end, tier.local.path, why)
    tier.local.destroy(wait=wait)
