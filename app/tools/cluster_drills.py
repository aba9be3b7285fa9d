"""``adattr drill worker``, ``adattr drill broker --cluster`` and ``adattr drill cluster`` (both
in one run): the job submitted to the local cluster (``adattr cluster up``, started by the drill
when none runs) loses a Spark worker or the Kafka node that leads most of its input, or one then
the other, and must carry on without a restart; the drill then
finishes the traffic and checks every table as the single-node drills do (``verify``, ``audit``,
``reconcile``), exiting non-zero on any discrepancy. ``adattr drill crash --cluster`` is the
crash drill of ``app.tools.drills`` on the same stack.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from app.runtime.processes import children, pid_alive
from app.runtime.settings import Settings
from app.stack.broker import BrokerError
from app.stack.cluster import NODES, WORKERS, LocalCluster, get_json
from app.tools.drills import Report, Stack, stack, wait_for

APP_NAME = "adattr-attribution"


def _in_flight(s: Stack) -> bool:
    planned, committed = s.progress()
    return committed >= 1 and planned > committed


def _running(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


@dataclass
class OnCluster:
    """A cluster drill under way: its stack, the cluster, the traffic not produced yet (the
    main segment's second half, in ``Traffic.live_slices``, and the late tail) and the running
    job."""

    s: Stack
    cluster: LocalCluster
    rest: list[list[tuple[bytes, bytes]]]
    tail: list[tuple[bytes, bytes]]
    proc: subprocess.Popen[bytes]
    rng: random.Random


@contextmanager
def job_on_cluster(base: Settings, name: str, *, seed: int, events: int) -> Iterator[OnCluster]:
    """The drill's stack on the cluster, its truth planned and dimension loaded, the first half
    of the traffic produced and the job submitted (``adattr run``, continuous)."""
    cluster = LocalCluster.of(base)
    batch = max(200, events // 6)
    with stack(base, name, events=events, seed=seed, batch=batch, cluster=cluster) as s:
        traffic = s.plan()
        s.load_dim(traffic)
        half = len(traffic.main) // 2
        s.produce(traffic.main[:half])
        job = s.start_job("run")
        rng = random.Random(seed)
        yield OnCluster(s, cluster, traffic.live_slices(half), traffic.tail, job, rng)


# A fault: what it does to the running job, then the traffic it is given (live slices) produced
# while the job recovers; True when the drill can go on.
Fault = Callable[[OnCluster, Report, list[list[tuple[bytes, bytes]]]], bool]


def drill_on_cluster(
    base: Settings, title: str, faults: Sequence[str], *, seed: int, events: int
) -> int:
    """The job submitted to the cluster meets each of ``faults`` in turn (a worker lost
    mid-batch, the Kafka node leading most of its input lost), each followed by its share of
    the live traffic, and must carry on without a restart; it then takes the rest and the late
    tail, and every table is checked. Faults in one run cost one job start, one drain and one
    check between them, and each meets a job that has already recovered from the one before."""
    report = Report(title)
    with job_on_cluster(base, title.split()[0], seed=seed, events=events) as run:
        shares = _shares(run.rest, len(faults))
        if not all(shares):
            report.fail(
                f"{len(run.rest)} live slice(s) of traffic for {len(faults)} fault(s), each of "
                "which needs one to run batches after it: more --events"
            )
            return report.finish()
        for fault, share in zip(faults, shares, strict=True):
            if not FAULTS[fault](run, report, share):
                return report.finish()
        run.s.finish_running(run.proc, run.tail, report)
        run.s.check(report)
    return report.finish()


def _shares(slices: list[list[Any]], n: int) -> list[list[list[Any]]]:
    """``slices`` in ``n`` consecutive shares, the last one (a Kafka node's loss needs two
    batches after it) the larger when they do not divide evenly."""
    cuts = [len(slices) * i // n for i in range(n + 1)]
    return [slices[a:b] for a, b in pairwise(cuts)]


def drill_worker(base: Settings, *, seed: int, events: int) -> int:
    return drill_on_cluster(base, "worker", ("worker",), seed=seed, events=events)


def drill_broker_cluster(base: Settings, *, seed: int, events: int) -> int:
    return drill_on_cluster(base, "broker --cluster", ("broker",), seed=seed, events=events)


def drill_cluster(base: Settings, *, seed: int, events: int) -> int:
    """Both faults in one run: a worker, then a Kafka node."""
    return drill_on_cluster(base, "cluster", ("worker", "broker"), seed=seed, events=events)


def lose_worker(run: OnCluster, report: Report, share: list[list[tuple[bytes, bytes]]]) -> bool:
    """Once a batch after the first is in flight and one executor runs its tasks (the job's
    REST API says which, the workers' say whose it is; a random one of the two when both do),
    SIGKILLs that worker with its executor; the batch must commit on the other, and a
    replacement worker must give the job its cores back and run a batch of ``share``."""
    s, cluster, proc = run.s, run.cluster, run.proc
    wait_for(lambda: cluster.app_cores(APP_NAME) == WORKERS, 300, "the job's executors")
    report.say(f"the job runs on {cluster.master_url} with {WORKERS} one-core executors")
    busy: list[tuple[int, str]] = []

    def busy_worker() -> bool:
        busy[:] = _busy_workers(s, cluster) if _in_flight(s) else []
        return not _running(proc) or bool(busy)

    wait_for(busy_worker, 300, "a batch after the first with tasks running")
    if not busy:
        report.fail(f"the job stopped ({proc.returncode}): {s.last_error()}")
        return False
    worker, executor = run.rng.choice(busy)
    pid = cluster.worker_pid(worker)
    assert pid is not None, "a worker that runs an executor"
    executor_pids = children(pid)
    planned, committed = s.progress()
    os.killpg(pid, signal.SIGKILL)  # the worker and its executor: one process group
    wait_for(lambda: not any(map(pid_alive, (pid, *executor_pids))), 30, "the worker to die")
    report.say(
        f"worker-{worker} (pid {pid}) and executor {executor} (pids "
        f"{', '.join(map(str, executor_pids))}) SIGKILLed while running tasks of batch "
        f"{planned - 1} ({committed} committed)"
    )
    wait_for(
        lambda: not _running(proc) or s.progress()[1] >= planned,
        300,
        f"batch {planned - 1} to commit",
    )
    if not _running(proc):
        report.fail(f"the job stopped ({proc.returncode}) instead: {s.last_error()}")
        return False
    lost = _executor(s, executor).get("failedTasks", 0)
    report.say(
        f"batch {planned - 1} committed on the remaining executor "
        f"({cluster.app_cores(APP_NAME)} core(s) left to the job), no restart; "
        f"{lost} task(s) lost with executor {executor} were run again"
    )
    cluster.start_worker(worker)
    cluster.wait_for_workers(WORKERS, 120)
    wait_for(
        lambda: cluster.app_cores(APP_NAME) == WORKERS,
        120,
        "an executor on the replacement worker",
    )
    report.say(
        f"replacement worker-{worker} (pid {cluster.worker_pid(worker)}) registered; "
        f"the job has {WORKERS} cores again"
    )
    done = s.progress()[1]
    s.produce_live(share, proc, report)
    wait_for(lambda: not _running(proc) or s.progress()[1] > done, 300, "a batch on the new worker")
    if not _running(proc):
        report.fail(f"the job stopped ({proc.returncode}): {s.last_error()}")
        run.proc = s.start_job("run")
    else:
        report.say(f"the job carried on: {s.progress()[1]} batches committed, still up")
    return True


def _api(s: Stack, path: str) -> Any:
    """The job's REST API (its driver's UI), under /api/v1/applications/<the app>."""
    apps = get_json(f"http://127.0.0.1:{s.ui_port}/api/v1/applications") or []
    if not apps:
        return None
    return get_json(f"http://127.0.0.1:{s.ui_port}/api/v1/applications/{apps[0]['id']}/{path}")


def _busy_workers(s: Stack, cluster: LocalCluster) -> list[tuple[int, str]]:
    """(worker, executor id) for each of the job's executors that runs a task now."""
    busy = {e["id"] for e in _api(s, "executors") or [] if e.get("activeTasks", 0) > 0}
    return [
        (w, str(e["id"]))
        for w in range(1, WORKERS + 1)
        for e in cluster.worker_executors(w)
        if e.get("appdesc", {}).get("name") == APP_NAME and str(e.get("id")) in busy
    ]


def _executor(s: Stack, executor: str) -> dict[str, Any]:
    """What the driver knows of an executor, alive or dead."""
    found = [e for e in _api(s, "allexecutors") or [] if e.get("id") == executor]
    return found[0] if found else {}


def _leaders(s: Stack) -> dict[int, int]:
    """Input partition -> the node that leads it (-1: none)."""
    from app.runtime.kafka_io import admin_client

    topic = s.settings.input_topic
    meta = admin_client(s.kafka).list_topics(topic, timeout=10).topics[topic]
    return {p: info.leader for p, info in meta.partitions.items()}


def lose_broker(run: OnCluster, report: Report, share: list[list[tuple[bytes, bytes]]]) -> bool:
    """After two committed batches, SIGKILLs the Kafka node that leads most input partitions;
    once others lead them, ``share`` is produced with the node down (acks=all: two replicas
    in sync) and two batches must commit without a restart; the node is then restarted."""
    s, cluster, proc = run.s, run.cluster, run.proc
    wait_for(lambda: not _running(proc) or s.progress()[1] >= 2, 300, "2 batches")
    leaders = _leaders(s)
    node, led = Counter(leaders.values()).most_common(1)[0]
    broker = cluster.broker(node)
    pid = broker.status().pid
    planned, committed = s.progress()
    if pid is None or not _running(proc):
        report.fail(f"kafka node {node} or the job was not running ({proc.poll()})")
        return False
    os.killpg(pid, signal.SIGKILL)
    broker.stop()  # reaps it, clears its pid file
    report.say(
        f"kafka node {node} (pid {pid}), leader of {led} of {len(leaders)} input "
        f"partitions, SIGKILLed with the job running ({committed} batches committed, "
        f"{planned - committed} in flight)"
    )
    wait_for(lambda: node not in _leaders(s).values(), 60, "new leaders")
    report.say(
        "new leaders: "
        + ", ".join(f"p{p}→node {n}" for p, n in sorted(_leaders(s).items()))
        + f" ({NODES - 1} of {NODES} nodes up)"
    )
    s.produce_live(share, proc, report)  # acks=all: two replicas are in sync
    wait_for(
        lambda: not _running(proc) or s.progress()[1] >= planned + 2,
        300,
        "two batches with the node down",
    )
    if _running(proc):
        report.say(
            f"the job carried on without a restart: {s.progress()[1]} batches committed "
            f"with node {node} down"
        )
    else:
        report.say(f"the job had to restart ({proc.returncode}): {s.last_error()}")
    try:
        broker.start()
    except BrokerError as exc:
        report.fail(f"kafka node {node} did not come back: {exc}")
        return False
    report.say(f"kafka node {node} restarted")
    if not _running(proc):
        run.proc = s.start_job("run")
    return True


FAULTS: dict[str, Fault] = {"worker": lose_worker, "broker": lose_broker}
