"""`MapState` on tiered storage: one entry per (Flink key, map key).

The entry's ukey is `encoded Flink key + encoded map key`, so the entries of one map are
contiguous in every tier. Iteration merges tier 1, tier 2 and pages of tier 3
(:data:`pyflink_ndb.tiers.table.SCAN_PAGE_ROWS` = 1000 rows a page) in map-key byte
order: memory stays bounded by one page plus the map's entries in tier 1, whatever the
map's size. TTL applies per map entry (as in Flink).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pyflink.fn_execution.internal_state import InternalMapState

from pyflink_ndb.serialization.keys import NAMESPACE_TAG, decode_key, encode_map_key
from pyflink_ndb.serialization.values import decode_value, encode_value
from pyflink_ndb.state.base import TieredState


class TieredMapState(TieredState, InternalMapState):
    """A `MapState`.

    * `get(k)` is None both for an absent key and for a key whose value is None;
      `contains(k)` tells them apart. `m[k]` behaves as `get(k)` (PyFlink's contract).
    * Map keys follow the key identity rule (README, "Keys"): `1`, `1.0` and `True` are
      different keys; an unhashable key raises `TypeError` and changes nothing.
    * `keys()`, `values()`, `items()` and iteration yield each entry once, in the byte order
      of the encoded map keys; entries removed during the iteration and not yet reached are
      not yielded.
    """

    kind = "map"
    prefix_keyed = True

    def _ukey(self, map_key: Any) -> tuple[bytes, int]:
        user = encode_map_key(map_key)
        key_bytes, key_group = self._key()
        return key_bytes + user, key_group

    def get(self, key: Any) -> Any:
        ukey, key_group = self._ukey(key)
        data = self._read(ukey, key_group)
        return None if data is None else decode_value(data)

    def put(self, key: Any, value: Any) -> None:
        ukey, key_group = self._ukey(key)
        self._write(ukey, key_group, encode_value(value))

    def put_all(self, dict_value: dict[Any, Any]) -> None:
        encoded = [(self._ukey(k), encode_value(v)) for k, v in dict_value.items()]
        for (ukey, key_group), data in encoded:
            self._write(ukey, key_group, data)

    def remove(self, key: Any) -> None:
        ukey, key_group = self._ukey(key)
        self._write(ukey, key_group, None)

    def contains(self, key: Any) -> bool:
        ukey, key_group = self._ukey(key)
        return self._read(ukey, key_group) is not None

    def _entries(self) -> Iterator[tuple[bytes, bytes]]:
        key_bytes, key_group = self._key()
        prefix_len = len(key_bytes)
        # Without a namespace the prefix also matches the same key's namespaced entries.
        skip_namespaced = not self._namespace
        for ukey, entry in self._table.scan_prefix(self._state_id, key_group, key_bytes):
            if skip_namespaced and ukey[prefix_len:prefix_len + 1] == NAMESPACE_TAG:
                continue
            if self._live(entry):
                assert entry.value is not None
                yield ukey[prefix_len:], entry.value

    def items(self) -> Iterable[tuple[Any, Any]]:
        for user, data in self._entries():
            yield decode_key(user), decode_value(data)

    def keys(self) -> Iterable[Any]:
        for user, _ in self._entries():
            yield decode_key(user)

    def values(self) -> Iterable[Any]:
        for _, data in self._entries():
            yield decode_value(data)

    def is_empty(self) -> bool:
        return next(self._entries(), None) is None

    def clear(self) -> None:
        key_bytes, key_group = self._key()
        for user, _ in self._entries():
            self._write(key_bytes + user, key_group, None)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.put(key, value)

    def __delitem__(self, key: Any) -> None:
        self.remove(key)
