"""Where a run's executor CPU went, by the Spark jobs' descriptions or call sites (issue 13: B3
spends ~5x B1's CPU per record; which work is it?).

Reads a Spark event log (JSON lines) and sums, per job description (``--by desc``: the
streaming query's name for the jobs its batch thread runs, Delta's for its own, e.g. "MERGE
operation - materialize source"; none for jobs started from other threads) or per call site
(``--by site``: ``callSite.short``), the tasks' executor CPU time, their run time, and the jobs'
and tasks' counts. Work outside tasks (planning, Delta's log replay on the driver, py4j, the
JIT compiler, GC, Python) is not in an event log: compare the total with the CPU of the job's
processes that ``batch_size.py`` reports (``cpu_s``) for its share.

Record an event log by starting the run with
``PYSPARK_SUBMIT_ARGS='--conf spark.eventLog.enabled=true --conf
spark.eventLog.dir=file:///tmp/ev pyspark-shell'`` (the job's JVM is launched through
spark-submit, which reads it), then:

    .venv/bin/python infra/bench/cpu_by_call.py /tmp/ev/eventlog_v2_local-*  [--by desc|site]

``--per-batch``: what each micro-batch of the streaming query ran instead: its input rows, its
trigger's wall time, the Spark jobs submitted inside it (from any thread: the gold sessions'
too), the stages that ran and their tasks; then, per job description, how many jobs and tasks
an average batch with rows and one without ran and the wall time from the job before each (the
job's share of the batch: planning, scheduling, the driver's own work), the first two batches
(the cold start) left out.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path


@dataclass
class Tally:
    cpu_ns: int = 0
    run_ms: int = 0
    tasks: int = 0
    jobs: set[int] = field(default_factory=set)


def _site(props: dict[str, str]) -> str:
    short = props.get("callSite.short") or "(no call site)"
    # A site's Python path without the checkout's prefix, which differs between clones.
    return re.sub(r"\S*/(pipelines|app|infra)/", r"\1/", short)


def _desc(props: dict[str, str]) -> str:
    # a streaming query's jobs: its name, then its id, run id and batch on lines of their own
    desc = (props.get("spark.job.description") or "").split("\n")[0]
    # Delta's descriptions name versions and table paths: keep the kind of work only.
    desc = re.sub(r"\d+", "N", desc)
    return re.sub(r"(file:|/)\S+", "<path>", desc)[:90] or "(none)"


def _lines(path: Path) -> Iterator[str]:
    """An event log's lines: a file, or Spark 4's log directory (``eventlog_v2_<app>``) of
    rolled files, each plain or compressed with zstd (Spark's default codec; read through the
    ``zstd`` command)."""
    files = sorted(path.glob("events_*"), key=_roll) if path.is_dir() else [path]
    for f in files:
        if f.suffix == ".zstd":
            out = subprocess.run(["zstd", "-dc", str(f)], check=True, capture_output=True).stdout
            yield from out.decode().splitlines()
        else:
            with f.open() as lines:
                yield from lines


def _roll(f: Path) -> int:
    return int(f.name.split("_")[1])


@dataclass
class Job:
    id: int
    submitted: int  # epoch ms
    props: dict[str, str]
    stages: set[int] = field(default_factory=set)  # those that ran (skipped ones send no task)
    tasks: int = 0
    cpu_ns: int = 0
    run_ms: int = 0


@dataclass
class Batch:
    id: int
    rows: int  # input rows, every source of the query
    started: float  # epoch ms, the trigger's start
    ms: int  # the trigger's wall time
    jobs: list[Job] = field(default_factory=list)


@dataclass
class EventLog:
    jobs: list[Job]
    batches: list[Batch]  # the streaming query's, each with the jobs submitted in its trigger
    span_s: float  # the log's wall-clock span
    unknown: Job  # tasks of stages no job listed


def read_log(path: Path) -> EventLog:
    """One pass over an event log: every job with its tasks' counts and times, the streaming
    query's batches (from its progress events), and the log's span."""
    jobs: list[Job] = []
    batches: list[Batch] = []
    of_stage: dict[int, Job] = {}
    unknown = Job(-1, 0, {})
    first = last = None
    for line in _lines(path):
        ev = json.loads(line)
        kind = ev.get("Event", "")
        stamp = ev.get("Timestamp") or ev.get("time") or ev.get("Submission Time")
        if isinstance(stamp, int):
            first = stamp if first is None else min(first, stamp)
            last = stamp if last is None else max(last, stamp)
        if kind == "SparkListenerJobStart":
            job = Job(ev["Job ID"], ev["Submission Time"], ev.get("Properties") or {})
            jobs.append(job)
            for stage in ev["Stage IDs"]:
                of_stage[stage] = job
        elif kind == "SparkListenerTaskEnd":
            metrics = ev.get("Task Metrics") or {}
            job = of_stage.get(ev["Stage ID"], unknown)
            job.stages.add(ev["Stage ID"])
            job.tasks += 1
            job.cpu_ns += metrics.get("Executor CPU Time", 0) + metrics.get(
                "Executor Deserialize CPU Time", 0
            )
            job.run_ms += metrics.get("Executor Run Time", 0)
        elif kind.endswith("QueryProgressEvent"):
            p = ev["progress"]
            started = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00"))
            batches.append(
                Batch(
                    p["batchId"],
                    sum(int(s.get("numInputRows") or 0) for s in p.get("sources") or []),
                    started.timestamp() * 1000,
                    int(p["durationMs"].get("triggerExecution", 0)),
                )
            )
    for b in batches:
        b.jobs = sorted(
            (j for j in jobs if b.started <= j.submitted <= b.started + b.ms),
            key=lambda j: j.submitted,
        )
    span = (last - first) / 1000 if first is not None and last is not None else 0.0
    return EventLog(jobs, batches, span, unknown)


def tally(log: EventLog, by: str) -> dict[str, Tally]:
    """Per key, the tasks' CPU and run time."""
    out: dict[str, Tally] = defaultdict(Tally)
    for job in log.jobs:
        t = out[_site(job.props) if by == "site" else _desc(job.props)]
        t.jobs.add(job.id)
        t.cpu_ns += job.cpu_ns
        t.run_ms += job.run_ms
        t.tasks += job.tasks
    if log.unknown.tasks:
        t = out["(unknown stage)"]
        t.cpu_ns, t.run_ms, t.tasks = log.unknown.cpu_ns, log.unknown.run_ms, log.unknown.tasks
    return out


