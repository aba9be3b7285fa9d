"""What a job start costs: `adattr run --available-now` over a few hundred new records, again and
again, from two checkouts alternating (A and B: the job's code before and after a change), on
one broker, topic, checkpoint and warehouse. Per run: the process's wall time (a JVM's start,
the job's own start, its batches, its stop) and each batch's sink phases from its log line.

    .venv/bin/python infra/bench/job_start.py --checkouts A=/work/main,B=/tmp/wt --order ABBAABBA

Run it alone (nothing else on the machine): its figures are seconds of a 2-core machine's CPU.
Each checkout needs the same jars (`infra/.jars`) and a virtual environment; this one's runs
both.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from app.runtime.settings import Settings
from app.tools.drills import Stack, chunks_of

_BATCH = re.compile(r"batch (\d+): .*\| (.*) \(")
_STEP = re.compile(r"(\S+)=([0-9.]+)s")


def _phases(log: str) -> list[dict[str, float]]:
    """Each batch's sink phases (seconds), in the order the log has them."""
    return [{k: float(v) for k, v in _STEP.findall(m.group(2))} for m in _BATCH.finditer(log)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkouts", required=True, help="LABEL=PATH,LABEL=PATH")
    parser.add_argument("--order", default="ABBAABBA", help="labels, one run each, in order")
    parser.add_argument("--records", type=int, default=500, help="new records per run")
    args = parser.parse_args()
    pairs = (p.split("=", 1) for p in args.checkouts.split(","))
    checkouts = {k: Path(v).resolve() for k, v in pairs}
    unknown = set(args.order) - set(checkouts)
    if unknown:
        parser.error(f"labels {sorted(unknown)} in --order have no checkout")
    runs = len(args.order)
    s = Stack(Settings.from_env({}), "job-start", events=args.records * runs, seed=5, batch=5000)
    s.up()
    try:
        traffic = s.plan()
        s.load_dim(traffic)
        records = list(traffic.main)
        per_run = chunks_of(records, runs)
        print(f"job-start: {runs} runs, ~{len(per_run[0]):,} new records each; {s.dir}")
        walls: dict[str, list[float]] = {k: [] for k in checkouts}
        firsts: dict[str, list[dict[str, float]]] = {k: [] for k in checkouts}
        for i, label in enumerate(args.order):
            s.produce(per_run[min(i, len(per_run) - 1)])
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "app.cli", "run", "--available-now"],
                cwd=checkouts[label],
                env={**s.env, "PYTHONPATH": str(checkouts[label])},
                capture_output=True,
                text=True,
                timeout=900,
            )
            wall = time.monotonic() - started
            log = done.stdout + done.stderr
            (s.dir / f"run-{i + 1:02d}-{label}.log").write_text(log)
            if done.returncode != 0:
                print(log[-3000:])
                return 1
            batches = _phases(log)
            walls[label].append(wall)
            if batches:
                firsts[label].append(batches[0])
            first = batches[0] if batches else {}
            print(
                f"  run {i + 1} {label}: {wall:.1f} s, {len(batches)} batch(es); first batch: "
                + " ".join(f"{k} {v:.2f}" for k, v in first.items()),
                flush=True,
            )
        print("median (range) per label:")
        for label in checkouts:
            xs = walls[label]
            dims = [b.get("dim", 0.0) for b in firsts[label]]
            print(
                f"  {label}: run {statistics.median(xs):.1f} s ({min(xs):.1f}-{max(xs):.1f}); "
                f"first batch's dim phase {statistics.median(dims):.2f} s "
                f"({min(dims):.2f}-{max(dims):.2f})"
            )
    finally:
        s.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
