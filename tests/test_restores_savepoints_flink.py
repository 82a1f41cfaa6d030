"""Savepoints interleaved with retained checkpoints, `pyflink-ndb release` and
`gc` between restores, rescales 2 -> 3 -> 1 (real MiniCluster jobs on MariaDB; the job
and its exactness check are test_restores_across_jobs_flink's)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import cloudpickle
import pytest
from conftest import drop_namespace, unique_namespace
from test_restores_across_jobs_flink import (
    cancel,
    check,
    cli,
    committed_counts,
    finish,
    job_checkpoints,
    lines,
    one_offset,
    run_until_checkpoint,
    start,
)

pytestmark = pytest.mark.flink
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RECORDS = 2000


def snapshots(url: str, ns: str) -> list[dict[str, Any]]:
    out = cli("savepoints", "--url", url, "--namespace", ns, "--all", "--format", "json")
    assert out.exit_code == 0, out.output
    return [json.loads(x) for x in out.output.splitlines() if x.startswith("{")]


def release(url: str, ns: str, checkpoint: int, *more: str) -> Any:
    return cli("release", "--url", url, "--namespace", ns, "--operator", "count",
               "--checkpoint", str(checkpoint), *more)


def wait_lines(path: Any, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while len(lines(path)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} outputs in {path}"
        time.sleep(0.05)


def test_older_savepoint_after_release_and_gc_at_other_parallelisms(tmp_path, mysql_url):
    """A (p 2) takes savepoint S1, runs on past its retention, takes S2, is cancelled
    (retained checkpoints). B (p 3) starts from S2 and runs to the end. S2 is released
    (B ran past its first checkpoint), `pyflink-ndb gc` runs. C (p 1) restores the
    OLDER S1: exact. Restoring S2 now fails with CheckpointError. D (p 3) restores A's
    newest retained checkpoint (a side branch since B): exact."""
    ns = unique_namespace("brks")
    ckpt = tmp_path / "ckpt"
    try:
        a = start("process", 2, ns, mysql_url, tmp_path / "a.txt", records=RECORDS,
                  throttle_ms=4.0, ckpt_dir=ckpt, retained=1)
        try:
            run_until_checkpoint(a, ckpt, 2, tmp_path / "a.txt")
            s1 = a.trigger_savepoint(str(tmp_path / "sp1")).result()
            at_s1 = max(job_checkpoints(ckpt, a))
            run_until_checkpoint(a, ckpt, at_s1 + 4, tmp_path / "a.txt")
            s2 = a.trigger_savepoint(str(tmp_path / "sp2")).result()
            run_until_checkpoint(a, ckpt, max(job_checkpoints(ckpt, a)) + 2, tmp_path / "a.txt")
        except BaseException:
            cancel(a)
            raise
        cancel(a)
        (a_last, a_path), = job_checkpoints(ckpt, a).items()
        check(lines(tmp_path / "a.txt"), RECORDS, to_end=False)
        sps = sorted(s["checkpoint"] for s in snapshots(mysql_url, ns) if s["kind"] == "savepoint")
        assert len(sps) == 2, snapshots(mysql_url, ns)
        sp1_id, sp2_id = sps

        b = start("process", 3, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=1.0, ckpt_dir=ckpt, restore=s2, retained=1)
        finish(b)
        first_b = check(lines(tmp_path / "b.txt"), RECORDS)
        assert one_offset(committed_counts(mysql_url, ns), RECORDS) == RECORDS

        out = release(mysql_url, ns, sp2_id)
        assert out.exit_code == 0, out.output
        out = cli("gc", "--url", mysql_url, "--namespace", ns)
        assert out.exit_code == 0, out.output

        c = start("process", 1, ns, mysql_url, tmp_path / "c.txt", records=RECORDS,
                  throttle_ms=0.0, ckpt_dir=ckpt, restore=s1, retained=1)
        finish(c)
        first_c = check(lines(tmp_path / "c.txt"), RECORDS)
        assert first_c < first_b
        assert one_offset(committed_counts(mysql_url, ns), RECORDS) == RECORDS
        out = cli("gc", "--url", mysql_url, "--namespace", ns)
        assert out.exit_code == 0, out.output

        d = start("process", 3, ns, mysql_url, tmp_path / "d.txt", records=RECORDS,
                  throttle_ms=0.0, ckpt_dir=ckpt, restore=str(a_path), retained=1)
        finish(d)
        first_d = check(lines(tmp_path / "d.txt"), RECORDS)
        assert first_d >= first_b

        e = start("process", 2, ns, mysql_url, tmp_path / "e.txt", records=RECORDS,
                  throttle_ms=0.0, ckpt_dir=ckpt, restore=s2, retained=1)
        with pytest.raises(Exception, match="CheckpointError"):
            finish(e)
        # readers stay on D's final checkpoint after the refused restore
        assert one_offset(committed_counts(mysql_url, ns), RECORDS) == RECORDS
    finally:
        drop_namespace(mysql_url, ns)


def check_with_replays(out: list[tuple[Any, ...]], records: int) -> int:
    """As check(), but seqs replayed after a failover may repeat (each output exact)."""
    from test_restores_across_jobs_flink import expected_at

    wrong = [(o, expected_at(o[1])) for o in out if o != expected_at(o[1])]
    assert not wrong, f"{len(wrong)} wrong outputs of {len(out)}, e.g. {wrong[:3]}"
    seqs = sorted({o[1] for o in out})
    assert seqs == list(range(seqs[0], records)), (seqs[0], len(seqs))
    return seqs[0]


def test_release_around_a_running_job_that_fails_over(tmp_path, mysql_url):
    """B runs from savepoint S of A (rescaled 2 -> 3) with restarts and fails once after
    a few checkpoints. While it runs: releasing B's own retained checkpoints is refused,
    releasing A's cancelled retained checkpoints is allowed and `gc` runs, releasing S is
    allowed once readers moved past it. B must end exact, and A's savepoint S (released
    or not) must not be needed by B's failover."""
    from conftest import fixed_delay_restarts

    ns = unique_namespace("brkf")
    ckpt = tmp_path / "ckpt"
    marker = tmp_path / "failed"
    try:
        a = start("process", 2, ns, mysql_url, tmp_path / "a.txt", records=RECORDS,
                  throttle_ms=4.0, ckpt_dir=ckpt, retained=2)
        try:
            run_until_checkpoint(a, ckpt, 3, tmp_path / "a.txt")
            s = a.trigger_savepoint(str(tmp_path / "sp")).result()
            run_until_checkpoint(a, ckpt, max(job_checkpoints(ckpt, a)) + 2, tmp_path / "a.txt")
        except BaseException:
            cancel(a)
            raise
        cancel(a)
        a_retained = sorted(job_checkpoints(ckpt, a))
        sp_id = [x["checkpoint"] for x in snapshots(mysql_url, ns) if x["kind"] == "savepoint"][0]
        # A was cancelled: each output exact and once, from 0; its two subtasks' last
        # outputs may be cut at different seqs (a CI run lost 270-272 of subtask 1 in
        # flight while subtask 0's 273 was written), so no contiguous tail is required.
        from test_restores_across_jobs_flink import expected_at
        out_a = lines(tmp_path / "a.txt")
        assert [o for o in out_a if o != expected_at(o[1])] == []
        seqs_a = sorted(o[1] for o in out_a)
        assert seqs_a[0] == 0 and len(seqs_a) == len(set(seqs_a)), seqs_a[:5]

        b = start("process", 3, ns, mysql_url, tmp_path / "b.txt", records=RECORDS,
                  throttle_ms=3.0, ckpt_dir=ckpt, restore=s, retained=2,
                  extra={**fixed_delay_restarts(3, "200 ms"),
                         "state.backend.ndb.on-fresh-start": "fail"},
                  fail_marker=str(marker))  # written below
        try:
            run_until_checkpoint(b, ckpt, sp_id + 4, tmp_path / "b.txt")
            mine = sorted(job_checkpoints(ckpt, b))
            out = release(mysql_url, ns, mine[0])
            assert out.exit_code != 0, out.output  # B's own retained checkpoint
            a_job = str(a.get_job_id())
            a_listed = sorted({x["checkpoint"] for x in snapshots(mysql_url, ns)
                               if x["job"] == a_job and x["kind"] == "checkpoint"})
            assert a_listed and set(a_listed) <= set(a_retained), (a_listed, a_retained)
            for n in a_listed:
                out = release(mysql_url, ns, n, "--job", a_job)
                assert out.exit_code == 0, out.output
            out = release(mysql_url, ns, sp_id)
            assert out.exit_code == 0, out.output  # B completed checkpoints since
            out = cli("gc", "--url", mysql_url, "--namespace", ns)
            assert out.exit_code == 0, out.output
            marker.write_text("fail now")  # the next record fails the task once
            finish(b)
        except BaseException:
            b.cancel()
            raise
        assert not marker.exists(), "the failure was not injected"
        check_with_replays(lines(tmp_path / "b.txt"), RECORDS)
        from test_restores_across_jobs_flink import committed_counts, one_offset
        assert one_offset(committed_counts(mysql_url, ns), RECORDS) == RECORDS
    finally:
        drop_namespace(mysql_url, ns)
