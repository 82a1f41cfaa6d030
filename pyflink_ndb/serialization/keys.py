"""Canonical key encoding: the same key gives the same bytes in every process and run.

Key identity rule (README, "Keys"): two keys are the same key when they have the same type
and value, as Flink's pickled keys are compared by their bytes. So `1`, `1.0` and `True`
are three different keys; every NaN is the same key; `0.0` and `-0.0` differ; `b''`, `''`
and `None` differ; tuples, lists and `Row`s are compared element by element (Rows also
by field names and RowKind) and differ from each other. Map keys must be hashable, as for
a Python dict (`TypeError` otherwise).

The encoding is self-delimiting (type tag, then a length where needed), so an encoded key
is never a prefix of another encoded key and composite keys can be concatenated.
"""

from __future__ import annotations

import datetime
import decimal
import math
import pickle
import struct
from typing import Any

from pyflink_ndb.errors import SerializationError

_NAN = struct.pack(">d", math.nan)
_SCALAR_PICKLE_TYPES = (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


#: PyFlink's window classes (`pyflink.datastream.window`), keys of a merging window set
#: and namespaces of window state, encoded by value: tag "W" + a tuple of their fields.
_WINDOW_TYPE_NAMES = frozenset(("TimeWindow", "CountWindow", "GlobalWindow"))


def _window_fields(value: Any) -> tuple[Any, ...] | None:
    """The fields of a PyFlink window, or None for any other value."""
    if type(value).__name__ not in _WINDOW_TYPE_NAMES:
        return None
    from pyflink.datastream.window import CountWindow, GlobalWindow, TimeWindow

    if type(value) is TimeWindow:
        return ("T", value.start, value.end)
    if type(value) is CountWindow:
        return ("C", value.id)
    if type(value) is GlobalWindow:
        return ("G",)
    return None


def _window_of(fields: Any) -> Any:
    from pyflink.datastream.window import CountWindow, GlobalWindow, TimeWindow

    if fields[0] == "T":
        return TimeWindow(fields[1], fields[2])
    if fields[0] == "C":
        return CountWindow(fields[1])
    if fields[0] == "G":
        return GlobalWindow()
    raise SerializationError(f"Corrupt key bytes: unknown window {fields!r}.")


#: The deepest nesting of containers (tuple, list, frozenset, Row) a key may have. A deeper
#: key is refused with :class:`SerializationError` before the encoder nears Python's
#: recursion limit (1,000 frames): near that limit any finalizer that a garbage collection
#: runs meanwhile (a socket's, a generator's) fails with an ignored RecursionError.
MAX_KEY_DEPTH = 100


def _encode(value: Any, out: bytearray, depth: int = 0) -> None:
    # bool before int: bool is a subclass of int.
    if value is None:
        out += b"N"
    elif value is True:
        out += b"T"
    elif value is False:
        out += b"F"
    elif type(value) is int:
        raw = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
        out += b"i" + _varint(len(raw)) + raw
    elif type(value) is float:
        out += b"f" + (_NAN if math.isnan(value) else struct.pack(">d", value))
    elif type(value) is str:
        raw = value.encode("utf-8", "surrogatepass")
        out += b"s" + _varint(len(raw)) + raw
    elif type(value) is bytes:
        out += b"b" + _varint(len(value)) + value
    elif type(value) is bytearray:
        out += b"a" + _varint(len(value)) + bytes(value)
    elif type(value) is tuple:
        out += b"t" + _varint(len(value))
        depth = _deeper(depth)
        for item in value:
            _encode(item, out, depth)
    elif type(value) is list:
        out += b"l" + _varint(len(value))
        depth = _deeper(depth)
        for item in value:
            _encode(item, out, depth)
    elif type(value) is frozenset:
        depth = _deeper(depth)
        parts = sorted(bytes(_encode_to(item, depth)) for item in value)
        out += b"z" + _varint(len(parts)) + b"".join(parts)
    elif _is_row(value):
        names = tuple(value._fields) if getattr(value, "_fields", None) else None
        if names is not None and (len(set(names)) != len(names) or not all(
                type(n) is str for n in names)):
            # Decoding rebuilds the Row as Row(**fields): it would drop a repeated name
            # and cannot take a name that is not a string.
            raise SerializationError(
                f"Cannot use a Row with field names {names!r} in a state key: the names "
                "must be distinct strings. Rename the fields, or use a positional Row.")
        out += b"r" + bytes([value.get_row_kind().value]) + _varint(len(value))
        _encode(names, out, depth)  # the names belong to the Row's own level
        depth = _deeper(depth)
        for item in value:
            _encode(item, out, depth)
    elif isinstance(value, _SCALAR_PICKLE_TYPES):
        raw = pickle.dumps(value, protocol=4)
        out += b"p" + _varint(len(raw)) + raw
    elif (fields := _window_fields(value)) is not None:
        out += b"W"
        _encode(fields, out)
    else:
        raise SerializationError(
            f"Cannot use a value of type {type(value).__name__} as a state key: supported are "
            "None, bool, int, float, str, bytes, bytearray, tuple, list, frozenset, Row, "
            "date/time and Decimal (and nestings of them). Convert the key to one of these.")


class _TooDeep(SerializationError):
    """A key nested more than :data:`MAX_KEY_DEPTH` containers deep (see
    :func:`encode_map_key`, which must not hash such a key)."""


def _deeper(depth: int) -> int:
    if depth >= MAX_KEY_DEPTH:
        raise _TooDeep(
            f"A state key is nested more than {MAX_KEY_DEPTH} levels deep; use a flatter key.")
    return depth + 1


def _encode_to(value: Any, depth: int = 0) -> bytearray:
    out = bytearray()
    _encode(value, out, depth)
    return out


def _is_row(value: Any) -> bool:
    from pyflink.common import Row

    return isinstance(value, Row)


def encode_key(value: Any) -> bytes:
    """Canonical bytes of a key.

    :param value: the key (see the module docstring for supported types).
    :returns: self-delimiting bytes; equal keys give equal bytes.
    :raises SerializationError: the type is not supported as a key, or its containers are
        nested more than :data:`MAX_KEY_DEPTH` levels deep.
    """
    kind = type(value)
    if kind is int or (kind is str and len(value) <= KEY_MEMO_MAX_CHARS):
        # Remembered: a job's keys recur (the current key of every record, a map's keys).
        # Only exact ints and strs: equal ones have equal bytes, and no int equals a str
        # (1, 1.0 and True are equal in a dict but three keys here: floats and bools are
        # never remembered).
        found = _KEY_MEMO.get(value)
        if found is None:
            found = bytes(_encode_to(value))
            if len(_KEY_MEMO) >= KEY_MEMO_ENTRIES:
                _KEY_MEMO.clear()
            _KEY_MEMO[value] = found
        return found
    return bytes(_encode_to(value))


#: Encoded int and str keys by key, for :func:`encode_key`; emptied when it holds
#: :data:`KEY_MEMO_ENTRIES` (no LRU bookkeeping on a hit). Shared by the subtasks of the
#: process (dict operations are atomic under the interpreter lock).
_KEY_MEMO: dict[int | str, bytes] = {}
KEY_MEMO_ENTRIES = 16_384
#: Longer strs are encoded every time (the memo holds small keys only).
KEY_MEMO_MAX_CHARS = 128


def encode_map_key(value: Any) -> bytes:
    """Canonical bytes of a `MapState` user key, which must be hashable like a dict key.

    :raises TypeError: the key is unhashable (list, dict, set, ...), as `dict` would raise.
    :raises SerializationError: the type is not supported as a key, or the key is nested
        more than :data:`MAX_KEY_DEPTH` containers deep.
    """
    kind = type(value)
    if kind is int or kind is str:
        return encode_key(value)  # hashable and flat
    # Encoded first: hashing a tuple nested a million levels deep overflows the C stack
    # (CPython's tuple hash recurses without a limit), while the encoder stops at the
    # depth limit; a key it encoded is shallow enough to hash, as a dict would.
    try:
        encoded = encode_key(value)
    except _TooDeep:
        raise
    except SerializationError:
        if type(value).__hash__ is None:  # a dict, a set: unhashable as in a dict
            _require_hashable(value)
        raise  # not hashed: its unread part may be nested without limit
    _require_hashable(value)
    return encoded


def _require_hashable(value: Any) -> None:
    try:
        hash(value)
    except TypeError as err:
        raise TypeError(
            f"unhashable type as MapState key: {type(value).__name__!r}; use a hashable key "
            "(tuple instead of list, frozenset instead of set)") from err


def _decode(data: bytes, pos: int) -> tuple[Any, int]:
    tag = data[pos:pos + 1]
    pos += 1
    if tag == b"N":
        return None, pos
    if tag == b"T":
        return True, pos
    if tag == b"F":
        return False, pos
    if tag == b"f":
        return struct.unpack(">d", data[pos:pos + 8])[0], pos + 8
    if tag in (b"i", b"s", b"b", b"a", b"p"):
        length, pos = _read_varint(data, pos)
        raw = data[pos:pos + length]
        pos += length
        if tag == b"i":
            return int.from_bytes(raw, "big", signed=True), pos
        if tag == b"s":
            return raw.decode("utf-8", "surrogatepass"), pos
        if tag == b"b":
            return bytes(raw), pos
        if tag == b"a":
            return bytearray(raw), pos
        return pickle.loads(raw), pos
    if tag in (b"t", b"l", b"z"):
        count, pos = _read_varint(data, pos)
        items = []
        for _ in range(count):
            item, pos = _decode(data, pos)
            items.append(item)
        if tag == b"t":
            return tuple(items), pos
        if tag == b"l":
            return items, pos
        return frozenset(items), pos
    if tag == b"W":
        fields, pos = _decode(data, pos)
        return _window_of(fields), pos
    if tag == b"r":
        from pyflink.common import Row, RowKind

        kind = RowKind(data[pos])
        count, pos = _read_varint(data, pos + 1)
        names, pos = _decode(data, pos)
        items = []
        for _ in range(count):
            item, pos = _decode(data, pos)
            items.append(item)
        row = Row(**dict(zip(names, items, strict=True))) if names else Row(*items)
        row.set_row_kind(kind)
        return row, pos
    raise SerializationError(f"Corrupt key bytes: unknown tag {tag!r} at offset {pos - 1}.")


def decode_key(data: bytes) -> Any:
    """Inverse of :func:`encode_key`.

    :raises SerializationError: the bytes are not a complete encoded key.
    """
    value, pos = _decode(data, 0)
    if pos != len(data):
        raise SerializationError("Corrupt key bytes: trailing data after the key.")
    return value


def split_key(data: bytes) -> tuple[bytes, bytes]:
    """Split bytes that start with an encoded key into (that key's bytes, the rest)."""
    _, pos = _decode(data, 0)
    return data[:pos], data[pos:]


def key_prefix_json(ukey: bytes) -> tuple[bytes | None, str | None]:
    """(the encoded Flink key at the start of an entry's ukey, its JSON or None when it has
    no JSON form), in one decode; (None, None) when `ukey` does not start with a complete
    encoded key. The encoding is self-delimiting, so every ukey that starts with the
    returned bytes holds the same Flink key."""
    from pyflink_ndb.serialization.values import value_json

    try:
        value, pos = _decode(ukey, 0)
    except (SerializationError, IndexError, ValueError):
        return None, None
    return ukey[:pos], value_json(value)


def key_json(ukey: bytes) -> str | None:
    """JSON of the Flink key at the start of an entry's ukey (None when it has no JSON form)."""
    return key_prefix_json(ukey)[1]


class KeyJsonMemo:
    """:func:`key_json`, remembered for a writer that renders epoch after epoch.

    Rows come in (state, ukey) order, so the entries of one Flink key (a map's entries, a
    list's segments) follow each other: a ukey that starts with the previous answer's
    encoded key has its JSON (the encoding is self-delimiting) without a lookup. Other
    ukeys are looked up in a plain dict of at most `max_entries`, emptied when full (no LRU
    bookkeeping per row; keys recur every epoch). Not thread-safe: one per writer.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self._memo: dict[bytes, tuple[bytes | None, str | None]] = {}
        self._max_entries = max_entries
        self._last: tuple[bytes | None, str | None] = (None, None)

    def __call__(self, ukey: bytes) -> str | None:
        key, kjson = self._last
        if key is not None and ukey.startswith(key):
            return kjson
        found = self._memo.get(ukey)
        if found is None:
            if len(self._memo) >= self._max_entries:
                self._memo.clear()
            found = self._memo[ukey] = key_prefix_json(ukey)
        self._last = found
        return found[1]


#: First byte of an encoded namespace inside a ukey. No encoded key starts with it, so the
#: ukey `Flink key + namespace + suffix` of a namespaced entry never equals, and is told
#: apart from, the ukey `Flink key + suffix` of the same state without a namespace.
NAMESPACE_TAG = b"w"


def encode_namespace(namespace: Any) -> bytes:
    """Bytes of a state namespace, as they follow the Flink key in a ukey.

    Flink's own backends key window state by (key, namespace = window); so do we. PyFlink's
    windows (`pyflink.datastream.window`) are encoded by value: `TimeWindow(start, end)`,
    `CountWindow(id)`, `GlobalWindow()`.

    :param namespace: None (no namespace: Flink's `VoidNamespace`, what every state outside
        a window operator has) or a window.
    :returns: b"" for None, else :data:`NAMESPACE_TAG` + an encoded key.
    :raises SerializationError: another type (a custom `Window` class), which has no stable
        encoding here.
    """
    if namespace is None:
        return b""
    fields = _window_fields(namespace)
    if fields is None:
        raise SerializationError(
            f"Cannot use a namespace of type {type(namespace).__name__} in tiered state: "
            "supported are PyFlink's TimeWindow, CountWindow and GlobalWindow. Use one of "
            "PyFlink's window assigners, or keep this operator on Flink's own state.")
    out = bytearray(NAMESPACE_TAG + b"W")   # NAMESPACE_TAG + encode_key(namespace)
    _encode(fields, out)
    return bytes(out)


def entry_prefix(ukey: bytes) -> bytes:
    """The part of a map or list entry's ukey that one map or list shares: the encoded
    Flink key, followed by the encoded namespace when there is one."""
    key, rest = split_key(ukey)
    if rest[:1] != NAMESPACE_TAG:
        return key
    _, pos = _decode(rest, 1)
    return key + rest[:pos]
