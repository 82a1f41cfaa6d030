"""Entry points called by the Java bridge operators (see java-bridge/README.md).

`bind` builds the subtask's backend and leaves it in a per-thread slot; the user function
wrapper, opened right after on the same task thread, claims it. Java keeps its own
reference (`ndb_backend` in the operator's interpreter globals) for the checkpoint hooks.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from pyflink_ndb.config import FLINK_RETAINED_KEYS, PREFIX, flink_retained, from_flink_keys
from pyflink_ndb.cpu_pin import (
    cpu_of_setting,
    pin_python_threads,
    pinned_cpu,
    release_inherited,
)
from pyflink_ndb.errors import ConfigurationError
from pyflink_ndb.runtime.backend import (
    BindInfo,
    DurabilityListener,
    KeyGroupOracle,
    SubtaskStateBackend,
)

log = logging.getLogger(__name__)
_slot = threading.local()


#: Keys of the job's options JSON written by pyflink_ndb.api.stream (not Flink options).
OPERATOR_KEY = "pyflink-ndb.operator"
DEFAULT_URL_KEY = "pyflink-ndb.default-url"


def parse_bind_info(info_json: str) -> tuple[dict[str, Any], BindInfo]:
    """Split the bridge's JSON into (merged option keys, BindInfo)."""
    info = json.loads(info_json)
    options = info.get("options") or {}
    if isinstance(options, str):
        options = json.loads(options) if options else {}
    cluster = {**(info.get("cluster_options") or {}), **(info.get("job_options") or {})}
    local_dirs = info.get("local_dirs") or []
    job_options = dict(options)
    operator = job_options.pop(OPERATOR_KEY, None) or info.get("operator_id")
    default_url = job_options.pop(DEFAULT_URL_KEY, None)
    bind = BindInfo(
        operator=str(operator),
        subtask_index=int(info.get("subtask_index", 0)),
        parallelism=int(info.get("parallelism", 1)),
        max_parallelism=int(info.get("max_parallelism", 128)),
        attempt=int(info.get("attempt", 0)),
        key_group_start=int(info.get("key_group_start", 0)),
        key_group_end=int(info.get("key_group_end", 127)),
        restored_checkpoint_id=_opt_int(info.get("restored_checkpoint_id")),
        task_name=info.get("task_name"),
        restored_tokens=tuple(str(t) for t in info.get("restored_tokens") or ()),
        restored_epoch_offset=_opt_int(info.get("restored_epoch_offset")),
        restored_flink_keyed_states=_flink_states(info.get("restored_flink_keyed_states", [])),
        checkpointing_enabled=bool(info.get("checkpointing_enabled", True)),
        local_dir=local_dirs[0] if local_dirs else None,
        job_id=str(info.get("job_id", "local")),
        restore_claim_mode=str(info.get("restore_claim_mode", "NO_CLAIM")),
        restore_path=info.get("restore_path"),
        externalized_retention=str(info.get("externalized_retention",
                                            "NO_EXTERNALIZED_CHECKPOINTS")),
    )
    merged = {**cluster, **job_options}
    # Flink's JobManager keeps as many retained checkpoints as its own configuration says
    # (a job's -Dexecution.checkpointing.num-retained is not read there); the TaskManager's
    # configuration stands for it, and the job's may differ: the default of
    # `checkpoints.retained` is the largest, so that no checkpoint Flink keeps is subsumed
    # (a breaker's find on a cluster: a job-level 1 under a cluster-level 3 lost chk-13).
    retained = [flink_retained(source) for source in (
        info.get("cluster_options") or {}, info.get("job_options") or {}, job_options)]
    for key in FLINK_RETAINED_KEYS:
        merged.pop(key, None)
    given = [r for r in retained if r is not None]
    if given:
        numbers = [int(r) for r in given if str(r).strip().isdigit()]
        # A value that is no number goes on as given: from_flink_keys refuses it by name.
        merged[FLINK_RETAINED_KEYS[0]] = max(numbers) if len(numbers) == len(given) else next(
            r for r in given if not str(r).strip().isdigit())
    if default_url and PREFIX + "url" not in merged:
        merged[PREFIX + "url"] = default_url
    return merged, bind


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _flink_states(value: Any) -> tuple[tuple[str, str], ...] | None:
    """The bridge's `restored_flink_keyed_states` (`[{"name", "kind"}]` or null)."""
    if value is None:
        return None
    return tuple((str(s.get("name")), str(s.get("kind", "UNKNOWN"))) for s in value)


def bind(info_json: str, key_groups: KeyGroupOracle,
         listener: DurabilityListener | None = None) -> SubtaskStateBackend:
    """Create the backend of the subtask whose bridge calls this (Java `openPythonInterpreter`).

    :param info_json: the bridge's bind info (java-bridge/README.md).
    :param key_groups: the Java key-group probe.
    :param listener: the Java `DurabilityListener` whose `durable(id)` / `failed(id, msg)`
        complete Flink's asynchronous phase of each checkpoint (called from the background
        writer's thread); None: nobody waits (tests).

    :raises ConfigurationError, StoreUnavailableError, NamespaceInUseError: the job cannot
        start; the message says what to fix.
    """
    keys, info = parse_bind_info(info_json)
    options = from_flink_keys(keys)
    cpu = cpu_of_setting(options.python_cpu_pin)
    if cpu is not None:  # this task thread now, the writers and other operators later
        if not pin_python_threads(cpu):
            log.warning("pyflink-ndb: python.cpu-pin=%s, but an earlier job pinned this "
                        "TaskManager's Python threads to CPU %s, which stays (one "
                        "interpreter, one CPU): restart the TaskManager to change it",
                        options.python_cpu_pin, pinned_cpu())
    elif pinned_cpu() is not None:
        log.warning("pyflink-ndb: python.cpu-pin is off, but an earlier job pinned this "
                    "TaskManager's Python threads to CPU %s, which stays for the "
                    "interpreter's life: restart the TaskManager to unpin", pinned_cpu())
    backend = SubtaskStateBackend(options, info, key_groups, listener=listener)
    release_inherited()  # RocksDB's threads, if the local tier's open started them here
    log.info("pyflink-ndb bound %s subtask %d/%d (attempt %d, key groups %d-%d) on %s",
             info.operator, info.subtask_index, info.parallelism, info.attempt,
             info.key_group_start, info.key_group_end, backend.store.describe())
    _slot.backend = backend
    return backend


def claim_bound_backend() -> SubtaskStateBackend:
    """The backend bound on this thread for the operator being opened.

    :raises ConfigurationError: no bridge operator bound one: the function runs on a plain
        PyFlink operator (use `pyflink_ndb.process`, and keep the bridge jar on the
        classpath).
    """
    backend = getattr(_slot, "backend", None)
    if backend is None:
        raise ConfigurationError(
            "pyflink-ndb tiered state was opened outside the pyflink-ndb bridge operator. "
            "Apply the function with pyflink_ndb.process(...) / pyflink_ndb.co_process(...) "
            "and run in thread mode (python.execution-mode: thread).")
    _slot.backend = None
    return backend
