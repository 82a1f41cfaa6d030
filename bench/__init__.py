"""`make bench`: PyFlink's hashmap and RocksDB backends against pyflink-ndb (SQLite, MariaDB)
on the same jobs and machine in one run. Run with `python -m bench.run [--quick]`."""

try:
    # The C client of the read benchmark (bench/reads.py) is loaded first, as every
    # `python -m bench.…` starts here: its libstdc++ needs a static TLS block, which the
    # native libraries PyFlink loads leave too small ("cannot allocate memory in static
    # TLS block" when it comes after them).
    import _mysql_connector  # noqa: F401
except ImportError:  # not installed (the bench extra), or not loadable here
    pass
