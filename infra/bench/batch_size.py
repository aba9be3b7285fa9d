"""How the shipped job's throughput, and each phase of its batches, scale with the micro-batch
size (issue 13: what a gold pass covering several record batches could buy).

A gold writer that ran beside the stream, one pass over the accepted events of several record
batches, would pay gold's fixed cost once per pass instead of once per batch, but still its
per-record work. A B3 batch k times the bench's size pays both parts of every phase that way,
so B3's figures at 25,000 and at k x 25,000 records per batch bound what such a pass can buy
(an upper bound: they also amortise the record path's own fixed cost, and leave out the two
loops' competition for the cores). B1, the textbook job, runs at each size too.

Preloads the bench's traffic once (``--events``), then runs each variant over the whole topic
at each ``--sizes`` (``maxOffsetsPerTrigger``), in fresh tables, the order of the sizes and the
variants reversed every round. Prints events/s per run (Spark's trigger time of every data
batch but the first, as the bench), the CPU the job's processes spent per record read, and, per
size, B3's median phase times per batch and per 1,000 records.

    .venv/bin/python infra/bench/batch_size.py --events 400000 --sizes 25000,100000

It starts (and stops) the embedded broker like the bench does; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from app.runtime.settings import Settings
from app.tools.bench import (
    VARIANTS,
    alternating_runs,
    bench_stack,
    phase_medians,
    preload,
    run_order,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--sizes", default="25000,100000", help="records per batch, commas")
    parser.add_argument("--variants", default="B1,B3")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--jvm-options",
        help="also run every size with these options for the measured job's JVM (not the "
        "broker's), alternating with the default; write --jvm-options=-XX:... (with '=', or "
        "argparse takes a lone option for a flag of its own)",
    )
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    variants = tuple(v for v in args.variants.split(",") if v)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    if not sizes or min(sizes) < 1 or max(sizes) * 3 > args.events:
        parser.error("each size must be positive and at most a third of --events")
    # (label, records per batch, the job JVM's options: None for the default)
    settings = [
        (f"{n:,}" + (" jvm" if jvm else ""), n, jvm)
        for n in sizes
        for jvm in ([None, args.jvm_options] if args.jvm_options else [None])
    ]
    s = bench_stack(Settings.from_env({}), "batch-size", events=args.events, batch=sizes[0])
    s.up()
    default_jvm = s.overrides.get("ADATTR_JVM_OPTIONS")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        label: {v: [] for v in variants} for label, _, _ in settings
    }
    try:
        print(f"batch-size: results under {s.dir}", flush=True)
        if args.jvm_options:
            print(f'batch-size: "jvm" runs: ADATTR_JVM_OPTIONS={args.jvm_options}', flush=True)
        dim_csv = preload(s, args.events, sizes[0])
        for r in range(args.rounds):
            for i, (label, n, jvm) in enumerate(run_order(tuple(settings), r)):
                s.override(
                    {
                        "ADATTR_MAX_OFFSETS_PER_TRIGGER": str(n),
                        "ADATTR_JVM_OPTIONS": jvm if jvm is not None else default_jvm,
                    }
                )
                print(f"batch-size: round {r + 1}, {label} records per batch", flush=True)
                tag = f"r{r + 1}-{n}-" + ("jvm-" if jvm else "")
                # The variants rotate by one per (round, size).
                names = tuple(run_order(tuple(variants), r * len(settings) + i))
                got = alternating_runs(s, dim_csv, 1, names, tag=tag)
                for v in variants:
                    runs[label][v].extend(got[v])
    finally:
        s.down()
    (s.dir / "result.json").write_text(json.dumps(runs, indent=1))
    print("\nevents/s per run (median):")
    for label in runs:
        rates = {v: [r["events_per_s"] for r in runs[label][v]] for v in variants}
        line = "  ".join(
            f"{v} {statistics.median(xs):,.0f} ({', '.join(f'{x:,.0f}' for x in xs)})"
            for v, xs in rates.items()
        )
        ratio = ""
        if "B1" in rates and "B3" in rates:
            ratio = f"  B3/B1 {statistics.median(rates['B3']) / statistics.median(rates['B1']):.2f}"
        print(f"  {label:>12} per batch: {line}{ratio}")
    print(
        "CPU of the job's processes per record read (ms; the query's whole run: its Python, "
        "its JVM, Spark's Python workers, not the broker's):"
    )
    for label in runs:
        line = "  ".join(
            f"{v} " + ", ".join(_cpu_per_record(r) for r in rs) for v, rs in runs[label].items()
        )
        print(f"  {label:>12} per batch: {line}")
    if "B3" in variants:
        print("B3's phases, median s per batch (per 1,000 records):")
        for label, n, _ in settings:
            # the bench's own medians (first batch left out), without the topic's small last one
            split = phase_medians([st for r in runs[label]["B3"] for st in r["steps"][:-1]])
            print(
                f"  {label:>12}: "
                + "  ".join(f"{k} {v:.2f} ({v * 1000 / n:.3f})" for k, v in split.items())
            )
    print(f"batch-size: wrote {s.dir / 'result.json'}")
    return 0


def _cpu_per_record(run: dict[str, Any]) -> str:
    """A run's CPU per record read, in ms ("-" for B0k, the plain consumer, which runs no job)."""
    if "cpu_s" not in run or not run["records_total"]:
        return "-"
    return f"{run['cpu_s'] * 1000 / run['records_total']:.2f}"


if __name__ == "__main__":
    sys.exit(main())