def print_per_batch(batches: list[Batch], top: int) -> None:
    print(f"{'batch':>6} {'rows':>8} {'wall s':>7} {'jobs':>5} {'stages':>6} {'tasks':>6}")
    for b in batches:
        ran = sum(len(j.stages) for j in b.jobs)
        sent = sum(j.tasks for j in b.jobs)
        print(f"{b.id:6d} {b.rows:8,d} {b.ms / 1000:7.2f} {len(b.jobs):5d} {ran:6d} {sent:6d}")
    for label, with_rows in (("with rows", True), ("without rows", False)):
        chosen = [b for b in batches[2:] if (b.rows > 0) == with_rows]
        if not chosen:
            continue
        per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for b in chosen:
            before = b.started
            for j in b.jobs:
                row = per[_desc(j.props)]
                row[0] += 1
                row[1] += j.tasks
                row[2] += j.submitted - before
                before = j.submitted
        n = len(chosen)
        print(f"\nper batch {label} (mean of {n}): jobs, tasks, wall ms from the job before")
        for desc, (jobs, tasks, gap) in sorted(per.items(), key=lambda kv: -kv[1][2])[:top]:
            print(f"{jobs / n:6.1f} {tasks / n:7.1f} {gap / n:8.0f}  {desc}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--by", choices=("site", "desc"), default="desc")
    parser.add_argument("--per-batch", action="store_true", help="jobs per micro-batch")
    args = parser.parse_args()
    log = read_log(args.log)
    if args.per_batch:
        print_per_batch(log.batches, args.top)
        return 0
    out, span = tally(log, args.by), log.span_s
    total_cpu = sum(t.cpu_ns for t in out.values()) / 1e9
    total_run = sum(t.run_ms for t in out.values()) / 1e3
    print(
        f"{args.log}: {span:,.0f} s of log, executors' CPU {total_cpu:,.1f} s, "
        f"task run time {total_run:,.1f} s, {sum(len(t.jobs) for t in out.values()):,} jobs"
    )
    print(f"{'CPU s':>8} {'share':>6} {'run s':>8} {'jobs':>6} {'tasks':>7}  {args.by}")
    for key, t in sorted(out.items(), key=lambda kv: -kv[1].cpu_ns)[: args.top]:
        cpu = t.cpu_ns / 1e9
        print(
            f"{cpu:8.1f} {cpu / total_cpu:6.1%} {t.run_ms / 1e3:8.1f} {len(t.jobs):6d} "
            f"{t.tasks:7d}  {key}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
