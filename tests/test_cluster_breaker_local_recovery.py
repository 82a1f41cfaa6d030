"""Task-local recovery and the tier-2 folder sweep on a REAL standalone cluster (a
breaker's attack, 2026-12-07): TaskManagers started by scripts/cluster.sh in their own
folder and ports (var/cluster-breaker-lr, REST 48081, RPC 46123), `io.tmp.dirs` set to one
base folder that every TaskManager of the cluster shares (as on one machine by default:
/tmp), checkpoints every 300 ms, `local.recovery` on (the default).

1. The TaskManager running every subtask is SIGKILLed while a checkpoint is in flight; a
   new TaskManager is started; Flink restarts the job on it. The state at the end must be
   exact, the killed TaskManager's process folder must be gone (swept by the new
   TaskManager's first open) and the new one's live folder never touched.
2. Two TaskManagers share the base, the job's subtasks spread over both; one is killed and
   the job restarts on the survivor (no new TaskManager). The survivor keeps its claim all
   along (its failed attempts park their tiers, the next attempts claim again); when only
   a first claim swept, the killed TaskManager's folder was left on disk for as long as the
   survivor held tiers (the breaker's find; now every hold sweeps: each attempt's open).

The job is tests/test_cluster_restores.py's (count, sum) per key; its exact result is
computable.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import drop_namespace
from standalone_cluster import StandaloneCluster
from test_cluster_restores import JOB, K, committed, expected

from pyflink_ndb.tiers import folders

pytestmark = pytest.mark.flink

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_DIR = ROOT / "var" / "cluster-breaker-lr"
TMP_BASE = CLUSTER_DIR / "tmp"
TIER_ROOT = TMP_BASE / "pyflink-ndb"
CKPT_DIR = CLUSTER_DIR / "checkpoints"
N = 4000

EXTRA_CONF = "\n".join([
    f"state.checkpoints.dir: file://{CKPT_DIR}",
    f"io.tmp.dirs: {TMP_BASE}",
    "execution.checkpointing.interval: 300ms",
    "state.checkpoints.num-retained: 1",
    "heartbeat.interval: 1000",
    "heartbeat.timeout: 6000",
    "cluster.evenly-spread-out-slots: true",
    "restart-strategy.type: fixed-delay",
    "restart-strategy.fixed-delay.attempts: 30",
    "restart-strategy.fixed-delay.delay: 1s",
])

CLUSTER = StandaloneCluster(CLUSTER_DIR, rest_port=48081, rpc_port=46123, slots=2,
                            taskmanagers=1, extra_conf=EXTRA_CONF, start_timeout_s=120,
                            rest_timeout_s=10, flink_timeout_s=240)
script, flink, rest = CLUSTER.script, CLUSTER.flink, CLUSTER.rest


def log_tail(lines: int = 40) -> str:
    return CLUSTER.log_tail(lines)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    shutil.rmtree(TMP_BASE, ignore_errors=True)
    TMP_BASE.mkdir(parents=True, exist_ok=True)
    try:
        with CLUSTER.running(up_timeout_s=200) as url:
            yield url
    finally:
        for pid in tm_pids():  # a TaskManager left stopped would survive `down`
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def namespace(mysql_url: str) -> Iterator[str]:
    ns = "brklr_" + uuid.uuid4().hex[:8]
    yield ns
    drop_namespace(mysql_url, ns)


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    p = tmp_path / "breaker_job.py"
    p.write_text(JOB)
    return p


def job_args(job: Path, url: str, ns: str, sleep_ms: float, keys: int = K,
             cache: int | None = None) -> list[str]:
    conf = [f"-Dstate.backend.ndb.cache.max-entries={cache}"] if cache else []
    return [*conf, "-py", str(job), "--url", url, "--namespace", ns, "--n", str(N),
            "--keys", str(keys), "--sleep-ms", str(sleep_ms), "--parallelism", "2"]


def expected_keys(keys: int) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for i in range(N):
        c = out.setdefault(f"k{i % keys}", [0, 0])
        c[0] += 1
        c[1] += i
    return {k: (v[0], v[1]) for k, v in out.items()}


def submit_detached(*args: str) -> str:
    done = flink("run", "-d", *args)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"flink run -d failed:\n{out[-4000:]}\n{log_tail()}"
    found = re.search(r"Job has been submitted with JobID ([0-9a-f]{32})", out)
    assert found, out[-3000:]
    return found.group(1)


def state(jid: str) -> str:
    return CLUSTER.job_state(jid)


def wait_state(jid: str, wanted: set[str], timeout_s: float = 150) -> str:
    return CLUSTER.wait_job_state(jid, wanted, timeout_s, poll_s=0.3)


def counts(jid: str) -> dict:
    return dict(rest(f"/jobs/{jid}/checkpoints")["counts"])


def wait_ckpts(jid: str, n: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while int(counts(jid)["completed"]) < n:
        assert time.monotonic() < deadline, f"fewer than {n} checkpoints\n{log_tail()}"
        time.sleep(0.1)


def kill_mid_checkpoint(jid: str, pid: int, timeout_s: float = 3) -> bool:
    """SIGKILL `pid` as soon as the REST API shows a checkpoint in progress (or after
    `timeout_s` in any case); True when one was in progress."""
    deadline = time.monotonic() + timeout_s
    in_flight = False
    while time.monotonic() < deadline:
        if int(counts(jid).get("in_progress", 0)) > 0:
            in_flight = True
            break
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    return in_flight


def tm_pids() -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "TaskManagerRunner" in cmd and str(CLUSTER_DIR / "conf") in cmd:
            out.append(int(d.name))
    return sorted(out)


def start_tm() -> int:
    before = set(tm_pids())
    done = script("taskmanager", "start", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    deadline = time.monotonic() + 30
    while True:
        new = set(tm_pids()) - before
        if new:
            return new.pop()
        assert time.monotonic() < deadline, "no new TaskManager process"
        time.sleep(0.3)


def wait_tms(n: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while rest("/overview")["taskmanagers"] != n:
        assert time.monotonic() < deadline, (rest("/overview"), log_tail())
        time.sleep(0.5)


def folders_of(pid: int) -> list[str]:
    if not TIER_ROOT.is_dir():
        return []
    return sorted(n for n in os.listdir(TIER_ROOT) if n.startswith(f"p{pid}-"))


def wait_folder(pid: int, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        found = folders_of(pid)
        if found:
            return found[0]
        listing = os.listdir(TIER_ROOT) if TIER_ROOT.is_dir() else None
        assert time.monotonic() < deadline, f"no tier folder of {pid}: {listing}"
        time.sleep(0.1)


class Watch:
    """Polls the tier root: records every moment a folder in `live` shows up renamed by a
    sweep (`.deleting-<name>`). (Its own process deletes it when its last tier goes: not a
    fault.)"""

    def __init__(self, jid: str) -> None:
        self.jid = jid
        self.live: set[str] = set()
        self.missing: list[tuple[float, str, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                names = os.listdir(TIER_ROOT)
            except FileNotFoundError:
                names = []
            # swept by another process: renamed to .deleting-<name>
            swept = [n for n in self.live if folders.DELETING + n in names]
            if swept:
                self.missing.append((time.monotonic(), swept, sorted(names)))
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def sweep_lines() -> list[str]:
    out = []
    for log in (CLUSTER_DIR / "log").glob("*taskexecutor*"):
        for line in log.read_text(errors="replace").splitlines():
            if "tier-2 folder" in line:
                out.append(f"{log.name}: {line.strip()[-300:]}")
    return out


def tm_running_tasks(jid: str) -> set[str]:
    tms = set()
    for v in rest(f"/jobs/{jid}")["vertices"]:
        for tm in rest(f"/jobs/{jid}/vertices/{v['id']}/taskmanagers")["taskmanagers"]:
            if tm.get("status") == "RUNNING":
                tms.add(tm.get("taskmanager-id") or tm.get("resource-id") or "")
    return tms


def test_kill_tm_mid_checkpoint_new_tm_sweeps_its_folder_and_state_is_exact(
        cluster, mysql_url, namespace, job_file):
    wait_tms(1)
    [old] = tm_pids()
    jid = submit_detached(*job_args(job_file, mysql_url, namespace, sleep_ms=6))
    wait_state(jid, {"RUNNING"}, 120)
    wait_ckpts(jid, 3)
    old_folder = wait_folder(old)
    in_flight = kill_mid_checkpoint(jid, old)
    time.sleep(0.5)
    assert (TIER_ROOT / old_folder).is_dir(), "the killed TaskManager's folder is gone already?"
    new = start_tm()
    watch = Watch(jid)
    try:
        new_folder = wait_folder(new, 90)
        watch.live.add(new_folder)
        final = wait_state(jid, {"FINISHED", "FAILED", "CANCELED"}, 150)
    finally:
        watch.stop()
    print("killed mid-checkpoint:", in_flight, "old", old_folder, "new", new_folder,
          "sweeps:", sweep_lines(), file=sys.stderr)
    assert final == "FINISHED", log_tail()
    got = committed(mysql_url, namespace)
    assert got == expected(N), f"{got} != {expected(N)}"
    assert not watch.missing, f"the live TaskManager's folder went away while running: " \
                              f"{watch.missing[:3]}"
    deadline = time.monotonic() + 10
    while (TIER_ROOT / old_folder).exists() or (TIER_ROOT / (".deleting-" + old_folder)).exists():
        assert time.monotonic() < deadline, (
            f"the killed TaskManager's tier folder {old_folder} is still on disk: "
            f"{os.listdir(TIER_ROOT)}; sweeps {sweep_lines()}")
        time.sleep(0.2)


def test_kill_one_of_two_tms_sharing_the_base_survivor_leaves_its_folder(
        cluster, mysql_url, namespace, job_file):
    """The job's two subtasks on two TaskManagers (evenly spread) that share the base; the
    one TaskManager is killed; no new TaskManager: Flink restarts both subtasks on the
    survivor's two slots. The killed folder should be swept by a process that opens tier 2
    under the base after the kill (the survivor's next attempts do); it is not."""
    while len(tm_pids()) < 2:
        start_tm()
    wait_tms(2)
    jid = submit_detached(*job_args(job_file, mysql_url, namespace, sleep_ms=15))
    wait_state(jid, {"RUNNING"}, 120)
    wait_ckpts(jid, 3)
    pids = tm_pids()
    with_folders = [p for p in pids if folders_of(p)]
    deadline = time.monotonic() + 30
    while len(with_folders) < 2:
        assert time.monotonic() < deadline, (
            f"subtasks not spread over both TaskManagers: {pids} "
            f"{os.listdir(TIER_ROOT)} {tm_running_tasks(jid)}")
        time.sleep(0.2)
        with_folders = [p for p in pids if folders_of(p)]
    victim, survivor = with_folders[0], with_folders[1]
    victim_folder = folders_of(victim)[0]
    survivor_folder = folders_of(survivor)[0]
    in_flight = kill_mid_checkpoint(jid, victim)
    print("killed", victim, "mid-checkpoint", in_flight, "job", state(jid), file=sys.stderr)
    watch = Watch(jid)
    watch.live.add(survivor_folder)
    try:
        # the restart on the survivor: the job runs again past new checkpoints
        time.sleep(2)
        before = int(counts(jid)["completed"])
        deadline = time.monotonic() + 90
        while int(counts(jid)["completed"]) < before + 3 and state(jid) == "RUNNING":
            assert time.monotonic() < deadline, log_tail()
            time.sleep(0.3)
        still_running = state(jid) == "RUNNING"
        left_while_running = (TIER_ROOT / victim_folder).exists()
        listing = sorted(os.listdir(TIER_ROOT))
        final = wait_state(jid, {"FINISHED", "FAILED", "CANCELED"}, 150)
    finally:
        watch.stop()
    print("victim", victim_folder, "survivor", survivor_folder, "running", still_running,
          "listing", listing, "after", sorted(os.listdir(TIER_ROOT)), "sweeps",
          sweep_lines(), file=sys.stderr)
    assert final == "FINISHED", log_tail()
    assert committed(mysql_url, namespace) == expected(N)
    assert not watch.missing, f"the survivor's live folder went away: {watch.missing[:3]}"
    time.sleep(2)
    after = sorted(os.listdir(TIER_ROOT))
    assert not left_while_running and victim_folder not in after, (
        f"the killed TaskManager's tier folder {victim_folder} stayed on disk after the "
        f"survivor (pid {survivor}) opened the restarted subtasks under the same base "
        f"(listing while the restarted job ran: {listing}; after the job finished: "
        f"{after}; sweep log lines: {sweep_lines()})")


def took_over_lines() -> list[str]:
    out = []
    for log in (CLUSTER_DIR / "log").glob("*taskexecutor*"):
        for line in log.read_text(errors="replace").splitlines():
            if "took over the failed attempt" in line or "does not track" in line:
                out.append(line.strip()[-220:])
    return out


def test_one_tm_paused_past_the_heartbeat_and_resumed_three_times_state_exact(
        cluster, mysql_url, namespace, job_file):
    """One TaskManager, paused (SIGSTOP) past the heartbeat timeout while a checkpoint is
    in flight, then resumed with no other TaskManager: Flink redeploys the next attempts
    on the same process, where the superseded attempts (zombies) may still run, park their
    tiers, and be taken over (task-local recovery in the zombie's own process). Three
    times. The state must be exact."""
    for extra in tm_pids()[1:]:
        os.kill(extra, signal.SIGKILL)
    wait_tms(1)
    [tm] = tm_pids()
    # 600 keys, 30 cached entries a subtask: most state lives in tier 2 (RocksDB), which
    # the next attempt takes over
    jid = submit_detached(*job_args(job_file, mysql_url, namespace, sleep_ms=12, keys=600,
                                    cache=30))
    wait_state(jid, {"RUNNING"}, 120)
    cycles = 0
    for _ in range(3):
        n = int(counts(jid)["completed"])
        wait_ckpts(jid, n + 2)
        if state(jid) != "RUNNING":
            break
        deadline = time.monotonic() + 3
        while int(counts(jid).get("in_progress", 0)) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(tm, signal.SIGSTOP)
        try:
            time.sleep(9)  # heartbeat.timeout 6 s
        finally:
            os.kill(tm, signal.SIGCONT)
        cycles += 1
        deadline = time.monotonic() + 60
        # running again (or its bounded input ran out meanwhile: a slow machine)
        while not (state(jid) in ("FINISHED", "FAILED", "CANCELED") or (
                state(jid) == "RUNNING" and all(
                    v["status"] in ("RUNNING", "FINISHED")
                    for v in rest(f"/jobs/{jid}")["vertices"]))):
            assert time.monotonic() < deadline, log_tail()
            time.sleep(0.3)
    final = wait_state(jid, {"FINISHED", "FAILED", "CANCELED"}, 150)
    print("cycles", cycles, "restarts", rest(f"/jobs/{jid}").get("status-counts"),
          "took over:", took_over_lines()[-6:], file=sys.stderr)
    assert final == "FINISHED", log_tail()
    assert cycles >= 1, "the job ended before its TaskManager was paused"
    got = committed(mysql_url, namespace)
    want = expected_keys(600)
    wrong = {k: (got.get(k), v) for k, v in want.items() if got.get(k) != v}
    assert not wrong and len(got) == len(want), (
        f"{len(wrong)} keys wrong (got, want): {sorted(wrong.items())[:10]}")
