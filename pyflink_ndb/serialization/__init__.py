"""Serialization: canonical key bytes and value bytes (pickle) plus a JSON rendering."""

from pyflink_ndb.serialization.keys import decode_key, encode_key
from pyflink_ndb.serialization.values import decode_value, encode_value, value_json

__all__ = ["decode_key", "decode_value", "encode_key", "encode_value", "value_json"]
