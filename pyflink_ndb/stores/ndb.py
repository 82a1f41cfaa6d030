"""Transaction sizes counted in NDB operations (RonDB / MySQL NDB Cluster).

NDB fails a transaction that needs more operation records than a data node has
(`MaxNoOfConcurrentOperations`, 32,768 by default): "Out of operation records in
transaction coordinator" (error 233). Every row written or deleted is one operation, and
each BLOB/TEXT/JSON value is stored as an inline head plus parts in a hidden table: one
more operation per part. pyflink-ndb bounds every transaction so that even its largest
rows stay far below the limit; the functions here do the counting (tested in
tests/test_ndb_limits.py).

Figures (MySQL NDB Cluster 8.0 reference manual, "Limits Associated with Database
Objects in NDB Cluster" and "NDB Cluster Data Node Configuration Parameters"): the inline
head of a BLOB column holds 256 bytes; a LONGBLOB part holds 13,948 bytes (BLOB and TEXT
parts hold 2,000 and 4,000); a JSON column is stored like a BLOB with a 4,000-byte head
and 8,100-byte parts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

#: Default `MaxNoOfConcurrentOperations` of an NDB data node.
MAX_OPERATIONS = 32_768
#: Inline head and part size (bytes) of a LONGBLOB column (`vbytes`).
LONGBLOB_INLINE, LONGBLOB_PART = 256, 13_948
#: Inline head and part size (bytes) of a JSON column (`vjson`, `kjson`).
JSON_INLINE, JSON_PART = 4_000, 8_100
#: Transactions are kept to this share of the limit (other sessions need records too).
SAFETY_SHARE = 0.5


def blob_parts(size: int | None, inline: int, part: int) -> int:
    """Parts (operations besides the row) that a value of `size` bytes needs."""
    if not size or size <= inline:
        return 0
    return -(-(size - inline) // part)


def row_operations(vbytes: int | None, vjson: int | None = None,
                   kjson: int | None = None) -> int:
    """NDB operations to write or delete one state row with values of these sizes."""
    return (1 + blob_parts(vbytes, LONGBLOB_INLINE, LONGBLOB_PART)
            + blob_parts(vjson, JSON_INLINE, JSON_PART)
            + blob_parts(kjson, JSON_INLINE, JSON_PART))


def batch_operations(rows: Iterable[Sequence[Any]]) -> int:
    """NDB operations of one write batch of state-row parameter tuples (the tuples that
    :meth:`StateStore.write_versions` sends: vbytes, vjson, kjson at 9, 10, 11)."""
    return sum(row_operations(len(r[9] or b""), len(r[10] or ""), len(r[11] or ""))
               for r in rows)


def max_rows_per_delete(chunk_bytes: int, key_json_bytes: int = 2_048) -> int:
    """Rows one DELETE may remove so that rows of the largest size (a full chunk of
    bytes and of JSON, a JSON key of `key_json_bytes`) stay within :data:`SAFETY_SHARE`
    of the limit."""
    per_row = row_operations(chunk_bytes, chunk_bytes, key_json_bytes)
    return max(1, int(MAX_OPERATIONS * SAFETY_SHARE) // per_row)
