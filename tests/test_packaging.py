"""The wheel as a user gets it: built from a clean copy of the repository it carries the
bridge jar; installed into a fresh virtualenv outside the repository it runs the README's
job example; without a JDK the build stops with a message naming what to install.

Nothing is downloaded: the wheel is built without build isolation in this interpreter (it
has the build requirements), and the fresh virtualenv sees the dependencies of this one
through a `.pth` file that is written only after the wheel is installed, so that
`pyflink_ndb` itself can come only from the wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parent.parent
JAR = "pyflink_ndb/jars/pyflink-ndb-bridge.jar"


def clean_copy(dest: Path) -> Path:
    """The repository's files as a fresh clone plus the uncommitted work would have them:
    tracked and untracked files that git does not ignore (no .venv, var/, build/, jar)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the work tree is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def build_wheel(source: Path, out: Path, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300, cwd=out.parent, env=env)


def child_env(venv: Path | None = None) -> dict[str, str]:
    """The environment of a child process: no PYTHONPATH, the virtualenv first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    source = clean_copy(root / "src")
    assert not (source / JAR).exists() and not (source / ".venv").exists()
    dist = root / "dist"
    dist.mkdir()
    built = build_wheel(source, dist)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (path,) = dist.glob("pyflink_ndb-*-py3-none-any.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with the wheel installed and this interpreter's dependencies."""
    path = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   timeout=120)
    python = path / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=300, cwd=path.parent, env=child_env())
    assert installed.returncode == 0, installed.stderr[-3000:]
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site.stdout.strip()) / "_test_dependencies.pth").write_text(
        "".join(f"{p}\n" for p in sorted(deps)))
    yield path


def test_the_wheel_carries_the_bridge_jar_and_only_the_package(wheel: Path):
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        assert JAR in names
        jar_path = wheel.parent / "bridge.jar"
        jar_path.write_bytes(whl.read(JAR))
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    with zipfile.ZipFile(jar_path) as jar:
        classes = set(jar.namelist())
    for cls in ("NdbKeyedProcessOperator", "NdbKeyedCoProcessOperator", "StateBackendHooks"):
        assert f"io/pyflinkndb/bridge/{cls}.class" in classes
    assert "pyflink_ndb/py.typed" in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "jobs", "bench", "java-bridge")]
    assert "Requires-Dist: apache-flink==1.20.*" in metadata
    pyproject = (REPO / "pyproject.toml").read_text()
    build_system = pyproject[pyproject.index("[build-system]"):pyproject.index("[project]")]
    assert re.search(r'^requires = \[.*"apache-flink==1\.20\.\*"', build_system, re.M)
    declared = re.search(r'^requires-python = "([^"]+)"', pyproject, re.M)
    shipped = re.search(r"^Requires-Python: (.+)$", metadata, re.M)
    assert declared and shipped
    assert SpecifierSet(shipped.group(1)) == SpecifierSet(declared.group(1))


def test_a_build_without_a_jdk_names_what_to_install(tmp_path: Path):
    source = clean_copy(tmp_path / "src")
    (tmp_path / "dist").mkdir()
    (tmp_path / "bin").mkdir()  # a PATH without javac and jar
    env = {k: v for k, v in child_env().items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path / "bin")
    built = build_wheel(source, tmp_path / "dist", env=env)
    output = built.stdout + built.stderr
    assert built.returncode != 0
    assert "needs javac and jar" in output and "install a JDK 11 or newer" in output, output
    assert "openjdk-17-jdk-headless" in output
    assert not list((tmp_path / "dist").glob("*.whl"))


def test_the_missing_jar_error_names_the_fix_for_a_wheel_and_a_checkout(monkeypatch, tmp_path):
    from pyflink_ndb.api import stream
    from pyflink_ndb.errors import ConfigurationError

    monkeypatch.setattr(stream, "BRIDGE_JAR", tmp_path / "absent.jar")
    with pytest.raises(ConfigurationError) as info:
        stream.bridge_jar()
    message = str(info.value)
    assert str(tmp_path / "absent.jar") in message
    assert "pip install --force-reinstall --no-deps pyflink_ndb-" in message
    assert "make jar" in message


def readme_job() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Use it in a job")
    block = readme.index("```python\n", start) + len("```python\n")
    return readme[block:readme.index("```", block)]


@pytest.mark.flink
def test_the_installed_wheel_runs_the_readme_job_outside_the_repository(
        venv: Path, tmp_path: Path, mysql_url: str):
    from conftest import drop_namespace

    python = str(venv / "bin" / "python")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    where = subprocess.run(
        [python, "-c", "import pyflink_ndb, importlib.metadata as m; "
         "from pyflink_ndb.api.stream import bridge_jar; "
         "print(pyflink_ndb.__file__); print(bridge_jar()); print(m.version('pyflink-ndb'))"],
        capture_output=True, text=True, timeout=120, cwd=run_dir, env=child_env(venv))
    assert where.returncode == 0, where.stderr[-2000:]
    module, jar, version = where.stdout.split()
    assert Path(module).is_relative_to(venv) and Path(jar).is_relative_to(venv), where.stdout
    assert not Path(module).is_relative_to(REPO)
    import pyflink_ndb

    assert version == pyflink_ndb.__version__

    namespace = "wheel_" + uuid.uuid4().hex[:8]
    code = readme_job()
    assert '"mysql://root@127.0.0.1:3306/test"' in code and '"counts"' in code
    code = code.replace('"mysql://root@127.0.0.1:3306/test"', repr(mysql_url))
    code = code.replace('"counts"', repr(namespace))
    (run_dir / "job.py").write_text(code)
    try:
        job = subprocess.run([python, "job.py"], capture_output=True, text=True, timeout=300,
                             cwd=run_dir, env=child_env(venv))
        assert job.returncode == 0, job.stderr[-3000:]
        assert "[('a', 1), ('a', 2), ('b', 1)]" in job.stdout
    finally:
        drop_namespace(mysql_url, namespace)
