"""`make bench`: PyFlink's hashmap and RocksDB backends against pyflink-ndb (SQLite, MariaDB)
on the same jobs and machine in one run. Run with `python -m bench.run [--quick]`."""
