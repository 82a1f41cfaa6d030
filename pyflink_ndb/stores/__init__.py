"""Tier 3: versioned state rows in a database (RonDB/MySQL/MariaDB through pymysql, or SQLite)."""

from pyflink_ndb.stores.base import StateStore, StoredVersion, WriteRow
from pyflink_ndb.stores.factory import open_store

__all__ = ["StateStore", "StoredVersion", "WriteRow", "open_store"]
