"""The checkpoint protocol: branches, fenced snapshots, retention, garbage collection."""
