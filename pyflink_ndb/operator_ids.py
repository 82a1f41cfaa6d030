"""Flink's operator IDs, computed from the uids users give (`DataStream.uid(...)`).

A switched operator (README, "Switch a whole job") keeps its states under its Flink
operator ID, a 32-digit hex string. Flink derives that ID from a user-given uid as
`StreamGraphHasherV2.generateUserSpecifiedHash` does: Guava's `murmur3_128(0)` over the
uid's UTF-8 bytes, the 16 bytes of `HashCode.asBytes()` as the `OperatorID`
(`AbstractID.toString()` prints them in order). So the CLI can accept the uid.
"""

from __future__ import annotations

_MASK = 0xFFFFFFFFFFFFFFFF
_C1 = 0x87C37B91114253D5
_C2 = 0x4CF5AD432745937F


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _MASK
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _MASK
    return k ^ (k >> 33)


def murmur3_x64_128(data: bytes, seed: int = 0) -> bytes:
    """MurmurHash3 x64 128-bit of `data`, as Guava's `Hashing.murmur3_128(seed)` returns
    it from `asBytes()` (h1 then h2, each little-endian)."""
    h1 = h2 = seed
    blocks = len(data) // 16
    for i in range(blocks):
        k1 = int.from_bytes(data[16 * i:16 * i + 8], "little")
        k2 = int.from_bytes(data[16 * i + 8:16 * i + 16], "little")
        h1 ^= (_rotl((k1 * _C1) & _MASK, 31) * _C2) & _MASK
        h1 = (((_rotl(h1, 27) + h2) & _MASK) * 5 + 0x52DCE729) & _MASK
        h2 ^= (_rotl((k2 * _C2) & _MASK, 33) * _C1) & _MASK
        h2 = (((_rotl(h2, 31) + h1) & _MASK) * 5 + 0x38495AB5) & _MASK
    tail = data[16 * blocks:]
    if len(tail) > 8:
        h2 ^= (_rotl((int.from_bytes(tail[8:], "little") * _C2) & _MASK, 33) * _C1) & _MASK
    if tail:
        h1 ^= (_rotl((int.from_bytes(tail[:8], "little") * _C1) & _MASK, 31) * _C2) & _MASK
    h1 ^= len(data)
    h2 ^= len(data)
    h1 = (h1 + h2) & _MASK
    h2 = (h2 + h1) & _MASK
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & _MASK
    h2 = (h2 + h1) & _MASK
    return h1.to_bytes(8, "little") + h2.to_bytes(8, "little")


def operator_id_of_uid(uid: str) -> str:
    """The Flink operator ID (32 hex digits) of an operator whose uid is `uid`."""
    return murmur3_x64_128(uid.encode("utf-8")).hex()
