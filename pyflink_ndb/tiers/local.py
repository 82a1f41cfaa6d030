"""Tier 2: an embedded RocksDB (rocksdict) per subtask, in a local directory.

The directory is emptied when the subtask opens: tier 2 only ever holds copies of entries
of this attempt (a restore starts from tier 3). Keys are `state_id (4 bytes) + ukey`, so
one state's entries of one Flink key are contiguous and can be iterated by prefix.
"""

from __future__ import annotations

import logging
import shutil
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rocksdict import BlockBasedOptions, Options, Rdict, ReadOptions, WriteOptions

from pyflink_ndb.tiers.folders import FolderClaim

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">bhq")  # has_value, key_group, expires_at_ms (-1 = none)
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from
_HEADER_SIZE = _HEADER.size


def pack(value: bytes | None, key_group: int, expires_at_ms: int | None) -> bytes:
    header = _HEADER.pack(0 if value is None else 1, key_group,
                          -1 if expires_at_ms is None else expires_at_ms)
    return header if value is None else header + value


def unpack(data: bytes) -> tuple[bytes | None, int, int | None]:
    has_value, key_group, expires = _HEADER.unpack_from(data)
    value = bytes(data[_HEADER.size:]) if has_value else None
    return value, key_group, None if expires < 0 else expires


class LocalTier:
    """RocksDB at `path` (created empty; any previous content is deleted); `claim`: the
    hold on its process folder (:mod:`pyflink_ndb.tiers.folders`), released once
    :meth:`destroy` deleted the folder (None: none)."""

    def __init__(self, path: str, claim: FolderClaim | None = None) -> None:
        self.path = Path(path)
        self._claim = claim
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        # Bloom filters (10 bits a key) in the table files: a get of a key that tier 2 does
        # not hold (a key new to this attempt, about one read in two that miss tier 1 on
        # the user-profile job) skips the files instead of reading an index and a block
        # in each once the memtable has been flushed.
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        options.set_block_based_table_factory(table)
        self._db = Rdict(str(self.path), options)
        # No write-ahead log: tier 2 is emptied when the subtask opens, so nothing it held
        # survives a crash anyway, and a put without the log costs a quarter (0.7 against
        # 2.7 us per 400-byte entry here).
        writes = WriteOptions()
        # A property at runtime (rocksdict 0.3's stub declares a method).
        writes.disable_wal = True  # type: ignore[method-assign,assignment]
        self._db.set_write_options(writes)
        self._written = False

    @staticmethod
    def key_of(state_id: int, ukey: bytes) -> bytes:
        """The RocksDB key of an entry."""
        return state_id.to_bytes(4, "big") + ukey

    _key = key_of

    def snapshot_view(self) -> Any:
        """A consistent read view of tier 2 as of now (a RocksDB snapshot: O(1), safe to
        read from another thread); `view[key_of(...)]` gives the packed entry. Released
        when the last reference is dropped."""
        return self._db.snapshot()

    def get(self, state_id: int, ukey: bytes) -> tuple[bytes | None, int, int | None] | None:
        if not self._written:
            return None  # nothing was ever put: a RocksDB lookup would find nothing
        data = self._db.get(state_id.to_bytes(4, "big") + ukey)  # key_of, inlined
        if data is None:
            return None
        has_value, key_group, expires = _unpack_header(data)  # unpack, inlined
        return (data[_HEADER_SIZE:] if has_value else None, key_group,
                None if expires < 0 else expires)

    def put(self, state_id: int, ukey: bytes, value: bytes | None, key_group: int,
            expires_at_ms: int | None) -> None:
        self._written = True
        # key_of and pack, inlined (a put per eviction from tier 1).
        header = _pack_header(0 if value is None else 1, key_group,
                              -1 if expires_at_ms is None else expires_at_ms)
        self._db[state_id.to_bytes(4, "big") + ukey] = \
            header if value is None else header + value

    def delete(self, state_id: int, ukey: bytes) -> None:
        del self._db[self._key(state_id, ukey)]

    def entry_count(self) -> int:
        """RocksDB's estimate of the entries held (`rocksdb.estimate-num-keys`: deletions
        not yet compacted away may be counted)."""
        return int(self._db.property_int_value("rocksdb.estimate-num-keys") or 0)

    def iter_prefix(self, state_id: int, prefix: bytes
                    ) -> Iterator[tuple[bytes, bytes | None, int, int | None]]:
        """(ukey, value, key_group, expires_at_ms) of every entry whose ukey starts with
        `prefix`, in byte order, as of the moment the iteration starts."""
        start = self._key(state_id, prefix)
        it = self._db.iter(ReadOptions())
        it.seek(start)
        while it.valid():
            key = it.key()
            if not key.startswith(start):
                break
            value, key_group, expires = unpack(it.value())
            yield key[4:], value, key_group, expires
            it.next()

    def clear(self) -> None:
        """Drop every entry (restore and truncate start from an empty tier 2)."""
        if not self._written:
            return  # still empty: re-creating a RocksDB costs tens of milliseconds
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self.__init__(str(self.path), self._claim)  # type: ignore[misc]

    def close(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
            self._db = None  # type: ignore[assignment]

    def destroy(self, wait: bool = True) -> threading.Thread | None:
        """Close the RocksDB and delete its folder.

        :param wait: False: do both in a thread of their own, started before this returns.
            A close costs up to a memtable's flush (the puts skip the write-ahead log, so
            RocksDB flushes them at close; rocksdict cannot set
            `avoid_flush_during_shutdown`) and the deletion grows with the entries
            evicted: 137 ms at 100,000 entries of 1 KB, which a cancelled task spent before
            Flink could deploy its next attempt. The thread is not a daemon: an interpreter
            that exits waits for the folder to be gone. It logs a failed close (a warning)
            and deletes the folder anyway.
        :returns: that thread, or None with `wait`.
        :raises Exception: with `wait`, RocksDB's error from the close (the folder is
            deleted anyway).
        """
        db, self._db = getattr(self, "_db", None), None  # type: ignore[assignment]
        path = self.path
        claim, self._claim = self._claim, None

        def release() -> None:
            try:
                if db is not None:
                    # The close flushes the memtable (no write-ahead log) into the folder;
                    # one deleted meanwhile (a tmp cleaner) would make RocksDB retry the
                    # flush every second for good, on the one flush thread every RocksDB
                    # of the process shares: every later close would wait behind it.
                    path.mkdir(parents=True, exist_ok=True)
                    db.close()
            finally:
                shutil.rmtree(path, ignore_errors=True)
                if claim is not None:
                    claim.release()

        if wait:
            release()
            return None

        def release_logged() -> None:
            try:
                release()
            except Exception:
                log.warning("pyflink-ndb: closing tier 2 at %s failed", path, exc_info=True)

        thread = threading.Thread(target=release_logged,
                                  name=f"pyflink-ndb-tier2-cleanup-{path.name}")
        thread.start()
        return thread
