"""What the background writer costs the stream: an experiment, not a configuration
(`python -m bench.writer_bound`, about 15 minutes with the defaults; README, "Checkpoint
pause", and docs/protocol.md, "The writer's share of the interpreter").

In thread mode the background writer renders, writes and collects garbage in the
TaskManager's one interpreter, so its Python work competes with the task threads for the
GIL. This measures how much: part 3's checkpoint job and part 7's user-profile job run
alternately on pyflink-ndb MariaDB

* as released;
* with `write.render-process: true` (the child renders, the writer executes);
* with `write.process: true` (the child renders and executes the statements; the writer
  collects the rows, writes the snapshot row and collects garbage);
* "hand-over only": a copy of the package whose writer only does what a writer process
  would leave in the TaskManager's interpreter — the frozen epoch's entries as flat
  tuples, pickled and written to a pipe that a child process drains — and then writes
  the snapshot row (no rows, no garbage collection);
* "none": a copy whose writer skips its work altogether (only the snapshot row, so that
  checkpoints still complete).

**The two patched variants keep nothing durable**: they give the ceiling that moving the
writer's work off the interpreter could reach, never a setting. Each copy is made in a
temporary folder and put first on `PYTHONPATH` of that run's process (the MiniCluster's
JVM and its embedded interpreter inherit it); the checkout is not touched. A run checks
which package it used: `checkpoint N durable` log lines exist only when epochs are
written.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).resolve().parent.parent

_WRITE_EPOCH_HEAD = ("        version = version_of(self.branch, checkpoint_id)\n"
                     "        started = time.perf_counter()\n")
_GC_JOB_HEAD = "    def _gc_job(self, fence: Fence) -> None:\n"
_NO_GC = (_GC_JOB_HEAD + "        self._gc_queued = False\n"
          "        return  # bench/writer_bound.py: no garbage collection\n")
#: Per patched variant: (text in pyflink_ndb/checkpoint/protocol.py, its replacement).
PATCHES: dict[str, tuple[tuple[str, str], ...]] = {
    # Nothing of the epoch is written: only the snapshot row, so checkpoints complete.
    "none": (
        (_WRITE_EPOCH_HEAD, _WRITE_EPOCH_HEAD
         + "        self.wstore.insert_snapshot(fence, checkpoint_id, kind, self.scope.job_id)\n"
           "        return 0  # bench/writer_bound.py: nothing of the epoch is written\n"),
        (_GC_JOB_HEAD, _NO_GC)),
    # What a writer process would leave in the TaskManager's interpreter: the frozen
    # epoch's entries (those evicted to tier 2 read from its RocksDB snapshot) as flat
    # tuples, pickled and written to a pipe that a child process drains; nothing else.
    "handover": (
        (_WRITE_EPOCH_HEAD, _WRITE_EPOCH_HEAD
         + "        from bench_handover import hand_over\n"
           "        hand_over(frozen)\n"
           "        self.wstore.insert_snapshot(fence, checkpoint_id, kind, self.scope.job_id)\n"
           "        return 0  # bench/writer_bound.py: handed over, not written\n"),
        (_GC_JOB_HEAD, _NO_GC)),
}

#: The module the "handover" copy imports (put next to the patched package).
HANDOVER_MODULE = """
import pickle, subprocess, threading
from pyflink_ndb.tiers.local import LocalTier, unpack

_lock = threading.Lock()
_child = []


def _pipe():
    with _lock:
        if not _child:
            _child.append(subprocess.Popen(["cat"], stdin=subprocess.PIPE,
                                           stdout=subprocess.DEVNULL))
        return _child[0].stdin


def hand_over(frozen):
    view = frozen.local_view
    flat = []
    for (state_id, ukey), entry in frozen.entries.items():
        if entry is None:
            value, key_group, expires = unpack(view[LocalTier.key_of(state_id, ukey)])
        else:
            value, key_group, expires = entry.value, entry.key_group, entry.expires_at_ms
        flat.append((state_id, ukey, value, key_group, expires))
    pipe = _pipe()
    pipe.write(pickle.dumps(flat, protocol=5))
    pipe.flush()
"""

_PAUSE = """
import json, statistics, sys
sys.path.insert(0, {root!r})
from bench.run import pause_job, steadiness
r = pause_job("ndb-mariadb", True, {seconds}, {url!r}, 2, None, {writer!r})
e = steadiness(r)
print("RESULT", json.dumps({{"records_per_s": r["records_per_s"], "cv": e["cv"],
    "write_ratio": e["write_seconds_ratio"], "checkpoints": len(r["checkpoints"]),
    "durable_lines": len(r.get("durable") or []),
    "e2e_ms": statistics.median(c["end_to_end_ms"] for c in r["checkpoints"])
              if r["checkpoints"] else None}}))
