"""Build step of the wheel: compile the Java bridge into `pyflink_ndb/jars/`.

Everything else about the package is declared in pyproject.toml; this file only adds a
`build_py` that runs `java-bridge/build.sh` (javac --release 11 against the jars of the
`apache-flink` wheel of the build environment, which `[build-system] requires`), so that
`pip wheel .` / `python -m build` give a wheel that carries
`pyflink_ndb/jars/pyflink-ndb-bridge.jar`.

* A regular build (wheel, `pip install .`) fails when no JDK is found (`javac` and `jar`
  on PATH or in `$JAVA_HOME/bin`), with a message naming what to install.
* An editable install (`pip install -e .`, what `make venv` runs) builds the jar into the
  source tree, as `make jar` does, when it is missing or older than the Java sources; with
  no JDK it only warns: the checkout then says `make jar` when a job needs the jar.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.errors import ExecError

ROOT = Path(__file__).resolve().parent
BUILD_SCRIPT = ROOT / "java-bridge" / "build.sh"
SOURCES = ROOT / "java-bridge" / "src"
JAR_IN_PACKAGE = Path("pyflink_ndb") / "jars" / "pyflink-ndb-bridge.jar"
JDK_HINT = ("install a JDK 11 or newer (Debian/Ubuntu: `apt-get install "
            "openjdk-17-jdk-headless`; or set JAVA_HOME to a JDK)")


class BridgeBuildError(ExecError):
    """The Java bridge cannot be built (setuptools prints the message without a traceback)."""


class JdkMissingError(BridgeBuildError):
    """No `javac`/`jar` to build the Java bridge with."""


def _jdk_path() -> str:
    """PATH with `$JAVA_HOME/bin` first when that holds javac.

    :raises JdkMissingError: neither PATH nor JAVA_HOME has both `javac` and `jar`.
    """
    path = os.environ.get("PATH", os.defpath)
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "javac").is_file():
        path = str(Path(java_home) / "bin") + os.pathsep + path
    missing = [tool for tool in ("javac", "jar") if shutil.which(tool, path=path) is None]
    if missing:
        raise JdkMissingError(
            f"pyflink-ndb: building the Java bridge ({JAR_IN_PACKAGE}) needs "
            f"{' and '.join(missing)}, on neither PATH nor $JAVA_HOME/bin: "
            f"{JDK_HINT}, then build again.")
    return path


def _stale(jar: Path) -> bool:
    """True when `jar` is missing or older than a Java source or the build script."""
    if not jar.is_file():
        return True
    built = jar.stat().st_mtime
    inputs = [BUILD_SCRIPT, *SOURCES.rglob("*.java")]
    return any(p.stat().st_mtime > built for p in inputs)


def build_bridge(out: Path) -> None:
    """Compile the bridge into `out` with java-bridge/build.sh and this interpreter
    (whose environment must have `apache-flink`).

    :raises JdkMissingError: no JDK (see :func:`_jdk_path`).
    :raises BridgeBuildError: the Java sources are missing or build.sh failed (its output is
        on stderr).
    """
    if not BUILD_SCRIPT.is_file():
        raise BridgeBuildError(f"pyflink-ndb: {BUILD_SCRIPT} is missing: build from a git "
                           "clone or from the sdist, which carry java-bridge/.")
    env = {**os.environ, "PATH": _jdk_path()}
    result = subprocess.run(["bash", str(BUILD_SCRIPT), sys.executable, str(out)], env=env,
                            check=False)
    if result.returncode != 0:
        raise BridgeBuildError(
            f"pyflink-ndb: java-bridge/build.sh failed (exit {result.returncode}; its "
            "message is above). It needs a JDK 11 or newer and apache-flink 1.20 in the "
            "build environment ([build-system] requires of pyproject.toml).")


class BuildPyWithBridge(build_py):
    """`build_py` plus the bridge jar (see the module docstring)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            jar = ROOT / JAR_IN_PACKAGE
            if not _stale(jar):
                return
            try:
                build_bridge(jar)
            except JdkMissingError as err:
                self.warn(f"{err} Until then jobs fail asking for `make jar`.")
            return
        build_bridge(Path(self.build_lib) / JAR_IN_PACKAGE)


if __name__ == "__main__":  # setuptools' PEP 517 backend runs this file as __main__
    setup(cmdclass={"build_py": BuildPyWithBridge})
