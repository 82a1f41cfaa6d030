"""The issue-9 target table of `make bench`'s summary (bench/targets.py): which figures of
which part each target reads, and its verdict. The figures are made up; the parts that
produce them run in `make bench`."""
from bench.targets import markdown, targets


def _results(ndb_zipf: float, ndb_profile_e2e: float) -> dict:
    return {
        "throughput": {"runs": {
            "rocksdb/zipf": {"records_per_s": 9_000.0, "e2e_median_ms": 500.0},
            "rocksdb-incremental/zipf": {"records_per_s": 10_000.0, "e2e_median_ms": 400.0},
            "rocksdb/uniform": {"records_per_s": 99_999.0, "e2e_median_ms": 1.0},
            "ndb-mariadb/zipf": {"records_per_s": ndb_zipf, "e2e_median_ms": 200.0}}},
        "profile": {"runs": {
            "rocksdb-incremental": {"label": "RocksDB inc", "records_per_s": 6_000.0,
                                    "e2e_median_ms": 4_000.0},
            "rocksdb-unaligned": {"label": "RocksDB unaligned", "records_per_s": 7_000.0,
                                  "e2e_median_ms": 100.0},
            "rocksdb-full": {"label": "RocksDB full", "error": "exit 1"},
            "ndb-mariadb": {"label": "ndb", "records_per_s": 7_700.0,
                            "e2e_median_ms": ndb_profile_e2e}}},
        "recovery_rescale": {"sizes": [10_000, 1_000_000], "runs": {
            "ndb-mariadb/10000": {"ratios": {"failure_to_probe_end_s": 0.8}},
            "ndb-mariadb/1000000": {"ratios": {"failure_to_probe_end_s": 1.4,
                                               "rescale_s": 0.5}}},
            "targets": {"ndb-mariadb": {
            "first_record": {"growth": 1.3, "vs_rocksdb": 0.5, "met": False},
            "probe_end": {"ratios": [0.8, 1.4], "met": True},
            "rescale": {"ratios": [0.5], "met": None}}}},
        "reads": {"queries": {
            "floor": {"reads": 9, "correct": 9, "reads_per_s": 20_000.0, "p99_ms": 0.1},
            "pk": {"reads": 9, "correct": 9, "reads_per_s": 5_000.0, "p99_ms": 0.4},
            "pk_versions": {"reads": 9, "correct": 9, "reads_per_s": 6_000.0, "p99_ms": 0.5},
            "pk_versions_capi": {"reads": 9, "correct": 9, "reads_per_s": 11_000.0,
                                 "p99_ms": 1.5},
            "view_pk": {"reads": 9, "correct": 8, "reads_per_s": 90_000.0, "p99_ms": 0.1},
            "rows_pk": {"reads": 9, "correct": 9, "reads_per_s": 600.0, "p99_ms": 0.9}}},
    }


def test_each_target_compares_the_defaults_with_the_best_rocksdb_of_its_part():
    rows = targets(_results(ndb_zipf=10_500.0, ndb_profile_e2e=90.0))
    verdicts = [(t.workload, t.target.split(" ")[0], t.met) for t in rows]
    assert verdicts == [
        ("(a) flight job, Zipf keys", "records/s", True),  # 10,500 against 10,000, not 99,999
        ("(a) flight job, Zipf keys", "checkpoint", True),  # 200 ms against 400 ms
        ("(b) user-profile job", "records/s", True),  # against unaligned, the failed run left out
        ("(b) user-profile job", "checkpoint", True),  # 90 ms against unaligned's 100 ms
        ("(c) recovery", "failure", False),
        ("(c) recovery", "failure", True),
        ("(c) recovery", "rescale", None),  # no rescale at 10,000 keys
        ("reads", "≥", False),  # by primary key: the floor does not count, p99 too long
        ("reads", "≥", False),  # through the views: a read with a wrong answer does not count
    ]
    assert "1.05×" in rows[0].measured and "1.10×" in rows[2].measured
    assert "11,000/s, p99 1.500 ms" in rows[-2].measured, "the fastest of those that miss"
    assert "`SELECT 1` 20,000/s" in rows[-2].measured and "C API" in rows[-2].measured
    assert rows[-2].target.endswith("by primary key")
    assert "600/s" in rows[-1].measured and "`NS_committed_rows`" in rows[-1].measured
    assert rows[5].measured == "10,000 keys 0.80×, 1,000,000 keys 1.40×"
    assert rows[6].measured == "10,000 keys –, 1,000,000 keys 0.50×"


def test_a_read_by_primary_key_that_meets_both_limits_meets_the_target():
    results = _results(10_000.0, 100.0)
    results["reads"]["queries"]["pk_versions_capi"]["p99_ms"] = 0.2
    by_key, views = [t for t in targets(results) if t.workload == "reads"]
    assert by_key.met is True and "11,000/s" in by_key.measured
    assert views.met is False


def test_the_reads_with_a_cpu_latency_request_are_rows_of_their_own():
    results = _results(10_000.0, 100.0)
    results["reads"]["low_latency"] = {"latency_us": 0, "queries": {
        "floor": {"reads": 9, "correct": 9, "reads_per_s": 40_000.0, "p99_ms": 0.03},
        "pk_versions": {"reads": 9, "correct": 9, "reads_per_s": 15_000.0, "p99_ms": 0.1}}}
    rows = [t for t in targets(results) if t.workload == "reads"]
    assert [(t.target.endswith("(CPU latency request 0 µs)"), t.met) for t in rows] == [
        (False, False), (False, False), (True, True), (True, None)]
    assert "15,000/s" in rows[2].measured and "`SELECT 1` 40,000/s" in rows[2].measured
    assert rows[3].measured == "not measured"  # no view read in that setting


def test_a_run_without_records_per_second_is_not_measured():
    results = _results(10_000.0, 100.0)
    results["profile"]["runs"]["ndb-mariadb"]["records_per_s"] = None
    (row,) = [t for t in targets(results) if t.workload.startswith("(b)")]
    assert (row.measured, row.met) == ("not measured", None)


def test_a_missed_target_is_marked_in_the_summary():
    table = "\n".join(markdown({"profile": _results(10_000.0, 6_200.0)["profile"]}))
    assert "| (b) user-profile job | records/s ≥ 1.0× the best RocksDB | 7,700 against " \
           "7,000 (RocksDB unaligned) = 1.10× | yes |" in table
    assert "6,200 ms against 100 ms (RocksDB unaligned) | **no** |" in table
    assert "(a)" not in table  # part 1 did not run: no row, no verdict
    assert markdown({}) == []


def test_the_models_of_what_a_view_costs_count_in_neither_row():
    """Part 6's `model_*` reads (bench.reads.model_views) are not reads users are told to
    make: a fast, correct model meets neither the primary-key row nor the views' row."""
    results = _results(10_000.0, 100.0)
    fast = {"reads": 9, "correct": 9, "reads_per_s": 50_000.0, "p99_ms": 0.05}
    results["reads"]["queries"].update(model_plain_capi=fast, model_rows_capi=fast)
    by_key, views = [t for t in targets(results) if t.workload == "reads"]
    assert by_key.met is False and "model" not in by_key.measured
    assert views.met is False and "model" not in views.measured
