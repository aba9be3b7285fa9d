"""``adattr drill crash|replay|broker``: prove exactly-once end to end on the local stack.

Every drill works in a folder and on topics of its own (under ``<data_dir>/drills/<id>``, so it
never touches your tables), generates traffic with a truth file, runs the real job as child
processes (``adattr run``: a Python driver plus its Spark JVM, one process group), hurts it,
and then checks the result three ways: every table against the truth file (``verify``), the
ledger's invariants (``audit``) and every table recomputed from bronze (``reconcile``). It
prints a report and exits non-zero on any discrepancy.

The traffic is shaped so a few thousand records exercise everything within minutes of event
time: a 3-minute watermark delay, a 2-minute attribution lookback, a 5-minute session gap and
small batches (``ADATTR_MAX_OFFSETS_PER_TRIGGER``), like the golden integration test.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from app.runtime.errors import UserInputError
from app.runtime.processes import children, cmdline
from app.runtime.settings import REPO_ROOT, Settings
from app.runtime.spark import driver_base_options, spark_jars
from app.stack.broker import BrokerError, LocalBroker, wait_until_ready
from app.stack.cluster import NODES, WORKERS, LocalCluster

# The job's crash points, in the order a batch reaches them.
JOB_POINTS = (
    "during_state_store_upload",
    "before_delta_commit",
    "between_delta_commits",
    "after_delta_before_kafka",
    "in_kafka_transaction",
    "after_kafka_before_ledger",
    "after_ledger_before_commit_log",
)
SHAPE = {
    "watermark_delay": "3 minutes",
    "attribution_lookback": "2 minutes",
    "session_gap": "5 minutes",
}


@dataclass
class Report:
    name: str
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def say(self, text: str) -> None:
        self.lines.append(text)
        print(f"[{time.monotonic() - self.started:6.1f}s] {text}", flush=True)

    def fail(self, text: str) -> None:
        self.failures.append(text)
        self.say(f"DISCREPANCY: {text}")

    def finish(self) -> int:
        took = time.monotonic() - self.started
        if self.failures:
            print(f"drill {self.name}: FAILED after {took:.0f}s, {len(self.failures)} problem(s):")
            for f in self.failures:
                print(f"  - {f}")
            return 1
        print(f"drill {self.name}: PASSED in {took:.0f}s")
        return 0


class Stack:
    """The drill's own settings, broker, traffic and job processes. With a ``cluster``, the job
    is submitted to its Spark master with ``spark-submit`` (the code as ``infra/package.sh``'s
    zip, as a user submits it) and talks to its three Kafka nodes; the drill's folder is under
    the cluster's shared storage. The drill's own checks run in a local Spark."""

    def __init__(
        self,
        base: Settings,
        name: str,
        *,
        events: int,
        seed: int,
        batch: int,
        root: str = "drills",
        cluster: LocalCluster | None = None,
    ) -> None:
        # Named in UTC, as the logs' and the README's times are, whatever the machine's zone.
        self.id = f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"
        self.cluster = cluster
        home = cluster.shared if cluster is not None else base.data_dir
        self.dir = (home / root / self.id).resolve()
        self.dir.mkdir(parents=True)
        topic = f"adattr-drill-{self.id}"
        self.overrides = {
            "ADATTR_DATA_DIR": str(base.data_dir.resolve()),  # the broker's home is shared
            "ADATTR_WAREHOUSE": str(self.dir / "warehouse"),
            "ADATTR_CHECKPOINTS": str(self.dir / "checkpoints"),
            "ADATTR_INPUT_TOPIC": f"{topic}-events",
            "ADATTR_OUTPUT_TOPIC": f"{topic}-metrics",
            "ADATTR_CONTROL_TOPIC": f"{topic}-control",
            "ADATTR_CONSUMER_DB": f"sqlite:///{self.dir / 'budget.db'}",
            "ADATTR_MAX_OFFSETS_PER_TRIGGER": str(batch),
            "ADATTR_TRIGGER_INTERVAL": "1 second",
            # A few hundred records per batch: 2 tasks per stage instead of 4 on 2 cores.
            "ADATTR_SHUFFLE_PARTITIONS": "2",
            **{f"ADATTR_{k.upper()}": v for k, v in SHAPE.items()},
        }
        self.ui_port = 0
        if cluster is not None:
            from app.stack.broker import free_port

            # The job's UI: its REST API says which executor runs tasks (the worker drill).
            self.ui_port = free_port()
            self.overrides["ADATTR_BOOTSTRAP_SERVERS"] = cluster.bootstrap
        self.override({})
        self.events, self.seed = events, seed
        self.broker: LocalBroker | None = None
        self.started_broker = False
        self.started_cluster = False
        self.procs: list[subprocess.Popen[bytes]] = []
        self.package: Path | None = None
        self._spark: Any = None
        self.runs = 0

    # -- infrastructure ------------------------------------------------------------------------
    def override(self, values: Mapping[str, str | None]) -> None:
        """Set each ``ADATTR_`` key to its value, or with None drop it (back to the caller's
        environment, else the shipped default), for the jobs this stack starts and for its own
        ``settings`` alike."""
        for key, value in values.items():
            if value is None:
                self.overrides.pop(key, None)
            else:
                self.overrides[key] = value
        self.env = {**os.environ, **self.overrides}
        self.env.pop("ADATTR_CRASH_AT", None)
        self.settings = Settings.from_env(self.env)

    def up(self) -> None:
        from app.runtime.kafka_io import KafkaConnection, app_topics, ensure_topics
        from app.stack.broker import local_broker, port_is_free

        if self.cluster is not None:
            self._cluster_up(self.cluster)
        else:
            broker = local_broker(self.settings)
            if broker.status().running or not port_is_free(broker.host, broker.port):
                wait_until_ready(broker.bootstrap, 60)  # ours, or one someone else runs there
            else:
                broker.start()
                self.started_broker = True
            self.broker = broker
        self.kafka = KafkaConnection.of(self.settings)
        ensure_topics(self.kafka, app_topics(self.settings))

    def _cluster_up(self, cluster: LocalCluster) -> None:
        """Uses the cluster that runs (starting whatever of it is missing), or starts one and
        stops it at the end; and builds the package a submitted job ships to the workers."""
        nodes = [cluster.broker(n).status().running for n in range(1, NODES + 1)]
        self.started_cluster = not any(nodes) and cluster.alive_workers() == 0
        if not all(nodes) or cluster.alive_workers() < WORKERS:
            cluster.up()
        subprocess.run(
            ["bash", str(REPO_ROOT / "infra" / "package.sh")],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHON": sys.executable},
            capture_output=True,
            check=True,
        )
        self.package = REPO_ROOT / ".adattr" / "dist" / "adattr.zip"

    def down(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:  # a drill that ended early leaves no job behind
                kill_tree(proc)
        if self.started_broker and self.broker is not None:
            self.broker.stop()
        if self.started_cluster and self.cluster is not None:
            self.cluster.down()

    def spark(self) -> Any:
        if self._spark is None:
            from app.runtime.spark import build_spark

            self._spark = build_spark(self.settings, "adattr-drill")
        return self._spark

    # -- traffic -------------------------------------------------------------------------------
    def plan(self) -> Any:
        from app.tools.generator import GenConfig, plan_traffic

        # At least 12 minutes of event time, so that sessions (5-minute gap) close before the
        # final watermark (3 minutes behind) whatever the number of events.
        step_ms = max(200, 720_000 // self.events)
        cfg = GenConfig.for_settings(
            self.settings, events=self.events, seed=self.seed, users=300, ads=20, step_ms=step_ms
        )
        traffic = plan_traffic(cfg)
        (self.dir / "truth.json").write_text(json.dumps(traffic.truth, indent=1))
        return traffic

    def load_dim(self, traffic: Any) -> None:
        from pipelines.dimension import upsert_dim_ads

        upsert_dim_ads(self.spark(), self.settings.warehouse_uri, traffic.dim_rows)

    def produce(self, records: list[tuple[bytes, bytes]]) -> None:
        from app.tools.generator import produce

        produce(records, self.kafka, self.settings.input_topic, progress=False)

    def produce_live(
        self, slices: list[list[tuple[bytes, bytes]]], proc: subprocess.Popen[bytes], report: Report
    ) -> None:
        """Produces ``Traffic.live_slices`` to a running job, each once the job has planned a
        batch that takes everything produced before it (the slice before, or for the first one
        what came before the call: the first half, or an earlier call's share of the slices),
        so no reading order makes any of them late; all at once when the job is not running
        (the next run reads them in order) or has not taken a slice in 300 s (a
        discrepancy)."""
        for i, chunk in enumerate(slices):
            what = f"slice {i - 1} of {len(slices)}" if i else "what was produced before"
            running = proc.poll() is None
            if running and not self._taken(proc, self.planned_to_end, what, report):
                self.produce([r for rest in slices[i:] for r in rest])
                return
            self.produce(chunk)

    def _taken(
        self, proc: subprocess.Popen[bytes], taken: Callable[[], bool], what: str, report: Report
    ) -> bool:
        """Waits until the running job has ``taken`` what was produced, or has stopped; after
        300 s, a discrepancy (False)."""
        try:
            wait_for(
                lambda: proc.poll() is not None or taken(), 300, f"the running job to take {what}"
            )
        except TimeoutError as exc:
            report.fail(str(exc))
            return False
        return True

    # -- the job -------------------------------------------------------------------------------
    def start_job(self, *args: str, crash_at: str = "") -> subprocess.Popen[bytes]:
        self.runs += 1
        env = {**self.env, **({"ADATTR_CRASH_AT": crash_at} if crash_at else {})}
        if self.cluster is not None:
            python = sys.executable
            env |= {
                "PYSPARK_PYTHON": python,
                "PYSPARK_DRIVER_PYTHON": python,
                "ADATTR_SPARK_UI": "true",
            }
        log = (self.dir / f"run-{self.runs:03d}.log").open("wb")
        with log:
            proc = subprocess.Popen(
                self._command(args),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: the driver and its JVM
            )
        self.procs.append(proc)
        return proc

    def _command(self, args: tuple[str, ...]) -> list[str]:
        if self.cluster is None:
            return [sys.executable, "-m", "app.cli", *args]
        assert self.package is not None, "the stack is up"
        return [
            str(Path(sys.executable).with_name("spark-submit")),
            *("--master", self.cluster.master_url),
            *("--driver-memory", self.settings.spark_driver_memory),
            *submit_java_options(self.settings),
            *("--conf", "spark.executor.memory=1g", "--conf", f"spark.ui.port={self.ui_port}"),
            *("--jars", ",".join(spark_jars(self.settings.jars_dir))),
            *("--py-files", str(self.package)),
            str(REPO_ROOT / "app" / "submit.py"),
            *args,
        ]

    def stop_job(self, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
        """Asks the job to stop after its current batch (SIGTERM to the Python driver: under
        spark-submit, the child of the submitting JVM, which ends when the driver does)."""
        drivers = [proc.pid]
        if self.cluster is not None:
            drivers = [c for c in children(proc.pid) if "submit.py" in cmdline(c)] or drivers
        for pid in drivers:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        proc.wait(timeout)

    def killed(self, rc: int) -> bool:
        """The exit of a job that SIGKILLed itself: under spark-submit the submitting JVM
        exits with its driver's status, 128 + the signal."""
        return rc == (-signal.SIGKILL if self.cluster is None else 128 + signal.SIGKILL)

    def log_of(self, run: int) -> str:
        return (self.dir / f"run-{run:03d}.log").read_text(errors="replace")

    def run(self, *args: str, crash_at: str = "", timeout: float = 900) -> int:
        proc = self.start_job(*args, crash_at=crash_at)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            raise

    def drain(self, report: Report) -> None:
        """Runs the job until the topic is drained; a failure is a discrepancy."""
        rc = self.run("run", "--available-now")
        if rc != 0:
            report.fail(f"`adattr run --available-now` exited {rc}: {self.last_error()}")

    def last_error(self) -> str:
        lines = [ln for ln in self.log_of(self.runs).splitlines() if "adattr" in ln.lower()]
        return lines[-1] if lines else "(see the run log)"

    def progress(self) -> tuple[int, int]:
        """(batches planned, batches committed) in the current generation's checkpoint, read
        without creating anything (the job may not have made its first generation yet): the
        newest batch id of each log plus one. Not the number of entries: Spark deletes a log's
        oldest entries past ``minBatchesToRetain`` (100), after which a count stops growing and
        a wait for "one more batch" would never end."""
        checkpoint = self._checkpoint()
        if checkpoint is None:
            return 0, 0

        def through(folder: str) -> int:
            path = checkpoint / folder
            ids = [int(p.name) for p in path.iterdir() if p.name.isdigit()] if path.exists() else []
            return max(ids) + 1 if ids else 0

        return through("offsets"), through("commits")

    def _checkpoint(self) -> Path | None:
        root = self.settings.checkpoints / "attribution"
        marker = root / "generation.json"
        if not marker.exists():
            return None
        return root / f"gen-{json.loads(marker.read_text())['number']:04d}"

    def caught_up(self) -> bool:
        """Whether the job has committed a batch ending at every input partition's end and
        has none in flight (Spark runs the batch that moves the watermark past the last
        records before it idles; that one is planned, hence in flight, until it commits)."""
        planned, committed = self.progress()
        return committed > 0 and planned == committed and self._ends_at_topic_end(committed - 1)

    def planned_to_end(self) -> bool:
        """Whether the newest batch the job planned ends at every input partition's end: what
        is produced next is read by later batches, whose watermark that batch's events set."""
        planned = self.progress()[0]
        return planned > 0 and self._ends_at_topic_end(planned - 1)

    def _ends_at_topic_end(self, batch: int) -> bool:
        from app.tools.replay import describe_topic
        from pipelines.offset_log import source_offsets

        checkpoint = self._checkpoint()
        if checkpoint is None:
            return False
        topic = self.settings.input_topic
        try:
            ends = {str(p): info.high for p, info in describe_topic(self.kafka, topic).items()}
        except (KafkaException, UserInputError):  # leaders moving (a node died or came back)
            return False
        return source_offsets(checkpoint, batch).get(topic) == ends

    def at_final_watermark(self) -> bool:
        """Whether the last committed batch ran with the truth's final watermark: every
        window, attribution and session the traffic can close is closed."""
        from pipelines.offset_log import read_batch_meta

        truth = json.loads((self.dir / "truth.json").read_text())
        final_ms = datetime.fromisoformat(truth["final_watermark"]).timestamp() * 1000
        checkpoint, committed = self._checkpoint(), self.progress()[1]
        if checkpoint is None or committed == 0:
            return False
        return read_batch_meta(checkpoint, committed - 1).watermark_ms >= final_ms

    def finish_running(
        self, proc: subprocess.Popen[bytes], tail: list[Any], report: Report
    ) -> None:
        """Lets the running job take the traffic produced so far, then the late tail, and stops
        it after its batch; ``run --available-now`` drains what remains only when its last
        batch had not reached the final watermark (the batch that moves it may not have been
        planned yet): no job start, or one instead of two drains' two."""
        for what, late in (("the traffic", []), ("the late tail", tail)):
            if late:
                self.produce(late)
            self._taken(proc, self.caught_up, what, report)
            if proc.poll() is not None:
                report.fail(f"the job stopped ({proc.returncode}): {self.last_error()}")
                break
        else:
            self.stop_job(proc)
            report.say(f"the running job took all traffic: {self.progress()[1]} batches")
            if self.at_final_watermark():
                return
        self.drain(report)

    # -- the checks ----------------------------------------------------------------------------
    def check(self, report: Report, *, truth: bool = True) -> None:
        from app.tools.audit import audit
        from app.tools.reconcile import reconcile
        from app.tools.verify import diff, observed

        spark = self.spark()
        warehouse = self.settings.warehouse_uri
        if truth:
            expected = json.loads((self.dir / "truth.json").read_text())
            problems = diff(expected, observed(spark, warehouse))
            for p in problems[:10]:
                report.fail(f"verify: {p}")
            if not problems:
                report.say(
                    f"verify: OK, every table equals the truth ({expected['records']:,} records, "
                    f"{len(expected['windows']):,} windows, {len(expected['attributions']):,} "
                    f"conversions, {len(expected['sessions']):,} closed sessions)"
                )
        checks = audit(spark, warehouse, self.kafka)
        for c in checks:
            if not c.ok:
                report.fail(f"audit: {c.name}: {c.detail}")
        if all(c.ok for c in checks):
            report.say(f"audit: OK, {len(checks)} checks")
        diffs = reconcile(
            spark,
            warehouse,
            max_bytes=self.settings.max_record_bytes,
            lookback_seconds=self.settings.attribution_lookback_seconds,
            session_gap_seconds=self.settings.session_gap_seconds,
        )
        for d in diffs:
            if not d.ok:
                report.fail(f"reconcile: {d.table}: {d.missing} missing, {d.unexpected} unexpected")
        if all(d.ok for d in diffs):
            report.say(
                f"reconcile: OK, {len(diffs)} tables recomputed from bronze equal the stream's"
            )

    def fingerprint(self) -> dict[str, tuple[int, int]]:
        """Row count and an order-independent hash of every table, without provenance (which
        generation and batch last wrote a row) and without the ledger (which grows)."""
        from pyspark.sql import functions as F

        from pipelines import tables as t

        names = (t.BRONZE, t.QUARANTINE, t.LATE, t.SILVER, t.GOLD_1M, t.ATTRIBUTIONS, t.CTR_1H)
        return {name: self._hash(name, F) for name in (*names, t.SESSIONS)}

    def _hash(self, name: str, F: Any) -> tuple[int, int]:
        df = self.spark().read.format("delta").load(self.settings.table_path(name))
        cols = [c for c in df.columns if c not in ("generation", "batch_id")]
        row = df.select(F.xxhash64(*cols).alias("h")).agg(
            F.count("*").alias("n"), F.sum(F.col("h").cast("decimal(38,0)")).alias("s")
        )
        first = row.first()
        return (int(first.n), int(first.s or 0))


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job's process tree at once: the Python driver's group and the group of every
    child it started in a session of its own (the Spark JVM, see ``app.runtime.spark``, with
    whatever it started). The driver's group is stopped first, so it can start nothing while its
    children are listed."""
    groups = [proc.pid]
    try:
        os.killpg(proc.pid, signal.SIGSTOP)
        groups += [child for child in children(proc.pid) if os.getpgid(child) == child]
    except ProcessLookupError:
        pass
    for group in [*groups[1:], groups[0]]:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)


@contextmanager
def stack(base: Settings, name: str, **kw: Any) -> Iterator[Stack]:
    s = Stack(base, name, **kw)
    print(f"drill {name}: folder {s.dir}, topic {s.settings.input_topic}", flush=True)
    s.up()
    try:
        yield s
    finally:
        s.down()


def chunks_of(records: list[Any], n: int) -> list[list[Any]]:
    size = -(-len(records) // n)
    return [records[i : i + size] for i in range(0, len(records), size)] or [[]]


# -- the drills ----------------------------------------------------------------------------------


def drill_crash(
    base: Settings,
    *,
    kills: int,
    seed: int,
    events: int,
    points: tuple[str, ...],
    cluster: bool = False,
    replay: bool = False,
    broker_outage_s: float | None = None,
) -> int:
    """The named crash points, then ``kills`` random SIGKILLs, then a running job takes the
    rest; with ``broker_outage_s``, that job meets the broker drill's outage (the drill's own
    broker down for that long once the job committed a batch); with ``replay``, the replay
    drill's replay follows on the tables the crashes left (a replay of offsets that crashed runs
    read), and every table must be unchanged by it."""
    report = Report("crash --cluster" if cluster else "crash")
    rng = random.Random(seed)
    on = LocalCluster.of(base) if cluster else None
    batch = max(200, events // 6)
    with stack(base, "crash", events=events, seed=seed, batch=batch, cluster=on) as s:
        if broker_outage_s is not None and not s.started_broker:
            report.fail(_OWN_BROKER)
            return report.finish()
        traffic = s.plan()
        s.load_dim(traffic)
        chunks = chunks_of(traffic.main, len(points) + kills + 1)
        report.say(
            f"traffic: {len(traffic.main):,} records in {len(chunks)} chunks, then "
            f"{len(traffic.tail)} late; named crash points {len(points)}, random kills {kills}"
        )
        for i, point in enumerate(points):
            s.produce(chunks[i])
            nth = rng.randint(1, 2)
            rc = s.run("run", "--available-now", crash_at=f"{point}:{nth}")
            log = s.log_of(s.runs)
            if s.killed(rc) and f"crash point {point}" in log:
                planned, committed = s.progress()
                report.say(
                    f"crash point {point} (#{nth}): killed; checkpoint: {planned} batches "
                    f"planned, {committed} committed"
                )
            else:
                report.fail(f"crash point {point} (#{nth}) was not reached (exit {rc})")
        for k in range(kills):
            s.produce(chunks[len(points) + k])
            start = s.progress()
            proc = s.start_job("run")
            # A random moment that the job's progress, not the machine's speed, decides: after
            # 0 or 1 batches this run committed (a loaded machine would otherwise land every
            # kill in start-up), then 0-8 s more: start-up, mid-batch, between batches.
            after = rng.choice((0, 1))
            try:
                wait_for(
                    lambda p=proc, goal=start[1] + after: (  # type: ignore[misc]
                        p.poll() is not None or s.progress()[1] >= goal
                    ),
                    240,
                    f"{after} batch(es) to commit",
                )
            except TimeoutError:
                after = -1  # reported below: the job made no progress in 4 minutes
            at = rng.uniform(0.0, 8.0)
            time.sleep(at)  # the drill's random moment: when the kill lands is the point
            planned, committed = s.progress()
            if proc.poll() is not None:
                report.fail(f"kill {k + 1}: the job had already exited ({proc.returncode})")
                continue
            kill_tree(proc)
            if after < 0:
                report.fail(f"kill {k + 1}: no batch committed within 240 s of the start")
            if planned > committed:
                state = f"batch {planned - 1} in flight ({committed} committed)"
            else:
                state = f"between batches ({committed} committed)"
            report.say(
                f"kill {k + 1}/{kills}: {max(after, 0)} batch(es) into the run + {at:.1f}s, "
                f"SIGKILL to the process tree; {state}, {committed - start[1]} by this run"
            )
        rest = chunks[-1] if len(chunks) > len(points) + kills else []
        if broker_outage_s is None:
            s.produce(rest)
            running = s.start_job("run")
        else:
            # The broker drill's outage, in the last run: half the rest before, half live after.
            first = len(traffic.main) - len(rest)
            mid = first + len(rest) // 2
            s.produce(traffic.main[first:mid])
            committed = s.progress()[1]
            outage = broker_outage(
                s,
                report,
                s.start_job("run"),
                traffic.live_slices(mid),
                batches=committed + 1,
                down_seconds=broker_outage_s,
            )
            if outage is None:
                return report.finish()
            running = outage
        s.finish_running(running, traffic.tail, report)
        report.say(f"finished: {s.runs} job runs in all")
        if replay:
            replay_unchanged(s, report, replays_of(s))
        s.check(report)
    return report.finish()


def drill_replay(base: Settings, *, seed: int, events: int, full: bool) -> int:
    report = Report("replay")
    # Few, large batches: the replay is the drill, not the first run.
    with stack(base, "replay", events=events, seed=seed, batch=max(200, events // 2)) as s:
        traffic = s.plan()
        s.load_dim(traffic)
        half = len(traffic.main) // 2
        s.produce(traffic.main[:half])
        middle = time.time()
        s.produce(traffic.main[half:])
        s.finish_running(s.start_job("run"), traffic.tail, report)
        report.say(f"complete run: {s.progress()[1]} batches; hashing every table")
        if full:
            s.check(report)  # (the short drill checks once, at the end: same tables)
        replay_unchanged(s, report, replays_of(s, full=full, middle=middle))
        s.check(report)
    return report.finish()


def replays_of(s: Stack, *, full: bool = False, middle: float = 0.0) -> list[list[str]]:
    """The replay drill's replays: partition 0 from its middle; ``full`` adds two partitions
    from different offsets, ``--from-timestamp`` (``middle``, mid-traffic) and the earliest."""
    from app.tools.replay import describe_topic

    parts = describe_topic(s.kafka, s.settings.input_topic)
    topic = s.settings.input_topic
    mid = {p: (info.low + info.high) // 2 for p, info in parts.items()}
    first = min(parts)
    replays = [["--from-offsets", json.dumps({topic: {str(first): mid[first]}})]]
    if full:
        last = max(parts)
        replays += [
            ["--from-offsets", json.dumps({topic: {str(first): 0, str(last): mid[last] // 2}})],
            ["--from-timestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(middle))],
            ["--from-earliest"],
        ]
    return replays


def replay_unchanged(s: Stack, report: Report, replays: list[list[str]]) -> None:
    """Runs each ``adattr replay`` in turn on a stack whose job has taken all its traffic;
    a hash of every table must be the same after each as before the first."""
    before = s.fingerprint()
    for args in replays:
        started = time.monotonic()
        rc = s.run("replay", *args)
        if rc != 0:
            report.fail(f"`adattr replay {' '.join(args)}` exited {rc}: {s.last_error()}")
            continue
        after = s.fingerprint()
        changed = [name for name in before if after[name] != before[name]]
        if changed:
            report.fail(f"replay {' '.join(args)} changed {', '.join(changed)}")
        else:
            report.say(
                f"replay {' '.join(args)}: {time.monotonic() - started:.0f}s, "
                f"every table unchanged ({len(before)} tables hashed)"
            )


_OWN_BROKER = (
    "the broker drill stops and restarts the broker, so it must start its own: run it with no "
    "local broker running (`adattr down`)"
)


def drill_broker(base: Settings, *, seed: int, events: int, down_seconds: float) -> int:
    report = Report("broker")
    with stack(base, "broker", events=events, seed=seed, batch=max(200, events // 6)) as s:
        if not s.started_broker:
            report.fail(_OWN_BROKER)
            return report.finish()
        traffic = s.plan()
        s.load_dim(traffic)
        half = len(traffic.main) // 2
        s.produce(traffic.main[:half])
        proc = s.start_job("run")
        running = broker_outage(
            s, report, proc, traffic.live_slices(half), batches=2, down_seconds=down_seconds
        )
        if running is None:
            return report.finish()
        s.finish_running(running, traffic.tail, report)
        s.check(report)
    return report.finish()


def broker_outage(
    s: Stack,
    report: Report,
    proc: subprocess.Popen[bytes],
    slices: list[list[tuple[bytes, bytes]]],
    *,
    batches: int,
    down_seconds: float,
) -> subprocess.Popen[bytes] | None:
    """The broker drill's outage of the stack's own broker: once the running job has committed
    ``batches`` batches in its checkpoint, the broker is SIGKILLed and restarted
    ``down_seconds`` later; then ``slices`` (live) are produced. The job either rides it out
    (it must then commit a batch planned after the kill, whose Kafka transaction needed the
    broker back) or stops with a clear error and is restarted. Returns the job running now, or
    None (reported) when the job stopped or stalled before the outage, or the broker did not
    come back."""
    assert s.broker is not None and s.started_broker, _OWN_BROKER
    if not slices:
        report.fail("no traffic left to send after the outage (more --events)")
        return None
    try:
        wait_for(
            lambda: proc.poll() is not None or s.progress()[1] >= batches,
            300,
            f"{batches} batches",
        )
    except TimeoutError as exc:
        report.fail(f"before the outage: {exc}")
        return None
    if proc.poll() is not None:
        report.fail(f"the job stopped ({proc.returncode}) before the outage: {s.last_error()}")
        return None
    planned, committed = s.progress()
    pid = s.broker.status().pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    s.broker.stop()
    report.say(
        f"broker SIGKILLed with the job running ({committed} batches committed, "
        f"{planned - committed} in flight); down for {down_seconds:.0f}s"
    )
    time.sleep(down_seconds)  # the outage itself: how long the broker stays down
    try:
        s.broker.start()
    except BrokerError as exc:
        report.fail(f"the broker did not come back: {exc}")
        return None
    report.say("broker restarted")
    s.produce_live(slices, proc, report)
    if proc.poll() is None:
        try:
            wait_for(
                lambda: proc.poll() is not None or s.progress()[1] > planned,
                300,
                f"batch {planned} (planned after the kill) to commit",
            )
            if proc.poll() is None:
                report.say(f"the job rode it out: {s.progress()[1]} batches committed, still up")
        except TimeoutError as exc:
            report.fail(f"the job neither failed nor made progress: {exc}")
    if proc.poll() is not None:
        report.say(f"the job stopped ({proc.returncode}): {s.last_error()}; restarting")
        proc = s.start_job("run")
    return proc


def describe_points() -> str:
    return ", ".join(JOB_POINTS)


def submit_java_options(settings: Settings) -> list[str]:
    """spark-submit's arguments that give the driver the options ``adattr run`` gives it
    (``driver_base_options``: UTC, its collector, ADATTR_JVM_OPTIONS) and the executors
    ADATTR_JVM_OPTIONS."""
    options = settings.java_options
    driver = ["--driver-java-options", " ".join(driver_base_options(settings))]
    if not options:
        return driver
    return [*driver, "--conf", f"spark.executor.extraJavaOptions={' '.join(options)}"]
