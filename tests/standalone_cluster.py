"""A standalone Flink cluster of the tests' own, started from the apache-flink wheel by
`scripts/cluster.sh` in a folder and on ports of its own (so a cluster started with `make
cluster-up`, or another test file's, is left alone): the helpers `tests/test_cluster.py`,
`tests/test_cluster_restores.py` and `tests/test_cluster_breaker_local_recovery.py`
share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = [str(ROOT / "scripts" / "cluster.sh")]


class StandaloneCluster:
    """`scripts/cluster.sh` pointed at `folder`, REST `rest_port` and RPC `rpc_port`.

    :param slots: task slots per TaskManager.
    :param taskmanagers: TaskManagers to start (None: the script's default, 1).
    :param extra_conf: lines appended to the cluster's flink-conf.yaml (may be changed
        between two starts).
    :param start_timeout_s: how long the script waits for the cluster (`CLUSTER_TIMEOUT_S`).
    :param rest_timeout_s: timeout of one REST request.
    :param flink_timeout_s: default timeout of one `flink` CLI call.
    """

    def __init__(self, folder: Path, rest_port: int, rpc_port: int, slots: int, *,
                 taskmanagers: int | None = None, extra_conf: str = "",
                 start_timeout_s: int = 90, rest_timeout_s: float = 5,
                 flink_timeout_s: float = 150) -> None:
        self.folder = folder
        self.rest_port, self.rpc_port, self.slots = rest_port, rpc_port, slots
        self.taskmanagers = taskmanagers
        self.extra_conf = extra_conf
        self.start_timeout_s = start_timeout_s
        self.rest_timeout_s = rest_timeout_s
        self.flink_timeout_s = flink_timeout_s
        self.url = f"http://localhost:{rest_port}"

    def env(self) -> dict[str, str]:
        """The script's environment: this virtualenv first on PATH, the folder, ports."""
        venv_bin = str(Path(sys.executable).parent)
        env = {**os.environ, "PATH": venv_bin + os.pathsep + os.environ.get("PATH", ""),
               "VENV": str(Path(sys.executable).parent.parent),
               "CLUSTER_DIR": str(self.folder), "FLINK_REST_PORT": str(self.rest_port),
               "FLINK_RPC_PORT": str(self.rpc_port), "FLINK_TASK_SLOTS": str(self.slots),
               "CLUSTER_TIMEOUT_S": str(self.start_timeout_s)}
        if self.taskmanagers is not None:
            env["FLINK_TASKMANAGERS"] = str(self.taskmanagers)
        if self.extra_conf:
            env["FLINK_EXTRA_CONF"] = self.extra_conf
        return env

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of each non-empty log file of the cluster."""
        out = []
        for log in sorted((self.folder / "log").glob("*")):
            if log.is_file() and log.stat().st_size:
                text = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"---- {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    def script(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """`scripts/cluster.sh ARGS` (up, down, taskmanager start, flink ...)."""
        return subprocess.run(["bash", *SCRIPT, *args], env=self.env(), cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)

    def flink(self, *args: str, timeout: float | None = None
              ) -> subprocess.CompletedProcess[str]:
        """The wheel's `flink` CLI pointed at this cluster."""
        return self.script("flink", *args, timeout=timeout or self.flink_timeout_s)

    def rest(self, path: str) -> Any:
        """GET `path` of the REST API, as JSON."""
        with urllib.request.urlopen(self.url + path, timeout=self.rest_timeout_s) as resp:
            return json.load(resp)

    def job_state(self, jid: str) -> str:
        """The state of job `jid` (RUNNING, FINISHED, ...), from the REST API."""
        return str(self.rest(f"/jobs/{jid}")["state"])

    def wait_job_state(self, jid: str, wanted: set[str], timeout_s: float,
                       poll_s: float) -> str:
        """Wait until job `jid` is in one of `wanted` states; returns it (fails the test
        with the logs' tails after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            s = self.job_state(jid)
            if s in wanted:
                return s
            time.sleep(poll_s)
        pytest.fail(f"job {jid} not in {wanted} after {timeout_s}s: {self.job_state(jid)}\n"
                    f"{self.log_tail(40)}")

    @contextmanager
    def running(self, up_timeout_s: float) -> Iterator[str]:
        """Start the cluster (a leftover of an interrupted run is stopped first), yield
        its REST address, stop it in any case. A cluster that does not start fails the
        test with the tail of its logs."""
        self.script("down", timeout=90)
        try:
            try:
                up = self.script("up", timeout=up_timeout_s)
            except subprocess.TimeoutExpired:
                pytest.fail(f"scripts/cluster.sh up did not return in {up_timeout_s} s\n"
                            f"{self.log_tail()}", pytrace=False)
            if up.returncode != 0:
                pytest.fail(f"the cluster did not start:\n{up.stdout}{up.stderr}\n"
                            f"{self.log_tail()}", pytrace=False)
            yield self.url
        finally:
            self.script("down", timeout=120)