"""


def patched_copy(folder: Path, variant: str) -> Path:
    """A copy of the package in `folder` with the :data:`PATCHES` of `variant` applied
    (and, for "handover", :data:`HANDOVER_MODULE` beside it); returns `folder`.

    :raises click.ClickException: a patch no longer matches the source (update it)."""
    target = folder / "pyflink_ndb"
    shutil.copytree(ROOT / "pyflink_ndb", target,
                    ignore=shutil.ignore_patterns("__pycache__"))
    if variant == "handover":
        (folder / "bench_handover.py").write_text(HANDOVER_MODULE)
    protocol = target / "checkpoint" / "protocol.py"
    text = protocol.read_text()
    for old, new in PATCHES[variant]:
        if text.count(old) != 1:
            raise click.ClickException(f"bench/writer_bound.py: a patch no longer matches "
                                       f"pyflink_ndb/checkpoint/protocol.py: {old!r}")
        text = text.replace(old, new)
    protocol.write_text(text)
    return folder


#: The variants: (key, label).
VARIANTS = (("released", "`write.process: false`: the background thread (the default before "
                         "2026-12-05)"),
            ("render-process", "`write.render-process: true`"),
            ("process", "`write.process: true`"),
            ("handover", "hand-over only (experiment: nothing durable)"),
            ("none", "none (experiment: nothing durable)"))


def one_run(job: str, variant: str, copies: dict[str, Path], url: str, seconds: float
            ) -> dict[str, Any]:
    """One run of `job` ("pause": part 3's checkpoint job, "profile": part 7's job) in a
    process of its own: `variant` a key of :data:`VARIANTS` (a patched one: its copy of
    `copies` first on `PYTHONPATH`)."""
    patched = variant in PATCHES
    writer = variant if variant in ("render-process", "process") else "thread"
    from bench.run import WORK

    logs = Path(os.environ.get("FLINK_LOG_DIR", str(WORK / "flink-log")))
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "FLINK_LOG_DIR": str(logs)}
    # The patched copy first, then the checkout (bench and jobs), then what was set.
    path = ([str(copies[variant])] if patched else []) + [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [env.get("PYTHONPATH")] if p])
    if job == "pause":
        code = _PAUSE.format(root=str(ROOT), seconds=seconds, url=url,
                             writer=writer)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, cwd=ROOT)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        if not lines:
            raise click.ClickException(f"checkpoint job failed:\n{out.stderr[-3000:]}")
        got = json.loads(lines[-1][len("RESULT "):])
        _check_package(got, patched)
        return got
    work = Path(tempfile.mkdtemp(prefix="writer-bound-profile-"))
    try:
        backend = {"render-process": "ndb-mariadb-render", "process": "ndb-mariadb",
                   "thread": "ndb-mariadb-thread"}[writer]
        out = subprocess.run([sys.executable, "-m", "bench.profile", backend,
                              "--duration", str(seconds), "--mysql-url", url,
                              "--work", str(work / "w")],
                             capture_output=True, text=True, env=env, cwd=ROOT)
        results = work / "w" / "profile" / "results.json"
        if out.returncode != 0 or not results.exists():
            raise click.ClickException(f"profile job failed:\n{out.stderr[-3000:]}")
        run = json.loads(results.read_text())["runs"][backend]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if "error" in run:
        raise click.ClickException(f"profile job failed: {run['error']}")
    got = {"records_per_s": run["records_per_s"], "checkpoints": len(run["checkpoints"]),
           "durable_lines": len(run.get("durable") or []), "e2e_ms": run.get("e2e_median_ms")}
    _check_package(got, patched)
    return got


def _check_package(got: dict[str, Any], patched: bool) -> None:
    """:raises click.ClickException: the run's writer wrote epochs although it ran a
        patched copy, or the reverse."""
    if bool(got["durable_lines"]) == patched:
        raise click.ClickException(
            f"the run used the wrong package: {got['durable_lines']} `durable` log lines "
            f"with patched={patched}")


@click.command()
@click.option("--mysql-url", default="mysql://root@127.0.0.1:3306/test", show_default=True)
@click.option("--rounds", default=2, show_default=True)
@click.option("--seconds", default=40.0, show_default=True, help="Per run.")
@click.option("--job", "jobs", multiple=True, type=click.Choice(["pause", "profile"]),
              default=("pause", "profile"), show_default=True)
@click.option("--variant", "variants", multiple=True,
              type=click.Choice([v for v, _ in VARIANTS]), help="Default: all.")
def main(mysql_url: str, rounds: int, seconds: float, jobs: tuple[str, ...],
         variants: tuple[str, ...]) -> None:
    """Alternate the :data:`VARIANTS` (or those named) of each job; print JSON lines,
    then medians."""
    folder = Path(tempfile.mkdtemp(prefix="writer-bound-"))
    try:
        chosen = [(v, label) for v, label in VARIANTS if not variants or v in variants]
        copies = {v: patched_copy(folder / v, v) for v, _ in chosen if v in PATCHES}
        rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(rounds):
            for job in jobs:
                for variant, _label in chosen:
                    got = one_run(job, variant, copies, mysql_url, seconds)
                    rows.setdefault((job, variant), []).append(got)
                    click.echo(json.dumps({"job": job, "variant": variant, **got}))
        labels = dict(VARIANTS)
        click.echo("\n| job | writer | records/s (runs) | median | checkpoints |")
        click.echo("|---|---|---|---:|---|")
        for (job, variant), got in rows.items():
            rates = [g["records_per_s"] for g in got]
            click.echo(f"| {job} | {labels[variant]} | "
                       f"{', '.join(f'{r:,.0f}' for r in rates)} | "
                       f"{statistics.median(rates):,.0f} | "
                       f"{', '.join(str(g['checkpoints']) for g in got)} |")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
