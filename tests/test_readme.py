"""The README stays true: its job example (an unchanged PyFlink job switched to tiered
state by configuration) runs as described, and its configuration table lists every option
with its default."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from pyflink_ndb.config import OPTIONS, PREFIX

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def readme_job() -> str:
    start = README.index("## Use it in a job")
    block = README.index("```python\n", start) + len("```python\n")
    return README[block:README.index("```", block)]


@pytest.mark.flink
def test_the_job_example_runs_as_the_readme_says(tmp_path, mysql_url):
    from conftest import drop_namespace

    namespace = "readme_" + uuid.uuid4().hex[:8]
    code = readme_job()
    assert '"mysql://root@127.0.0.1:3306/test"' in code and '"counts"' in code
    code = code.replace('"mysql://root@127.0.0.1:3306/test"', repr(mysql_url))
    code = code.replace('"counts"', repr(namespace))
    job = tmp_path / "job.py"

    def run(source: str) -> subprocess.CompletedProcess[str]:
        job.write_text(source)
        return subprocess.run([sys.executable, str(job)], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)

    try:
        first = run(code)
        assert first.returncode == 0, first.stderr[-2000:]
        assert "[('a', 1), ('a', 2), ('b', 1)]" in first.stdout
        second = run(code)
        assert second.returncode != 0
        assert "NamespaceInUseError" in second.stderr and "on-fresh-start" in second.stderr
        namespace_line = f'config.set_string("state.backend.ndb.namespace", {namespace!r})\n'
        assert namespace_line in code
        resumed = run(code.replace(namespace_line, namespace_line + 'config.set_string('
                                   '"state.backend.ndb.on-fresh-start", "resume")\n'))
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert "[('a', 3), ('a', 4), ('b', 2)]" in resumed.stdout
    finally:
        drop_namespace(mysql_url, namespace)


def test_the_configuration_table_lists_every_option_with_its_default():
    for spec in OPTIONS:
        value = str(spec.default).lower() if isinstance(spec.default, bool) else spec.default
        default = "(none)" if spec.default is None else f"`{value}`"
        assert f"| `{PREFIX}{spec.key}` | {default} |" in README, spec.key
