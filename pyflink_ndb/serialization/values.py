"""Value encoding: pickle bytes (the stored truth) plus JSON where the type maps to JSON.

Values come back as the Python object that was stored, byte-identical for `bytes` and
`str`; they are not converted through the descriptor's type information. Storing bytes in
every tier (the cache included) means a caller who mutates an object after `update()` or
mutates what `value()` returned never changes the stored state, in every tier alike.
"""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import dataclass
from typing import Any

from pyflink_ndb.errors import SerializationError

PICKLE_PROTOCOL = 5
#: Name recorded in the catalog for this serializer; a change is a format change.
SERIALIZER_NAME = "pickle-5"


def encode_value(value: Any) -> bytes:
    """Serialize a state value.

    :raises SerializationError: the value cannot be pickled (the message names its type).
    """
    try:
        return pickle.dumps(value, protocol=PICKLE_PROTOCOL)
    except Exception as err:  # pickle raises many types (TypeError, PicklingError, ...)
        raise SerializationError(
            f"Cannot serialize a state value of type {type(value).__name__}: {err}. Store a "
            "picklable value (plain data, or a class importable on the TaskManager).") from err


def decode_value(data: bytes) -> Any:
    """Inverse of :func:`encode_value`.

    :raises SerializationError: the bytes cannot be unpickled.
    """
    try:
        return pickle.loads(data)
    except Exception as err:
        raise SerializationError(f"Cannot deserialize a stored state value: {err}") from err


#: Deepest nesting rendered as JSON; MariaDB rejects deeper documents (MySQL 8 and RonDB:
#: 100), and a rejected JSON text would fail every checkpoint.
MAX_JSON_DEPTH = 32


def _jsonable(value: Any, depth: int = 0) -> Any:
    if depth > MAX_JSON_DEPTH:
        raise ValueError("nested too deeply for JSON columns")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise ValueError("non-finite float")
    as_dict = getattr(value, "as_dict", None)
    if callable(as_dict) and getattr(value, "_fields", None):
        return {k: _jsonable(v, depth + 1) for k, v in as_dict().items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v, depth + 1) for k, v in value.items()}
    raise ValueError(type(value).__name__)


def value_json(value: Any) -> str | None:
    """The value as JSON text for SQL queries, or None when the type does not map to JSON.

    Maps: None, bool, int, str, finite float, list/tuple, dict with str keys and named Rows
    (as objects), recursively up to :data:`MAX_JSON_DEPTH` levels. bytes, NaN, text that is
    not valid Unicode (lone surrogates), deeper nesting and other types give None (the bytes
    column stays the truth).
    """
    try:
        if not _plain(value):
            value = _jsonable(value)
        text = _ENCODER.encode(value)
        text.encode("utf-8")
        return text
    except (ValueError, RecursionError, UnicodeEncodeError):
        return None


_SCALARS = (type(None), bool, int, float, str)
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _plain(value: Any, depth: int = 0) -> bool:
    """True when `value` is plain data that the JSON encoder (C) renders exactly as
    :func:`_jsonable` would convert it: None, bool, int, float and str of exactly these
    types, and lists, tuples and dicts with str keys of them, nested at most
    :data:`MAX_JSON_DEPTH` levels. Checks without copying (most state values are plain);
    anything else (a subclass, a Row, a dict with other keys, deeper nesting) returns False
    and goes through :func:`_jsonable`. Non-finite floats raise in the encoder
    (`allow_nan=False`) as they do in :func:`_jsonable`."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if depth >= MAX_JSON_DEPTH:
        return False
    if kind is list or kind is tuple:
        for item in value:
            if type(item) not in _SCALARS and not _plain(item, depth + 1):
                return False
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) not in _SCALARS
                                        and not _plain(item, depth + 1)):
                return False
        return True
    return False


@dataclass(frozen=True)
class JsonRenderer:
    """Renders the JSON column of one state's stored values; a small frozen value, so that
    it can be sent to the render process (:mod:`pyflink_ndb.stores.render_process`).

    :param list_segments: a ListState: its head entry has no JSON, a segment's JSON is the
        list of its elements.
    :param ttl: the list's elements are stored as `(value, expires_at_ms)` pairs (a ListState
        with TTL); the JSON holds the values.
    :param values: False: no value has JSON (`write.value-json: false`); the bytes are not
        even unpickled.
    """

    list_segments: bool = False
    ttl: bool = False
    values: bool = True

    def __call__(self, data: bytes) -> str | None:
        """JSON of stored value bytes (:func:`value_json`), or None.

        :raises SerializationError: the bytes cannot be unpickled here.
        """
        if not self.values:
            return None
        value = decode_value(data)
        if not self.list_segments:
            return value_json(value)
        if isinstance(value, tuple):  # the head: (segments, epoch token)
            return None
        return value_json([v for v, _ in value] if self.ttl else value)


#: The renderer of every state but a ListState (ValueState, MapState entries, Reducing and
#: AggregatingState).
PLAIN_JSON = JsonRenderer()
#: The renderer of every state with `write.value-json: false`: `vjson` stays NULL.
NO_JSON = JsonRenderer(values=False)


def json_renderer(kind: str, ttl: bool) -> JsonRenderer:
    """The renderer of the values of a state of `kind` (its catalog's `state_kind`:
    `list` renders a ListState's segments, with `ttl` their (value, expiry) pairs; every
    other kind :data:`PLAIN_JSON`)."""
    return JsonRenderer(list_segments=True, ttl=ttl) if kind == "list" else PLAIN_JSON
