"""`pyflink-ndb doctor` reports what a job needs, and fails on an unreachable store."""

from __future__ import annotations

from click.testing import CliRunner

from pyflink_ndb.cli import main


def test_doctor_passes_on_this_machine(mysql_url):
    result = CliRunner().invoke(main, ["doctor", "--url", mysql_url])
    assert result.exit_code == 0, result.output
    for name in ("python", "apache-flink", "java", "thread-mode modules", "bridge jar",
                 "store"):
        assert f"ok   {name}:" in result.output


def test_doctor_names_an_unreachable_store():
    result = CliRunner().invoke(main, ["doctor", "--url", "mysql://root@127.0.0.1:1/test"])
    assert result.exit_code == 1
    assert "FAIL store: Cannot reach the database at 127.0.0.1:1" in result.output


def test_query_of_a_missing_namespace_is_a_one_line_error(tmp_path):
    result = CliRunner().invoke(main, ["query", "--url", f"sqlite:///{tmp_path}/none.sqlite"])
    assert result.exit_code == 1
    assert "No SQLite store" in result.output
    assert not (tmp_path / "none.sqlite").exists()
