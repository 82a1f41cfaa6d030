"""`ListState` on tiered storage, in segments so that a checkpoint writes only what changed.

Layout per Flink key: a head entry (ukey = encoded key) holding `(segments, token)`, and
segment entries (ukey = encoded key + encoded segment number) holding lists of elements.
`add`/`add_all` append to the newest segment while it was written in the current epoch or
is smaller than :data:`SMALL_SEGMENT_BYTES`, else open a new one: appending to a long list
writes one small segment per checkpoint, not the whole list, while a short list stays one
entry (a head and one segment: fewer entries to cache, evict and write than one segment per
checkpoint). After :data:`MAX_SEGMENTS` segments the list is compacted into one. The
head is rewritten only when its segment count or, with TTL, its expiry changes (an append
to the newest segment leaves its epoch token as it was: :meth:`TieredListState._update_head`).
With TTL each element carries its own expiry (as in Flink); expired elements are dropped
and a list whose elements all expired is cleared, leaving no empty head behind.
"""

from __future__ import annotations

from typing import Any

from pyflink.fn_execution.internal_state import InternalListState

from pyflink_ndb.serialization.keys import encode_key
from pyflink_ndb.serialization.values import (
    JsonRenderer,
    decode_value,
    encode_value,
    json_renderer,
)
from pyflink_ndb.state.base import TieredState

#: Segments after which a list is rewritten as one segment.
MAX_SEGMENTS = 32
#: Serialized size (bytes) below which the newest segment takes appends even when an
#: earlier epoch wrote it: rewriting a segment this small costs less than the entry a new
#: one adds to every tier (measured on the user-profile job of ``make bench``, part 7).
SMALL_SEGMENT_BYTES = 2048
#: The encoded segment numbers (a list never holds more than MAX_SEGMENTS + 1 segments).
_SEGMENT_SUFFIXES = tuple(encode_key(i) for i in range(MAX_SEGMENTS + 1))
#: Decoded heads `(segments, epoch token)` by their stored bytes: the lists written in one
#: epoch share a handful of head values, and a lookup costs a fifth of an unpickling (every
#: add and get reads the head). Emptied when it holds :data:`HEAD_MEMO_ENTRIES`.
_HEADS: dict[bytes, tuple[int, int]] = {}
HEAD_MEMO_ENTRIES = 4096


