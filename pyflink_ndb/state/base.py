"""What every tiered state shares: registration, the current key and namespace, TTL.

Namespaces follow Flink's `InternalKvState`: a state's entries are keyed by (current key,
current namespace); the namespace is None (Flink's `VoidNamespace`) unless a window
operator sets a window with `set_current_namespace` (window contents, trigger state and
`ProcessWindowFunction.window_state()`, as Flink's own backends key window state).

TTL follows `StateTtlConfig` with processing time: a write sets `expiry = now + ttl`;
with `UpdateType.OnReadAndWrite` a read that finds a live value prolongs it. An expired
value is never returned from any tier (both visibilities behave as `NeverReturnExpired`,
which Flink's `ReturnExpiredIfNotCleanedUp` permits) and expired rows are deleted from
the store when a checkpoint completes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyflink_ndb._pyflink import stable_state_name, ttl_config_of
from pyflink_ndb.serialization.keys import encode_namespace
from pyflink_ndb.serialization.values import PLAIN_JSON, JsonRenderer
from pyflink_ndb.tiers.table import Entry

if TYPE_CHECKING:
    from pyflink_ndb.runtime.backend import SubtaskStateBackend


class TtlPolicy:
    """TTL of one state (from its descriptor), or none."""

    def __init__(self, descriptor: Any) -> None:
        config = ttl_config_of(descriptor)
        self.ttl_ms: int | None = None
        self.refresh_on_read = False
        if config is not None and config.is_enabled():
            from pyflink.datastream.state import StateTtlConfig

            self.ttl_ms = int(config.get_ttl().to_milliseconds())
            self.refresh_on_read = (config.get_update_type()
                                    == StateTtlConfig.UpdateType.OnReadAndWrite)


class TieredState:
    """Base of the tiered states: one registered state of one subtask.

    It is also PyFlink's `InternalKvState` (the interface its window operator uses):
    :meth:`set_current_namespace`.
    """

    kind = "state"
    prefix_keyed = False

    def __init__(self, backend: SubtaskStateBackend, descriptor: Any) -> None:
        self._backend = backend
        self._table = backend.table
        self._clock = backend.clock_ms
        self.name = stable_state_name(descriptor.get_name())
        self._ttl = TtlPolicy(descriptor)
        #: The policy's fields, read on every state call (one attribute lookup, not two).
        self._ttl_ms = self._ttl.ttl_ms
        self._refresh_on_read = self._ttl.refresh_on_read
        self._state_id = backend.register_state(
            self.name, self.kind, self._ttl.ttl_ms, prefix_keyed=self.prefix_keyed,
            json_of=self._json_of())
        self._namespace = b""

    def set_current_namespace(self, namespace: Any) -> None:
        """Make `namespace` (a window, or None for none) current for this state's reads and
        writes, as Flink's `InternalKvState.setCurrentNamespace`.

        :raises SerializationError: a namespace type without a stable encoding
            (:func:`~pyflink_ndb.serialization.keys.encode_namespace`).
        """
        self._namespace = encode_namespace(namespace)

    def _key(self) -> tuple[bytes, int]:
        """(ukey prefix of the current key and namespace, key group).

        :raises RuntimeError: no current key (outside a record or timer).
        """
        backend = self._backend
        key_bytes = backend.current_key_bytes
        if key_bytes is None:
            key_bytes, _ = backend.require_key()  # raises: no current key
        return key_bytes + self._namespace, backend.current_key_group

    def _json_of(self) -> JsonRenderer:
        """How this state's stored values are rendered for the JSON column."""
        return PLAIN_JSON

    def _expiry(self) -> int | None:
        ttl_ms = self._ttl_ms
        return None if ttl_ms is None else self._clock() + ttl_ms

    def _live(self, entry: Entry) -> bool:
        return entry.value is not None and (
            entry.expires_at_ms is None or entry.expires_at_ms > self._clock())

    def _read(self, ukey: bytes, key_group: int) -> bytes | None:
        """The live value bytes of an entry of the current key (TTL applied), or None."""
        value, _, expires_at_ms, _ = self._table.get(self._state_id, ukey, key_group)
        if value is None or (expires_at_ms is not None and expires_at_ms <= self._clock()):
            return None
        if self._refresh_on_read:
            self._table.put(self._state_id, ukey, key_group, value, self._expiry())
        return value

    def _write(self, ukey: bytes, key_group: int, value: bytes | None) -> None:
        ttl_ms = self._ttl_ms
        self._table.put(self._state_id, ukey, key_group, value,
                        None if value is None or ttl_ms is None else self._clock() + ttl_ms)
