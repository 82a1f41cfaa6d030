"""Tiers 1 and 2 (in-memory LRU, embedded RocksDB) and the table that stacks them on tier 3."""

from pyflink_ndb.tiers.table import Entry, TieredTable

__all__ = ["Entry", "TieredTable"]
