"""`python -m tests.faults [--variant long|quick] [--out FILE] [--set KEY=VALUE ...]`: run
the fault runs and write the results table (`make faults`: the long variant into
tests/faults/results.md; `make faults FAULTS_ARGS="--set KEY=VALUE"`: every job with that
option too)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from . import scenarios
from .runner import VARIANTS, run_variant, write_results

ROOT = Path(__file__).resolve().parent.parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="long")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "faults" / "results.md")
    parser.add_argument("--url", default=os.environ.get("PYFLINK_NDB_TEST_MYSQL_URL",
                                                        "mysql://root@127.0.0.1:3306/test"))
    parser.add_argument("--work", type=Path, default=ROOT / "var" / "faults")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an option every job gets (repeatable), e.g. "
                        "state.backend.ndb.write.render-process=true")
    args = parser.parse_args()
    for kv in args.set:
        if "=" not in kv:
            parser.error(f"--set {kv!r}: expected KEY=VALUE")
    scenarios.EXTRA_SETS[:] = args.set
    variant = VARIANTS[args.variant]
    shutil.rmtree(args.work, ignore_errors=True)
    started = time.time()
    results = run_variant(variant, args.url, args.work)
    text = write_results(results, args.out, variant, time.time() - started)
    print(text)
    bad = [r.name for r in results
           if r.verdict is None or not r.verdict.exact or r.midrun_bad
           or any(f.recovered_s is None for f in r.faults)]
    if bad:
        print(f"NOT EXACT or not recovered: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