class TieredListState(TieredState, InternalListState):
    """A `ListState`.

    * `get()` returns a list: `[]` when the state is empty or cleared (never None);
      `update([])` and `update(None)` leave it empty.
    * `add(None)`, or `None` inside `add_all`/`update`, raises `ValueError` and changes
      nothing, as Flink's `ListState` rejects null elements.
    """

    kind = "list"
    prefix_keyed = True

    def _json_of(self) -> JsonRenderer:
        return json_renderer(self.kind, ttl=self._ttl.ttl_ms is not None)

    # -- layout ---------------------------------------------------------------------------
    def _head(self, key_bytes: bytes, key_group: int) -> tuple[int, int]:
        data = self._table.get(self._state_id, key_bytes, key_group).value
        if data is None:
            return 0, 0
        head = _HEADS.get(data)
        if head is None:
            if len(_HEADS) >= HEAD_MEMO_ENTRIES:
                _HEADS.clear()
            segments, token = head = _HEADS[data] = decode_value(data)
            return segments, token
        return head

    def _write_head(self, key_bytes: bytes, key_group: int, segments: int,
                    expires: int | None) -> None:
        self._table.put(self._state_id, key_bytes, key_group,
                        encode_value((segments, self._table.epoch_token)), expires)

    def _segment_key(self, key_bytes: bytes, index: int) -> bytes:
        suffix = _SEGMENT_SUFFIXES[index] if index <= MAX_SEGMENTS else encode_key(index)
        return key_bytes + suffix

    def _read_segment(self, key_bytes: bytes, key_group: int, index: int) -> list[Any]:
        entry = self._table.get(self._state_id, self._segment_key(key_bytes, index),
                                key_group)
        return [] if entry.value is None else decode_value(entry.value)

    def _segment_expiry(self, items: list[Any]) -> int | None:
        return max((e for _, e in items), default=None) if self._ttl.ttl_ms else None

    def _write_segment(self, key_bytes: bytes, key_group: int, index: int,
                       items: list[Any]) -> None:
        self._table.put(self._state_id, self._segment_key(key_bytes, index), key_group,
                        encode_value(items), self._segment_expiry(items))

    def _wrap(self, values: list[Any]) -> list[Any]:
        if self._ttl.ttl_ms is None:
            return list(values)
        expires = self._expiry()
        return [(v, expires) for v in values]

    def _check(self, values: list[Any]) -> None:
        for v in values:  # not `None in values`: that calls __eq__ of every element
            if v is None:
                raise ValueError("None cannot be added to a ListState (as in Flink); "
                                 "nothing was changed.")

    def _stored_items(self, key_bytes: bytes, key_group: int, segments: int) -> list[Any]:
        """Every element, in order; segments that no tier holds come in one store query."""
        if segments == 1:
            return self._read_segment(key_bytes, key_group, 0)
        entries = self._table.get_many(
            self._state_id, [self._segment_key(key_bytes, i) for i in range(segments)],
            key_group)
        items: list[Any] = []
        for entry in entries:
            if entry.value is not None:
                items.extend(decode_value(entry.value))
        return items

    def _rewrite(self, key_bytes: bytes, key_group: int, old_segments: int,
                 items: list[Any]) -> None:
        """Make the list exactly `items` (wrapped) in one segment; empty clears it. A head
        that already counts one segment stays (without TTL nothing in it changes).

        The new segment is serialized first, so a value that cannot be serialized raises
        before anything changes."""
        data = encode_value(items) if items else None
        if data is not None:
            self._table.check_entry(self._state_id, self._segment_key(key_bytes, 0), data)
        for index in range(1 if items else 0, old_segments):
            self._table.put(self._state_id, self._segment_key(key_bytes, index), key_group,
                            None)
        if data is None:
            self._table.put(self._state_id, key_bytes, key_group, None)
            return
        self._table.put(self._state_id, self._segment_key(key_bytes, 0), key_group, data,
                        self._segment_expiry(items))
        if old_segments != 1 or self._ttl.ttl_ms is not None:
            self._write_head(key_bytes, key_group, 1, self._head_expiry(items))

    def _head_expiry(self, items: list[Any]) -> int | None:
        return max(e for _, e in items) if self._ttl.ttl_ms and items else None

    # -- API ------------------------------------------------------------------------------
    def get(self) -> list[Any]:
        key_bytes, key_group = self._key()
        segments, _ = self._head(key_bytes, key_group)
        if segments == 0:
            return []
        items = self._stored_items(key_bytes, key_group, segments)
        if self._ttl.ttl_ms is None:
            return items
        now = self._clock()
        live = [(v, e) for v, e in items if e > now]
        if len(live) != len(items) or (live and self._ttl.refresh_on_read):
            if self._ttl.refresh_on_read:
                live = self._wrap([v for v, _ in live])
            self._rewrite(key_bytes, key_group, segments, live)
        return [v for v, _ in live]

    def add(self, value: Any) -> None:
        if value is None:
            self._check([value])  # raises
        self._append([value])

    def add_all(self, values: list[Any]) -> None:
        values = list(values)
        self._check(values)
        if values:
            self._append(values)

    def _append(self, values: list[Any]) -> None:
        """:meth:`add_all` of `values` (checked, not empty, a list of the caller's own)."""
        key_bytes, key_group = self._key()
        segments, token = self._head(key_bytes, key_group)
        items = values if self._ttl_ms is None else self._wrap(values)
        table = self._table
        if segments:
            newest_key = self._segment_key(key_bytes, segments - 1)
            newest = table.get(self._state_id, newest_key, key_group).value
            if token == table.epoch_token or len(newest or b"") < SMALL_SEGMENT_BYTES:
                last = [] if newest is None else decode_value(newest)
                last += items
                if self._ttl_ms:
                    table.put(self._state_id, newest_key, key_group, encode_value(last),
                              self._segment_expiry(last))
                    self._update_head(key_bytes, key_group, segments, segments, items)
                else:  # no TTL: no expiry, and the head stays (see _update_head)
                    table.put(self._state_id, newest_key, key_group, encode_value(last))
                return
        if segments + 1 > MAX_SEGMENTS:
            stored = self._stored_items(key_bytes, key_group, segments)
            self._rewrite(key_bytes, key_group, segments, stored + items)
            return
        self._write_segment(key_bytes, key_group, segments, items)
        self._update_head(key_bytes, key_group, segments, segments + 1, items)

    def _update_head(self, key_bytes: bytes, key_group: int, old_segments: int,
                     segments: int, items: list[Any]) -> None:
        """Write the head after `items` were appended, unless its segment count and expiry
        stay: an append to the newest segment leaves the head's epoch token as it was.

        The token only steers the layout (an append goes to the newest segment while the
        token says the current epoch wrote it, or while it is small); a stale token makes a
        later append open a new segment instead of growing a large one, which is as
        correct. Not rewriting the head for its token spares a put, an eviction and a
        written row per list and epoch (a short list: the segment alone changes)."""
        head_expiry = self._head_expiry(items)
        unchanged = old_segments == segments
        if head_expiry is not None:
            old = self._table.get(self._state_id, key_bytes, key_group).expires_at_ms
            if unchanged and old is not None and old >= head_expiry:
                return
            head_expiry = max(head_expiry, old or 0)
        elif unchanged:
            return
        self._write_head(key_bytes, key_group, segments, head_expiry)

    def update(self, values: list[Any] | None) -> None:
        values = [] if values is None else list(values)
        self._check(values)
        key_bytes, key_group = self._key()
        segments, _ = self._head(key_bytes, key_group)
        self._rewrite(key_bytes, key_group, segments, self._wrap(values))

    def clear(self) -> None:
        self.update([])

    def merge_namespaces(self, target: Any, sources: Any) -> None:
        """Append the lists of the `sources` namespaces to that of `target` and clear
        them (Flink's `InternalMergingState.mergeNamespaces`, used by merging windows);
        leaves `target` current."""
        merged: list[Any] = []
        for source in sources:
            self.set_current_namespace(source)
            merged.extend(self.get())
            self.clear()
        self.set_current_namespace(target)
        if merged:
            self.add_all(merged)
