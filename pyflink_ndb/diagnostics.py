"""Checks behind `pyflink-ndb doctor`: what a thread-mode job with tiered state needs."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One check: its name, whether it passed, what was found, how to fix it."""

    name: str
    ok: bool
    detail: str
    fix: str = ""


def _python() -> Check:
    ok = (3, 10) <= sys.version_info[:2] <= (3, 11)
    return Check("python", ok, f"{sys.version.split()[0]} at {sys.executable}",
                 "use Python 3.11 or 3.10 (pyflink-ndb's requires-python; apache-flink 1.20 "
                 "ships wheels up to 3.11)")


def _flink() -> Check:
    try:
        version = importlib.metadata.version("apache-flink")
    except importlib.metadata.PackageNotFoundError:
        return Check("apache-flink", False, "not installed", "pip install 'apache-flink==1.20.*'")
    return Check("apache-flink", version.startswith("1.20."), version,
                 "pip install 'apache-flink==1.20.*' (pyflink-ndb targets Flink 1.20 LTS)")


def _java() -> Check:
    java = shutil.which("java")
    if java is None:
        return Check("java", False, "no java on PATH", "install a JDK 11 or 17")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    first = (out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else "?"
    major = first.split('"')[1].split(".")[0] if '"' in first else "?"
    return Check("java", major in ("11", "17"), first, "install a JDK 11 or 17")


def _thread_mode_modules() -> Check:
    missing = [m for m in ("pemja", "find_libpython") if importlib.util.find_spec(m) is None]
    return Check("thread-mode modules", not missing,
                 "pemja and find_libpython importable" if not missing else
                 f"missing: {', '.join(missing)}",
                 "pip install 'apache-flink==1.20.*' into this interpreter")


def _path() -> Check:
    from pyflink_ndb._environment import ORIGINAL_PATH

    folder = os.path.dirname(sys.executable)
    first = ORIGINAL_PATH.split(os.pathsep)[0]
    if first == folder:
        return Check("interpreter first on PATH", True, f"PATH starts with {folder}")
    return Check("interpreter first on PATH", True,
                 f"PATH starts with {first!r}, not {folder!r}: fine for a job that imports "
                 "pyflink_ndb before it creates its environment (the import fixes PATH for "
                 "Flink's JVM); on a cluster set python.executable and python.pythonpath")


def _jar() -> Check:
    from pyflink_ndb.api.stream import BRIDGE_JAR, MISSING_JAR_FIX

    return Check("bridge jar", BRIDGE_JAR.is_file(), str(BRIDGE_JAR), MISSING_JAR_FIX)


def _store(url: str) -> Check:
    from pyflink_ndb.config import NdbStateOptions, resolve_sqlite_url
    from pyflink_ndb.errors import NdbStateError
    from pyflink_ndb.stores.factory import create_store

    try:
        where = create_store(NdbStateOptions(url=resolve_sqlite_url(url))).check_connection()
    except NdbStateError as err:
        return Check("store", False, str(err),
                     "see the message above; then run doctor --url again")
    return Check("store", True, f"answers: {where}")


def run_checks(url: str | None = None) -> list[Check]:
    """Run every check (the store only when `url` is given)."""
    checks = [_python(), _flink(), _java(), _thread_mode_modules(), _path(), _jar()]
    if url:
        checks.append(_store(url))
    return checks
