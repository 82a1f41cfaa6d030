"""The state backend of one subtask: options, tiers, the epoch protocol, the current key.

The Java bridge creates one per subtask through :func:`pyflink_ndb.runtime.bridge.bind`
and calls, on the task thread and in this order (bytewax-style life-cycle contract):

1. `bind` (from `openPythonInterpreter`, before the user's `open()`);
2. any number of records, each preceded by :meth:`set_current_key`;
3. :meth:`snapshot` (from `snapshotState`, Flink's synchronous phase: it freezes the
   dirty set; the background writer makes it durable and tells the Java
   `DurabilityListener`, which ends Flink's asynchronous phase),
   :meth:`notify_checkpoint_complete` or :meth:`notify_checkpoint_aborted` (from the
   checkpoint notifications), in any interleaving Flink produces;
4. :meth:`finish` once on bounded input (after the user's `close()`), then a final
   checkpoint's `snapshot`/`notify_checkpoint_complete` when checkpointing is on;
5. :meth:`close` exactly once; nothing is called after it.

Several subtasks share one interpreter in thread mode, so nothing here lives in module
globals: each backend is reached through its handle.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from pyflink_ndb.checkpoint.key_filter_build import KeyFilterBuild
from pyflink_ndb.checkpoint.prefetch import BackgroundPrefetch
from pyflink_ndb.checkpoint.protocol import CheckpointProtocol, SubtaskScope
from pyflink_ndb.config import NdbStateOptions
from pyflink_ndb.cpu_pin import release_inherited
from pyflink_ndb.errors import ConfigurationError, SerializationError, StateCompatibilityError
from pyflink_ndb.runtime.interpreter import freeze_start_up_heap
from pyflink_ndb.runtime.key_groups import KeyGroupCalculator
from pyflink_ndb.serialization.keys import encode_key
from pyflink_ndb.serialization.values import (
    NO_JSON,
    PLAIN_JSON,
    SERIALIZER_NAME,
    JsonRenderer,
)
from pyflink_ndb.stores.base import StateStore, now_ms
from pyflink_ndb.stores.factory import open_store
from pyflink_ndb.stores.lineage import Token
from pyflink_ndb.tiers.folders import claim_process_folder
from pyflink_ndb.tiers.local import LocalTier
from pyflink_ndb.tiers.table import TieredTable

log = logging.getLogger(__name__)

#: Keys whose key group a subtask remembers (at least; twice `cache.max-entries` when that
#: is more): a key met again after its memo was emptied costs one call into Java.
KEY_GROUP_MEMO_ENTRIES = 100_000
#: Outputs of one record that come back from one call into the interpreter (the bridge's
#: `RecordCall`); Java iterates a record's further outputs one by one.
OUTPUTS_PER_CALL = 1024
#: Read-ahead bundles whose sizes a subtask keeps (diagnostics, tests).
FIRST_BUNDLES_KEPT = 16


class KeyGroupOracle(Protocol):
    """Answers the key group of the operator's current key, as Flink routes it. The
    bridge's oracle also names the Java class of the current key (`currentKeyClass()`),
    which lets the backend compute key groups of String, Integer and Long keys itself
    (:mod:`pyflink_ndb.runtime.key_groups`); an oracle without it is asked for every new
    key."""

    def currentKeyGroup(self) -> int: ...  # noqa: N802 (Java method name)


class DurabilityListener(Protocol):
    """The bridge's Java object that ends Flink's asynchronous phase of a checkpoint
    (`io.pyflinkndb.bridge.DurabilityListener`); called from the writer thread."""

    def durable(self, checkpoint_id: int) -> None: ...

    def failed(self, checkpoint_id: int, message: str) -> None: ...


@dataclass(frozen=True)
class BindInfo:
    """What the bridge tells a subtask when it binds (see java-bridge/README.md)."""

    operator: str
    subtask_index: int = 0
    parallelism: int = 1
    max_parallelism: int = 128
    attempt: int = 0
    key_group_start: int = 0
    key_group_end: int = 127
    restored_checkpoint_id: int | None = None
    #: Flink's task name (the chained operators' names), for messages.
    task_name: str | None = None
    #: Tokens of the restored snapshot (JSON texts from Flink's union list state, every
    #: subtask's); empty when the restored snapshot holds none for this operator.
    restored_tokens: tuple[str, ...] = ()
    #: The epoch offset of a checkpoint taken by row format 1 (legacy), else None.
    restored_epoch_offset: int | None = None
    #: Keyed states of Flink's own state backend that the restored snapshot holds for this
    #: operator, as (name, kind) with kind Flink's `VALUE`, `LIST`, `MAP`, … (timers left
    #: out): written by the operator running with the switch off. Empty on a fresh start;
    #: None when the bridge could not tell.
    restored_flink_keyed_states: tuple[tuple[str, str], ...] | None = ()
    checkpointing_enabled: bool = True
    local_dir: str | None = None
    job_id: str = "local"
    #: Flink's claim mode of a restore at job submission (`execution.state-recovery.
    #: claim-mode`): "NO_CLAIM" (Flink's default), "CLAIM" or "LEGACY".
    restore_claim_mode: str = "NO_CLAIM"
    #: The snapshot a job is submitted to restore (`execution.state-recovery.path`,
    #: formerly `execution.savepoint.path`); None: none. A failover keeps it.
    restore_path: str | None = None
    #: Flink's `execution.checkpointing.externalized-checkpoint-retention`:
    #: "NO_EXTERNALIZED_CHECKPOINTS" (Flink 1.20's default: the job's checkpoints are
    #: deleted when it ends), "RETAIN_ON_CANCELLATION" or "DELETE_ON_CANCELLATION" (kept
    #: when it fails; the store cannot tell a failed job from a cancelled one).
    externalized_retention: str = "NO_EXTERNALIZED_CHECKPOINTS"

    @property
    def restores_at_submission(self) -> bool:
        """Whether this attempt restores the retained checkpoint the job was submitted with
        (`execution.state-recovery.path` ending in `chk-N` for the restored checkpoint N),
        not one the job took itself: tells a new run from a failover where both have the
        same job id (a fixed job id). A failover before the job's first checkpoint restores
        that snapshot again and reads the same (harmless: it keeps the snapshot)."""
        if self.restore_path is None or self.restored_checkpoint_id is None:
            return False
        parts = [p for p in self.restore_path.rstrip("/").split("/") if p != "_metadata"]
        return bool(parts) and parts[-1] == f"chk-{self.restored_checkpoint_id}"


def drain_outputs(results: Iterator[Any] | None) -> Any:
    """A record's outputs for the bridge's `RecordCall`: None when there are none, a list
    (a Java `ArrayList`) of all of them when there are fewer than
    :data:`OUTPUTS_PER_CALL`, else a tuple (a Java `Object[]`) of the first
    :data:`OUTPUTS_PER_CALL` and the generator of the rest, which Java iterates as
    PyFlink does (so a record with many outputs never holds them all at once)."""
    if results is None:
        return None
    out = list(itertools.islice(results, OUTPUTS_PER_CALL))
    if len(out) < OUTPUTS_PER_CALL:
        return out or None
    return (out, results)


def key_group_conflict(key: Any, known: int, flink: int) -> SerializationError:
    """The error for a key equal to one met before on this subtask (the same encoded
    bytes: pyflink-ndb's key, README "State semantics") whose record Flink put in key
    group `flink`, not `known`: two keys to Flink, one to the tiers, whose state would be
    kept under one key group while Flink routes the other record elsewhere after a rescale.

    It happens with keys that PyFlink pickles (a `key_by` without `key_type`): Flink
    compares and routes them by their pickled bytes (`PickledBytesTypeInfo`), and `pickle`
    writes an object that a key holds twice as a reference to its first occurrence, so
    `(s, s)` and `(s, t)` with `t == s` a distinct object pickle differently (found by a
    breaker). Checked where the bridge hands over each record's key group: records in
    bundles (`bundle.records`) and read-ahead bundles; elsewhere the first record of a
    key decides its key group (README "Limits")."""
    shown = repr(key)
    if len(shown) > 200:
        shown = shown[:200] + "…"
    return SerializationError(
        f"The key {shown} equals a key met before in key group {known}, but Flink put this "
        f"record in key group {flink}: to Flink they are two keys (a key_by without "
        "key_type compares keys by their pickled bytes, and pickle writes an object the key "
        "holds twice as a reference, so (s, s) and (s, copy of s) differ), to pyflink-ndb "
        "one (keys are equal by type and value). Give key_by a key_type (e.g. key_type="
        "Types.TUPLE([Types.STRING(), Types.STRING()])), which makes Flink compare keys by "
        "value, or build every key the same way (no object twice in it). Nothing was "
        "written for this record.")


class RecordInBundle:
    """The record of a bundle being processed (:meth:`SubtaskStateBackend.process_bundle`)."""

    __slots__ = ("index", "key_group", "timestamp", "selected")

    def __init__(self) -> None:
        self.index = -1
        self.key_group = -1
        self.timestamp: int = 0
        #: The index Java's key context was last set to (-1: none in this call).
        self.selected = -1


class SubtaskStateBackend:
    """Tiered keyed state of one subtask (one operator instance).

    :param options: resolved options.
    :param info: the subtask's identity and restore point.
    :param key_groups: the Java oracle for key groups of new keys.
    :param store: an opened store to use instead of opening one from `options.url` (tests).
    :param clock_ms: processing-time clock for TTL (ms since the Unix epoch).
    :param listener: told when each checkpoint's epoch is durable or failed (the Java
        bridge); None: nobody waits.
    :raises StoreUnavailableError: the store cannot be reached.
    :raises NamespaceInUseError: see `on-fresh-start`.
    :raises StateCompatibilityError: see `restore.backend-change`
        (:func:`check_flink_keyed_state`).
    """

    def __init__(self, options: NdbStateOptions, info: BindInfo, key_groups: KeyGroupOracle,
                 store: StateStore | None = None,
                 clock_ms: Callable[[], int] = now_ms,
                 listener: DurabilityListener | None = None) -> None:
        self.options = options
        self.info = info
        self.clock_ms = clock_ms
        self._key_groups = key_groups
        self._closed = False
        restore_tokens = check_flink_keyed_state(options, info)
        self.store = store if store is not None else open_store(options)
        self._local: LocalTier | None = None
        self.tier_folder: str | None = None
        self.write_store: StateStore | None = None
        try:
            local = None
            if options.local_enabled:
                base = options.local_dir or info.local_dir or os.path.join(
                    os.environ.get("TMPDIR", "/tmp"))
                claim = claim_process_folder(base)
                self.tier_folder = claim.path
                path = os.path.join(self.tier_folder, info.job_id,
                                    f"{_safe(info.operator)}-{info.subtask_index}-{info.attempt}-"
                                    f"{uuid.uuid4().hex[:8]}")
                try:
                    local = LocalTier(path, claim)
                except BaseException:
                    claim.release()
                    raise
                self._local = local
            self.table = TieredTable(self.store, options.cache_max_entries, local,
                                     options.value_max_bytes)
            #: The background writer's own connection (None: writes run on the task thread).
            self.write_store = self.store.fork() if options.write_async else None
            on_durable = on_failed = None
            if listener is not None:
                def on_durable(checkpoint_id: int) -> None:
                    listener.durable(checkpoint_id)

                def on_failed(checkpoint_id: int, message: str) -> None:
                    listener.failed(checkpoint_id, message)
            self.protocol = CheckpointProtocol(
                self.store, self.table, options,
                SubtaskScope(info.operator, info.subtask_index, info.key_group_start,
                             info.key_group_end, info.job_id, info.attempt,
                             info.restore_claim_mode == "CLAIM",
                             info.restores_at_submission,
                             info.externalized_retention != "NO_EXTERNALIZED_CHECKPOINTS"),
                clock_ms,
                write_store=self.write_store, on_durable=on_durable, on_failed=on_failed)
            #: How each state's values are rendered for the JSON column, by state id.
            self._json_renderers: dict[int, JsonRenderer] = {}
            self.protocol.set_json_renderers(self._json_renderers)
            #: Key groups of recently seen keys (encoded key -> key group): each miss is a
            #: call into Java. A plain dict, emptied when full (cheaper per record and per
            #: entry than an LRU): about 100 bytes an entry.
            self._kg_memo: dict[bytes, int] = {}
            self._kg_memo_max = max(options.cache_max_entries * 2, KEY_GROUP_MEMO_ENTRIES)
            #: Key groups of new keys without Java (made at the first new key: it needs
            #: the Java class of a current key).
            self._kg_calculator: KeyGroupCalculator | None = None
            #: The table's point reads of the store when :meth:`read_ahead` last ran
            #: (None: it never ran).
            self._store_reads_at_read_ahead: int | None = None
            #: The records of the first :data:`FIRST_BUNDLES_KEPT` read-ahead bundles, in
            #: order (the bridge starts with 1 and doubles up to `read-ahead.records`).
            self.read_ahead_bundle_sizes: list[int] = []
            self.current_key: Any = None
            self.current_key_bytes: bytes | None = None
            self.current_key_group = -1
            #: True once records set the current key themselves (see :meth:`attach_operation`).
            self.keys_from_records = False
            #: Reads the key of a record as the bridge hands it (read-ahead), or None.
            self._record_key: Callable[[Any], Any] | None = None
            #: Set by a window operation's wrapper: timers carry their key in their context.
            self.timer_keys_from_context = False
            #: Cleared by a keyed broadcast function's wrapper: the second (broadcast)
            #: input's records carry no key.
            self.second_input_keyed = True
            #: Flink metrics (pyflink_ndb.runtime.metrics), set when the user function opens.
            self.metrics: Any = None
            #: Set by a keyed process function's wrapper that gives each record of a bundle
            #: its own context (`TieredKeyedProcessFunction`, through
            #: `pyflink_ndb._pyflink.answer_from_bundle`): only then does
            #: :meth:`read_ahead_settings` offer bundles (`bundle.records`).
            self.bundle_contexts = False
            #: The record of the bundle being processed: its key group and timestamp, its
            #: index, and the index Java's key context was last set to (:meth:`process_bundle`).
            self.bundle: RecordInBundle | None = None
            #: The bridge's `BundleCursor` (Java), set by :meth:`enable_bundles`.
            self._bundle_cursor: Any = None
            #: Whether the operations chained after this one answer for bundles too
            #: (`answer_chained_timestamps`, in :meth:`attach_operation`).
            self._chain_answers = False
            self.protocol.open(restored_tokens(self.store, info) if restore_tokens else None)
            #: The background prefetch (`restore.mode: background`), or None.
            self.prefetch: BackgroundPrefetch | None = None
            if options.restore_mode == "eager" or (
                    options.restore_mode == "background"
                    and (self.table.local is None or self.write_store is None)):
                # Background prefetch needs tier 2 and the background writer; else eager.
                loaded = self.protocol.prefetch(self.store.state_ids(info.operator))
                log.info("pyflink-ndb %s/%d prefetched %d entries", info.operator,
                         info.subtask_index, loaded)
            elif options.restore_mode == "background" and self.protocol.restored is not None:
                self.prefetch = BackgroundPrefetch(self.protocol,
                                                   self.store.state_ids(info.operator))
                self.prefetch.start()
            #: The key filter's build (`restore.key-filter`, lazy restores), or None.
            self.key_filter_build: KeyFilterBuild | None = None
            if (options.restore_mode == "lazy" and options.restore_key_filter
                    and self.table.local is not None and self.write_store is not None
                    and self.protocol.restored is not None):
                self.key_filter_build = KeyFilterBuild(
                    self.protocol, {row["state_id"]: row["state_kind"]
                                    for row in self.store.catalog(info.operator)})
                self.key_filter_build.arm()
        except BaseException:
            # A refused restore or an unreachable store: release what was opened.
            self._release(close_store=store is None)
            raise

    def _release(self, close_store: bool) -> None:
        with contextlib.suppress(Exception):
            if getattr(self, "protocol", None) is not None:
                self.protocol.close()
        with contextlib.suppress(Exception):
            table = getattr(self, "table", None)
            if table is not None:
                table.close()
            elif self._local is not None:
                self._local.destroy()
        with contextlib.suppress(Exception):
            if self.write_store is not None:
                self.write_store.close()
        if close_store:
            with contextlib.suppress(Exception):
                self.store.close()

    # -- states ---------------------------------------------------------------------------
    def register_state(self, name: str, kind: str, ttl_ms: int | None, *,
                       prefix_keyed: bool = False,
                       json_of: JsonRenderer = PLAIN_JSON) -> int:
        """Declare a state of this operator; returns its state id. `json_of` renders its
        stored values for the JSON column (:data:`NO_JSON` instead with
        `write.value-json: false`).

        :raises StateCompatibilityError: incompatible with the stored declaration.
        """
        state_id = self.store.register_state(self.info.operator, name, kind, SERIALIZER_NAME,
                                             ttl_ms)
        self.table.state_names[state_id] = name
        if prefix_keyed:
            self.table.prefix_states.add(state_id)
        if ttl_ms is not None:
            self.protocol.add_ttl_state(state_id)
        self._json_renderers[state_id] = json_of if self.options.write_value_json else NO_JSON
        return state_id

    # -- current key ----------------------------------------------------------------------
    def set_current_key(self, key: Any) -> None:
        """Make `key` the current Flink key; its key group is computed (or asked of Java)
        once per key and remembered (:data:`KEY_GROUP_MEMO_ENTRIES` keys at least).

        :raises SerializationError: in a bundle, a key equal to one met before (the same
            encoded bytes) whose record Flink put in another key group (see
            :func:`key_group_conflict`)."""
        if key is self.current_key and self.current_key_bytes is not None:
            return
        key_bytes = encode_key(key)
        self.current_key = key
        if key_bytes == self.current_key_bytes:
            key_group = self.current_key_group
        else:
            self.current_key_bytes = key_bytes
            known = self._kg_memo.get(key_bytes)
            if known is None:
                key_group = self._key_group_of_new_key(key)
                self._remember_key_group(key_bytes, key_group)
            else:
                key_group = known
            self.current_key_group = key_group
        bundle = self.bundle
        if bundle is not None and bundle.key_group != key_group:
            raise key_group_conflict(key, key_group, bundle.key_group)

    def _key_group_of_new_key(self, key: Any) -> int:
        """Computed in Python where the Java key class allows (:mod:`key_groups
        <pyflink_ndb.runtime.key_groups>`; its first answers checked against Java's), else
        asked of Java (a PEMJA call). In a bundle, the key group Java computed for the
        record (Java's current key is not the record's there)."""
        if self.bundle is not None:
            return self.bundle.key_group
        calculator = self._kg_calculator
        if calculator is None:
            calculator = self._kg_calculator = self._make_calculator()
        mine = calculator.key_group(key)
        if mine is not None and not calculator.unchecked:
            return mine
        java = int(self._key_groups.currentKeyGroup())
        if mine is not None:
            calculator.check(key, mine, java)
        return java

    def _make_calculator(self) -> KeyGroupCalculator:
        """The calculator for the Java class of the current key; an oracle that cannot
        name it (the test oracles of :mod:`pyflink_ndb.testing`) gets a disabled one."""
        name = getattr(self._key_groups, "currentKeyClass", None)
        java_class = str(name()) if name is not None else ""
        return KeyGroupCalculator(java_class, self.info.max_parallelism)

    def _remember_key_group(self, key_bytes: bytes, key_group: int) -> None:
        if len(self._kg_memo) >= self._kg_memo_max:
            self._kg_memo.clear()
        self._kg_memo[key_bytes] = key_group

    def read_ahead_settings(self) -> list[int]:
        """`[read-ahead records, its longest wait in ms, bundle records, their longest wait
        in ms]` for the Java bridge (`read-ahead.records`, `read-ahead.max-wait-ms`,
        `bundle.records`, `bundle.max-wait-ms`). Records 0: off, also when the records'
        keys cannot be read in Python (see :meth:`attach_operation`); bundles also need
        a wrapper that gives each record of a bundle its context
        (:attr:`bundle_contexts`) and chained operations whose contexts answer too
        (:func:`~pyflink_ndb._pyflink.answer_chained_timestamps`). Called once, after
        :meth:`attach_operation`."""
        keyed = self._record_key is not None
        records = self.options.read_ahead_records if keyed else 0
        bundle = (self.options.bundle_records
                  if keyed and self.bundle_contexts and self._chain_answers else 0)
        return [records, self.options.read_ahead_max_wait_ms, bundle,
                self.options.bundle_max_wait_ms]

    def enable_bundles(self, cursor: Any) -> None:
        """Called by the bridge when it processes records in bundles: `cursor.select(i)`
        makes record `i` of the bundle being processed Java's current record (its key
        context and timestamp), which timers need (:meth:`select_bundle_record`). Logs
        once per subtask attempt that its records come in bundles."""
        self._bundle_cursor = cursor
        log.info("pyflink-ndb %s/%d: records in bundles of up to %d, each held back at most "
                 "%d ms (state.backend.ndb.bundle.records, bundle.max-wait-ms)",
                 self.info.operator, self.info.subtask_index, self.options.bundle_records,
                 self.options.bundle_max_wait_ms)

    def process_bundle(self, records: Any, key_groups: Any, timestamps: Any, start: int,
                       read_ahead: bool) -> tuple[int, list[Any] | None, Any]:
        """Process `records[start:]` in arrival order in this one call from the bridge
        (`bundle.records`): what :meth:`process_element` does for each, with the record's
        key group, timestamp and (for timers) Java key context at hand
        (:attr:`bundle`).

        :param records: the records as the bridge hands them to the operation's
            `process_element`.
        :param key_groups: each record's key group, as Flink assigns it.
        :param timestamps: each record's timestamp as Flink's context gives it (ms;
            `Long.MIN_VALUE` for a record without one, as PyFlink's `ctx.timestamp()`).
        :param start: the first record still to process (a call after a record with more
            than :data:`OUTPUTS_PER_CALL` outputs goes on from the next one).
        :param read_ahead: read the bundle's keys ahead first (:meth:`read_ahead`).
        :returns: `(gain, outputs, rest)`: `gain` what :meth:`read_ahead` returned (0
            when not asked); `outputs` None when no record had outputs, else one entry per
            processed record from `start` (None, or the list of its outputs); `rest` None
            when every record was processed, else the generator of the further outputs of
            the last processed record, which had more than :data:`OUTPUTS_PER_CALL` (its
            first ones are its entry; the bridge iterates the rest, then calls again).
        """
        gain = self.read_ahead(records, key_groups) if read_ahead else 0
        process = self._operation.process_element
        outputs: list[Any] | None = None
        record = self.bundle = RecordInBundle()
        try:
            for i in range(start, len(records)):
                record.index = i
                record.key_group = int(key_groups[i])
                record.timestamp = timestamps[i]
                out = drain_outputs(process(records[i]))
                if out is None:
                    if outputs is not None:
                        outputs.append(None)
                    continue
                if outputs is None:
                    outputs = [None] * (i - start)
                if isinstance(out, tuple):
                    outputs.append(out[0])
                    return gain, outputs, self._rest_in_bundle(record, out[1])
                outputs.append(out)
            return gain, outputs, None
        finally:
            self.bundle = None

    def _rest_in_bundle(self, record: RecordInBundle, rest: Iterator[Any]) -> Iterator[Any]:
        """The further outputs of the bundle's `record` (it had more than
        :data:`OUTPUTS_PER_CALL`), which the bridge iterates after :meth:`process_bundle`
        returned: each is produced with `record` the bundle's current record again, so that
        what the function does after its first outputs (delete or register its key's
        processing-time timer, read its timestamp) goes through the bundle as before them.
        Without it a record that deleted its key's firing timeout after 1,100 outputs left it
        firing (found by a breaker). The bundle is current only inside each step: between
        steps Java runs its own code, and after the last the bridge's next call sets its
        own."""
        try:
            while True:
                self.bundle = record
                try:
                    item = next(rest)
                except StopIteration:
                    return
                finally:
                    self.bundle = None
                yield item
        finally:
            close = getattr(rest, "close", None)
            if close is not None:  # the function's own `finally` runs in the bundle too
                self.bundle = record
                try:
                    close()
                finally:
                    self.bundle = None

    def bundle_processing_timer(self, timestamp: int, delete: bool) -> bool:
        """Before the record of the bundle being processed deletes (`delete`) or registers
        its key's processing-time timer at `timestamp`: True when that timer is the one
        whose firing runs this bundle (Flink took it out of its queue already), which the
        bridge then cancels or restores itself; the caller leaves Flink's timer service
        alone. False outside a bundle or for any other timer (the record is made Java's
        current record either way)."""
        record = self.bundle
        if record is None:
            return False
        record.selected = record.index
        return bool(self._bundle_cursor.processingTimer(record.index, int(timestamp),
                                                        bool(delete)))

    def select_bundle_record(self) -> None:
        """Make the record of the bundle being processed Java's current record (key
        context, timestamp), once per record: before a timer is registered or deleted,
        which Flink's timer service does for Java's current key."""
        record = self.bundle
        if record is None or record.selected == record.index:
            return
        self._bundle_cursor.select(record.index)
        record.selected = record.index

    def read_ahead(self, records: Any, key_groups: Any) -> int:
        """Called by the Java bridge with a bundle of records before it processes them
        (`state.backend.ndb.read-ahead.records`): remembers each record's key group (no
        call into Java for it later) and reads the bundle's point entries that only the
        store knows in one query (:meth:`TieredTable.read_ahead
        <pyflink_ndb.tiers.table.TieredTable.read_ahead>`).

        :param records: the records as the bridge hands them to the operation's
            `process_element` (before its input converter; see
            :func:`pyflink_ndb._pyflink.record_key_reader`).
        :param key_groups: each record's key group, as Flink assigns it.
        :returns: the store reads the bundle saves or needed: the entries read ahead plus
            the point reads of the store since the previous bundle (1 for the first
            bundle, which cannot know). 0 tells the bridge that reading ahead gains
            nothing now (it then passes records straight through for a while).
        """
        record_key = self._record_key
        if record_key is None:
            return 0
        if len(self.read_ahead_bundle_sizes) < FIRST_BUNDLES_KEPT:
            self.read_ahead_bundle_sizes.append(len(key_groups))
        keys: list[tuple[bytes, int]] = []
        for record, key_group in zip(records, key_groups, strict=True):
            key = record_key(record)
            key_bytes = encode_key(key)
            key_group = int(key_group)
            known = self._kg_memo.get(key_bytes)
            if known is None:
                self._remember_key_group(key_bytes, key_group)
            elif known != key_group:
                raise key_group_conflict(key, known, key_group)
            keys.append((key_bytes, key_group))
        table = self.table
        before = self._store_reads_at_read_ahead
        # The first bundle cannot know yet whether its records miss: it reports at least
        # 1 (keep reading ahead), so its own misses teach the next one.
        missed = 1 if before is None else table.store_reads - before
        read = table.read_ahead(keys)
        self._store_reads_at_read_ahead = table.store_reads
        return read + missed

    def require_key(self) -> tuple[bytes, int]:
        if self.current_key_bytes is None:
            raise RuntimeError("No current key: keyed state is only accessible while "
                               "processing a record or timer of a keyed stream.")
        return self.current_key_bytes, self.current_key_group

    # -- hooks called by the Java bridge --------------------------------------------------
    def attach_operation(self, operation: Any) -> None:
        """Read each record's key from the record (no call into Java per record; not the
        broadcast input's, see :attr:`second_input_keyed`), and with
        :attr:`timer_keys_from_context` (a window operation) each timer's key from the
        timer context.

        :raises ConfigurationError: a window operation whose records or timers cannot be
            hooked (an apache-flink version whose operations have another shape).
        """
        from pyflink_ndb._pyflink import (
            answer_chained_timestamps,
            hook_record_keys,
            hook_timer_keys,
            record_key_reader,
        )

        self._operation = operation
        self.keys_from_records = hook_record_keys(
            operation, self.set_current_key, second_input_keyed=self.second_input_keyed)
        self._record_key = record_key_reader(operation) if self.keys_from_records else None
        self._chain_answers = answer_chained_timestamps(operation, self)
        if self.timer_keys_from_context and not (
                self.keys_from_records and hook_timer_keys(operation, self.set_current_key)):
            raise ConfigurationError(
                "pyflink-ndb could not hook the records and timers of PyFlink's window "
                "operation (this apache-flink version is not supported: see README, "
                "\"Install from a wheel\": Flink 1.20). Turn state.backend.ndb.enabled "
                "off for this job.")

    def process_element(self, value: Any) -> Any:
        """One record of a one-input operation, its outputs returned from this call: the
        bridge's operators (`RecordCall`) call this instead of PyFlink's
        `operation.process_element` and the PEMJA iterator over its outputs, whose
        `hasNext`/`next`/`close` each enter the interpreter again (each takes the GIL,
        which a TaskManager's subtasks share). Operators with side outputs keep PyFlink's
        path (side outputs leave while the outputs are iterated, interleaved with them).

        :returns: see :func:`drain_outputs`.
        """
        return drain_outputs(self._operation.process_element(value))

    def process_element1(self, value: Any) -> Any:
        """:meth:`process_element` for the first input of a two-input operation."""
        return drain_outputs(self._operation.process_element1(value))

    def process_element2(self, value: Any) -> Any:
        """:meth:`process_element` for the second input of a two-input operation."""
        return drain_outputs(self._operation.process_element2(value))

    def snapshot(self, checkpoint_id: int, is_savepoint: bool = False,
                 ends_job: bool = False) -> str:
        """Flink's synchronous phase: freeze the dirty delta as checkpoint `checkpoint_id`
        (written in the background; the listener hears when it is durable; with
        `write.async: false` it is durable on return).

        :param is_savepoint: Flink's `SnapshotType.isSavepoint`.
        :param ends_job: a stop-with-savepoint's synchronous savepoint
            (`SavepointType.isSynchronous`): once it completed, a normal close records
            the stop (:meth:`CheckpointProtocol.snapshot`).
        :returns: the token (JSON text) the bridge stores in Flink's union list state.
        """
        return self.protocol.snapshot(int(checkpoint_id), bool(is_savepoint),
                                      ends_job=bool(ends_job)).to_json()

    def process_tier_folder(self) -> str | None:
        """The folder of this process's tier-2 folders under this subtask's base (None
        without tier 2): the bridge deletes it when the JVM exits."""
        return self.tier_folder

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.protocol.complete(int(checkpoint_id))
        release_inherited()  # python.cpu-pin: threads Java started from a pinned thread
        if self.options.python_gc_freeze:
            freeze_start_up_heap()  # once per interpreter: after the job's start-up
        if self.metrics is not None:
            self.metrics.push()

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.protocol.abort(int(checkpoint_id))
        if self.metrics is not None:
            self.metrics.push()

    def finish(self) -> None:
        """End of bounded input: without checkpointing, write and commit a final epoch
        (with checkpointing, Flink's final checkpoint does it)."""
        if not self.info.checkpointing_enabled:
            self.protocol.final_flush()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until the background writer finished every job (tests, tools)."""
        return self.protocol.drain(timeout_s)

    def close(self, drain: bool = False) -> None:
        """Stop the background writer, then release the tiers and the connections.
        Idempotent.

        :param drain: True on a normal end of the task (bounded input, stop-with-savepoint:
            the bridge passes it): first let the writer finish its queue (the final
            checkpoint's completion moves what readers see), for at most the retry
            deadline plus 10 s. False (cancel, failure): stop at once; what it had not
            written stays invisible.
        """
        if self._closed:
            return
        self._closed = True
        started = time.perf_counter()
        writer_ms = tiers_ms = 0.0
        try:
            self.protocol.close(drain)
            writer_ms = (time.perf_counter() - started) * 1000
            if self.protocol.writer.alive:
                # A statement outlived the wait: the writer may still read a RocksDB
                # snapshot of tier 2, so tier 2 stays (its folder is left behind).
                log.warning("pyflink-ndb %s/%d: tier 2 left open for the background writer",
                            self.info.operator, self.info.subtask_index)
            else:
                # A failed or cancelled attempt leaves tier 2 to the next attempt here
                # (`local.recovery`); otherwise its RocksDB flushes and its folder is
                # deleted in a thread of its own: Flink deploys the next attempt only once
                # this one is closed.
                if not drain:
                    self.protocol.park_tier()
                self.table.close(wait=False)
                tiers_ms = (time.perf_counter() - started) * 1000 - writer_ms
        finally:
            self.store.close()
            if self.write_store is not None:
                self.write_store.close()
            log.info("pyflink-ndb %s/%d: closed (%s) in %.0f ms: background writer %.0f ms, "
                     "tiers %.0f ms", self.info.operator, self.info.subtask_index,
                     "drained" if drain else "not drained",
                     (time.perf_counter() - started) * 1000, writer_ms, tiers_ms)


def check_flink_keyed_state(options: NdbStateOptions, info: BindInfo) -> bool:
    """Refuse a restore whose snapshot holds this operator's keyed state in Flink's own
    backend (`restore.backend-change: fail`, the default).

    A switched operator keeps its keyed state in pyflink-ndb; only its timers are Flink's.
    Flink keeps restored state that no operator registers without a word (it only refuses
    state of operators missing from the job: `execution.state-recovery.ignore-unclaimed-
    state`), and carries it in the operator's later snapshots. The bridge lists those
    states at `initializeState` (`StateBackendHooks.flinkKeyedStates`, from the state meta
    information of the restored keyed backend). Three cases:

    * the snapshot's tokens are the operator's own, taken in this very snapshot (each
      token's epoch is the restored checkpoint id): its keyed state is pyflink-ndb's, and
      Flink's states are a copy carried since a restore that ignored them: restored as
      usual, said in the log;
    * no tokens: the snapshot was taken with the switch off: refused, or with `ignore` the
      operator starts without that state;
    * older tokens: taken with the switch off, by a run that carried an earlier switched
      run's tokens, whose pyflink-ndb state is older than Flink's: refused, or with
      `ignore` the operator starts without either (the stale tokens are not restored).

    :returns: whether the restored tokens may be restored (False: start without them).
    :raises StateCompatibilityError: a refusal; the message names the states, the task
        and both ways on.
    """
    states = info.restored_flink_keyed_states
    if info.restored_checkpoint_id is None or not states:
        if states is None and info.restored_checkpoint_id is not None:
            log.warning("pyflink-ndb %s/%d: the bridge could not list the keyed states of "
                        "Flink's backend in restored snapshot %d; state written with the "
                        "switch off would not be noticed", info.operator,
                        info.subtask_index, info.restored_checkpoint_id)
        return True
    named = ", ".join(f"{name!r} ({kind.lower()})" for name, kind in states)
    epochs = {Token.from_json(t).epoch for t in info.restored_tokens}
    where = (f"Operator {info.operator!r} ({info.task_name or 'task'}, subtask "
             f"{info.subtask_index}) restores checkpoint or savepoint "
             f"{info.restored_checkpoint_id}, whose snapshot holds keyed state of Flink's own "
             f"state backend for it: {named}")
    if epochs == {info.restored_checkpoint_id}:
        log.info("pyflink-ndb %s/%d: snapshot %d is this operator's own; it also carries "
                 "keyed state of Flink's backend (%s) that a restore ignored earlier "
                 "(restore.backend-change: ignore), which stays ignored",
                 info.operator, info.subtask_index, info.restored_checkpoint_id, named)
        return True
    older = "" if not epochs else (
        f" It also carries the pyflink-ndb snapshot of checkpoint {max(epochs)}, which an "
        "earlier run with the switch on took: older than that state, and not restored.")
    if options.restore_backend_change == "ignore":
        log.warning("%s.%s It is ignored, as restore.backend-change says: this operator's "
                    "pyflink-ndb state starts without it.", where, older)
        return False
    raise StateCompatibilityError(
        f"{where}. It was written with the switch off (state.backend.ndb.enabled: false, or "
        f"a job without pyflink-ndb).{older} With the switch on this operator keeps its "
        "keyed state in pyflink-ndb, so that state would be lost without an error. To keep "
        "it, restore this snapshot with the switch off. To start this operator's state in "
        "pyflink-ndb without it, set state.backend.ndb.restore.backend-change: ignore "
        "(README, \"Limits\").")


def restored_tokens(store: StateStore, info: BindInfo) -> list[Token] | None:
    """The tokens of the snapshot this subtask restores, or None for a fresh start.

    A restored snapshot without tokens was taken before the operator had tiered state (a
    fresh start for it), or by row format 1 (it carries the legacy epoch offset instead):
    that one is restored from the root branch that `pyflink-ndb migrate` created.

    :raises CheckpointError: a format-1 checkpoint on a namespace that was not migrated.
    """
    if info.restored_checkpoint_id is None:
        return None
    if info.restored_tokens:
        return [Token.from_json(t) for t in info.restored_tokens]
    if info.restored_epoch_offset is None:
        return None
    from pyflink_ndb.stores.migrate import legacy_tokens

    return legacy_tokens(store, info.operator,
                         info.restored_epoch_offset + info.restored_checkpoint_id)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:80]
