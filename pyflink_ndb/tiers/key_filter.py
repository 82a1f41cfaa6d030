"""Per-key-group Bloom filters of the keys a restored branch inherited (issue 9, item 1).

After a restore, a miss in tiers 1-2 of a key the restored snapshot does not hold would
cost a round trip to the store only to learn "no value". A :class:`KeyFilter` answers it
in memory once the key group's filter is built: :meth:`KeyFilter.might_hold` False means
the store holds no version of that entry visible to this attempt's inherited ranges.
Why a filter built once stays valid, and who builds it: docs/protocol.md, "Misses the
store cannot answer (key filter)"; the builder is
:class:`pyflink_ndb.checkpoint.key_filter_build.KeyFilterBuild`.

The filters are rbloom's (`rbloom.Bloom`, Rust): about 0.05 us a lookup, sized per key
group from the number of keys added, at :data:`FALSE_POSITIVE_RATE`. A filter holds the
`hash()` of each member (:func:`entry_member`, :func:`prefix_member`): Python's own hash
of bytes, randomised per process, which is why a filter lives only in the attempt that
built it and is never stored (and its builder can hold 8 bytes per member, not the key).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rbloom import Bloom

#: Share of absent keys a filter lets through (each costs the round trip it would have
#: cost without a filter); 9.6 bits a key.
FALSE_POSITIVE_RATE = 0.01
#: Tag of a prefix member (map and list states: the encoded Flink key and namespace).
_PREFIX_TAG = b"P"


def entry_member(state_id: int, ukey: bytes) -> bytes:
    """The filter member of one entry."""
    return state_id.to_bytes(4, "big") + ukey


def prefix_member(state_id: int, prefix: bytes) -> bytes:
    """The filter member of one map's or list's prefix."""
    return _PREFIX_TAG + state_id.to_bytes(4, "big") + prefix


class KeyFilter:
    """Bloom filters of inherited keys, one per key group, filled by a background thread
    and read by the task thread.

    :param state_ids: the states whose rows the builder adds (the operator's catalog at
        the claim); any other state id is never ruled out.
    :param prefix_state_ids: those of `state_ids` whose entries' prefixes are added too
        (map and list states); a prefix of any other state is never ruled out.

    A key group without a filter yet (not built, or no inherited key group) is never
    ruled out: :meth:`might_hold` is True, and the caller asks the store.
    """

    def __init__(self, state_ids: Iterable[int], prefix_state_ids: Iterable[int]) -> None:
        self.state_ids = frozenset(state_ids)
        self.prefix_state_ids = frozenset(prefix_state_ids) & self.state_ids
        self._filters: dict[int, Bloom] = {}
        #: Members added, over all key groups.
        self.members = 0
        #: Lookups answered "absent" (each spared a round trip).
        self.ruled_out = 0

    def add_key_group(self, key_group: int, hashes: Sequence[int]) -> None:
        """Install the filter of `key_group` holding `hashes` (the `hash()` of each
        :func:`entry_member` and :func:`prefix_member`; repeats only make it larger).
        Called once per key group by the builder, after the key group's scan is complete:
        a partial filter would rule out keys not scanned yet."""
        bloom = Bloom(max(len(hashes), 1), FALSE_POSITIVE_RATE)
        bloom.update(hashes)
        self._filters[key_group] = bloom  # one dict store: atomic for the task thread
        self.members += len(hashes)

    @property
    def key_groups(self) -> int:
        """Key groups whose filter is built."""
        return len(self._filters)

    @property
    def size_bytes(self) -> int:
        """Bytes of the filters' bit arrays."""
        return sum(f.size_in_bits for f in list(self._filters.values())) // 8

    def might_hold(self, key_group: int, state_id: int, ukey: bytes) -> bool:
        """False when the store surely holds no inherited version of the entry."""
        return self._might_hold(key_group, state_id in self.state_ids,
                                entry_member(state_id, ukey))

    def might_hold_prefix(self, key_group: int, state_id: int, prefix: bytes) -> bool:
        """False when the store surely holds no inherited entry of the map or list at
        `prefix` (the encoded Flink key and namespace)."""
        return self._might_hold(key_group, state_id in self.prefix_state_ids,
                                prefix_member(state_id, prefix))

    def _might_hold(self, key_group: int, covered: bool, member: bytes) -> bool:
        """`covered`: the builder added the members of this kind for this state."""
        bloom = self._filters.get(key_group)
        if bloom is None or not covered or hash(member) in bloom:
            return True
        self.ruled_out += 1
        return False
