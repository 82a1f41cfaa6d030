"""`write.render-process` on and off, alternating, on bench part 3's checkpoint job
(`python -m bench.render_ab`, about 6 minutes; README, "Checkpoint pause").

Part 3 runs each variant once; this runs them `--rounds` times in turn (on, off, on, …)
after one Flink RocksDB run, so that a drift of the machine's speed during the runs
touches both alike. Per run: records/s, the worst second, the write seconds' ratio
(:func:`bench.run.steadiness`) and the checkpoints completed; the rows are printed as JSON
lines and the whole as a table.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import click

from bench.run import WORK, pause_job, steadiness


def one_run(variant: str, mysql_url: str, seconds: float) -> dict[str, Any]:
    """One run of the checkpoint job: `variant` "rocksdb", "on" or "off"."""
    if variant == "rocksdb":
        r = pause_job("rocksdb", None, seconds, mysql_url, 2)
    else:
        r = pause_job("ndb-mariadb", True, seconds, mysql_url, 2, None,
                      "render-process" if variant == "on" else "thread")
    even = steadiness(r)
    return {"variant": variant, "records_per_s": r["records_per_s"],
            "worst_second": r["min_second"], "write_ratio": even["write_seconds_ratio"],
            "checkpoints": len(r["checkpoints"])}


@click.command()
@click.option("--mysql-url", default="mysql://root@127.0.0.1:3306/test", show_default=True)
@click.option("--rounds", default=3, show_default=True)
@click.option("--seconds", default=40.0, show_default=True, help="Per run.")
def main(mysql_url: str, rounds: int, seconds: float) -> None:
    """Alternate `write.render-process: true` and `false` on part 3's job."""
    os.environ.setdefault("FLINK_LOG_DIR", str(WORK / "flink-log"))
    Path(os.environ["FLINK_LOG_DIR"]).mkdir(parents=True, exist_ok=True)
    runs = [one_run("rocksdb", mysql_url, seconds)]
    click.echo(json.dumps(runs[-1]))
    for _ in range(rounds):
        for variant in ("on", "off"):
            runs.append(one_run(variant, mysql_url, seconds))
            click.echo(json.dumps(runs[-1]))
    rocksdb = runs[0]["records_per_s"] or 1.0
    click.echo("| run | records/s per run | mean (× RocksDB) |\n|---|---|---:|")
    for variant in ("rocksdb", "on", "off"):
        mine = [r for r in runs if r["variant"] == variant]
        cells = "; ".join(f"{r['records_per_s'] or 0:,.0f} / {r['worst_second'] or 0:,} / "
                          + ("–" if r["write_ratio"] is None else f"{r['write_ratio']:.2f}")
                          + f" / {r['checkpoints']}" for r in mine)
        mean = statistics.mean(r["records_per_s"] or 0 for r in mine)
        click.echo(f"| {variant} | {cells} | {mean:,.0f} ({mean / rocksdb:.2f}×) |")


if __name__ == "__main__":
    main()
