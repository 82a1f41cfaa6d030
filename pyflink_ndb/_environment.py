"""Make thread mode find this interpreter's packages.

PyFlink's JVM (started by the client when the first execution environment is created)
resolves the Python of thread mode through `PATH`; when the virtualenv's `bin/` is not
first there, the embedded interpreter starts without the virtualenv's packages and every
task dies with `No module named 'pemja'`, restart after restart. Importing pyflink_ndb puts
the running interpreter's folder first on `PATH`, before the JVM starts.
"""

from __future__ import annotations

import os
import sys

#: `PATH` as it was before :func:`put_interpreter_first_on_path` (for `doctor`).
ORIGINAL_PATH = os.environ.get("PATH", "")


def put_interpreter_first_on_path() -> bool:
    """Prepend the folder of `sys.executable` to `PATH`; True when `PATH` changed."""
    folder = os.path.dirname(sys.executable)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts and parts[0] == folder:
        return False
    os.environ["PATH"] = os.pathsep.join([folder, *[p for p in parts if p != folder]])
    return True
