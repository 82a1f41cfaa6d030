"""Flink's key group of a key, computed in Python for the key types whose Java
`hashCode()` is fixed by the Java language: a `String`, an `Integer` or a `Long`.

Flink routes a record by `KeyGroupRangeAssignment.assignToKeyGroup(key, maxParallelism)`
= `MathUtils.murmurHash(key.hashCode()) % maxParallelism` (flink-runtime
`KeyGroupRangeAssignment.computeKeyGroupForKeyHash`, flink-core `MathUtils.murmurHash`).
The backend asks Java (the bridge's `KeyGroupProbe.currentKeyGroup`, a PEMJA call) for
the key group of each key it has not met; that call cost about a quarter of the task
thread's Python time in bench part 7 (a Zipf job that meets a new user every few
records). Where the operator's key is a `java.lang.String`, `Integer` or `Long` (the key
types `Types.STRING()`, `Types.INT()`, `Types.LONG()` of `key_by`), the same number is
computed here from the Python key instead. PyFlink's `key_by` keys the Java stream by a
`Row` of that one field (`KeyByKeySelector`), whose hash code is the field's plus a
constant the bridge reports.

The Java class comes from the bridge (`KeyGroupProbe.currentKeyClass`), never from a
guess on the Python value, and :class:`KeyGroupCalculator` compares its first
:data:`CHECKED_KEYS` answers with Java's; one difference turns it off for the subtask's
life (logged), so a conversion this module does not know (a `str` with a lone surrogate,
an `int` beyond the Java type) costs a Java call, never a wrong key group.
`tests/test_key_groups.py` checks the numbers against Flink's own
`KeyGroupRangeAssignment` through the JVM of the `apache-flink` wheel.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Answers compared with Java's before the calculator is trusted alone.
CHECKED_KEYS = 256

_M32 = 0xFFFFFFFF


def _signed(x: int) -> int:
    x &= _M32
    return x - 0x1_0000_0000 if x & 0x8000_0000 else x


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def murmur_hash(code: int) -> int:
    """Flink's `MathUtils.murmurHash(int)`: a non-negative int from a Java hash code."""
    code = (code * 0xCC9E2D51) & _M32
    code = _rotl(code, 15)
    code = (code * 0x1B873593) & _M32
    code = _rotl(code, 13)
    code = (code * 5 + 0xE6546B64) & _M32
    code ^= 4
    code ^= code >> 16  # bitMix
    code = (code * 0x85EBCA6B) & _M32
    code ^= code >> 13
    code = (code * 0xC2B2AE35) & _M32
    code ^= code >> 16
    signed = _signed(code)
    if signed >= 0:
        return signed
    return -signed if signed != -0x8000_0000 else 0


def java_string_hash(s: str) -> int | None:
    """`java.lang.String.hashCode()` of `s` (over its UTF-16 code units), or None when `s`
    holds a lone surrogate (its Java form is not certain)."""
    h = 0
    if s.isascii():
        for ch in s.encode("ascii"):
            h = (31 * h + ch) & _M32
        return _signed(h)
    try:
        units = s.encode("utf-16-be")
    except UnicodeEncodeError:
        return None
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & _M32
    return _signed(h)


def java_integer_hash(v: int) -> int | None:
    """`Integer.hashCode()` (the value), None outside the int range."""
    return v if -0x8000_0000 <= v <= 0x7FFF_FFFF else None


def java_long_hash(v: int) -> int | None:
    """`Long.hashCode()` (`(int) (v ^ (v >>> 32))`), None outside the long range."""
    if not -0x8000_0000_0000_0000 <= v <= 0x7FFF_FFFF_FFFF_FFFF:
        return None
    u = v & 0xFFFF_FFFF_FFFF_FFFF
    return _signed(u ^ (u >> 32))


#: Java key class -> (the Python type its keys arrive as, its hashCode()).
_HASHES: dict[str, tuple[type, Callable[[Any], int | None]]] = {
    "java.lang.String": (str, java_string_hash),
    "java.lang.Integer": (int, java_integer_hash),
    "java.lang.Long": (int, java_long_hash),
}


#: PyFlink's `key_by` keys by a one-field `Row` (see `KeyGroupProbe.currentKeyClass`).
_ROW_KEY = re.compile(r"org\.apache\.flink\.types\.Row\(([\w.$]+)\)\+(-?\d+)")


def key_group_of_hash(code: int, max_parallelism: int) -> int:
    """`KeyGroupRangeAssignment.computeKeyGroupForKeyHash(code, maxParallelism)`."""
    return murmur_hash(code) % max_parallelism


class KeyGroupCalculator:
    """The key group of a Python key for one operator, without a call into Java where the
    key class allows (see the module docstring).

    :param java_class: the fully qualified class of the operator's keys in Java
        (`KeyGroupProbe.currentKeyClass`); a class not handled here makes
        :meth:`key_group` always None.
    :param max_parallelism: the operator's number of key groups.
    """

    def __init__(self, java_class: str, max_parallelism: int) -> None:
        self.java_class = java_class
        self.max_parallelism = max_parallelism
        #: Added to the key's hash code: a one-field Row's hash code is its field's plus
        #: this (the bridge names such a key `org.apache.flink.types.Row(<class>)+<offset>`).
        self.offset = 0
        match = _ROW_KEY.fullmatch(java_class)
        if match is not None:
            java_class, self.offset = match.group(1), int(match.group(2))
        known = _HASHES.get(java_class)
        self._type: type | None = known[0] if known else None
        self._hash: Callable[[Any], int | None] | None = known[1] if known else None
        #: Answers still to compare with Java's (0: trusted).
        self.unchecked = CHECKED_KEYS
        #: Answers that differed from Java's (one turns the calculator off).
        self.mismatches = 0

    @property
    def enabled(self) -> bool:
        return self._hash is not None

    def key_group(self, key: Any) -> int | None:
        """The key group of `key`, or None: ask Java (a type or value not handled)."""
        if self._hash is None or type(key) is not self._type:
            return None
        code = self._hash(key)
        if code is None:
            return None
        if self.offset:
            code = _signed(code + self.offset)
        return key_group_of_hash(code, self.max_parallelism)

    def check(self, key: Any, mine: int, java: int) -> None:
        """Compare one of the first answers with Java's; a difference turns the
        calculator off (logged once with the key's type)."""
        if mine == java:
            self.unchecked -= 1
            return
        self.mismatches += 1
        self._hash = None
        log.warning("pyflink-ndb: the key group computed in Python for a %s key of Java "
                    "class %s was %d, Flink's is %d; asking Flink for every new key from "
                    "now on", type(key).__name__, self.java_class, mine, java)
