"""The ``adattr`` command line: settings are read here, once, and passed down.

Heavy imports (pyspark, confluent_kafka) happen inside the handlers, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from app.broker import BrokerError, LocalBroker
from app.errors import USER_ERRORS, UserInputError
from app.settings import Settings, SettingsError

if TYPE_CHECKING:
    from app.generator import GenConfig

Handler = Callable[[argparse.Namespace, Settings], int]
# The commands that connect to Kafka with the settings' credentials.
TALK_TO_KAFKA = {"generate", "run", "replay", "audit", "consume", "bench"}


def local_broker(settings: Settings, *, secure: bool = False) -> LocalBroker:
    """The local broker the settings point at: PLAINTEXT (`adattr up`, the drills, the demo) or
    SASL_SSL with SCRAM users and ACLs (`adattr up --secure`), each in its own data folder."""
    protocol = settings.kafka_security_protocol
    if protocol not in ("PLAINTEXT", "SASL_SSL" if secure else "PLAINTEXT"):
        raise BrokerError(
            f"ADATTR_KAFKA_SECURITY_PROTOCOL={protocol}: "
            + (
                "`adattr up --secure` starts the local SASL_SSL broker; the drills and the demo "
                "run on the PLAINTEXT one"
                if protocol == "SASL_SSL"
                else "the local broker listens on PLAINTEXT, or SASL_SSL with `adattr up --secure`"
            )
        )
    return _broker_at(settings, secure=secure)


def _broker_at(settings: Settings, *, secure: bool) -> LocalBroker:
    from app.secure_kafka import SecureKafka

    first = settings.bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise BrokerError(
            f"ADATTR_BOOTSTRAP_SERVERS={settings.bootstrap_servers} is not a loopback address; "
            "`adattr up` only starts a local broker (use your cluster's own tooling for others)"
        )
    data_dir = settings.data_dir / ("kafka-secure" if secure else "kafka")
    return LocalBroker(
        data_dir=data_dir,
        jars_dir=settings.jars_dir,
        host="127.0.0.1" if host == "localhost" else host,
        port=int(port),
        controller_port=settings.kafka_controller_port,
        java_options=settings.java_options,
        secure=SecureKafka(data_dir) if secure else None,
    )


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from app.broker import port_is_free, wait_until_ready
    from app.kafka_io import KafkaConnection, app_topics, ensure_topics

    if args.secure:
        return _up_secure(args, settings)
    _the_other_is_not_running(settings, secure=False)
    broker = local_broker(settings)
    was_running = broker.status().running
    if not was_running and not port_is_free(broker.host, broker.port):
        # Someone else's broker (a test fixture, a broker you run) may already answer there.
        try:
            wait_until_ready(broker.bootstrap, timeout=5)
        except BrokerError:
            pass  # not a Kafka broker: start() explains that the port is taken
        else:
            created = ensure_topics(KafkaConnection(broker.bootstrap), app_topics(settings))
            print(f"kafka: using the broker that already answers at {broker.bootstrap}")
            print(f"topics created: {', '.join(created) or 'none (all present)'}")
            return 0
    status = broker.start(timeout=args.timeout)
    created = ensure_topics(KafkaConnection(status.bootstrap), app_topics(settings))
    print(f"{'already running' if was_running else 'started'}: {status.describe()}")
    print(f"topics created: {', '.join(created) or 'none (all present)'}")
    return 0


def _up_secure(args: argparse.Namespace, settings: Settings) -> int:
    from app.secure_kafka import ROLES

    broker = local_broker(settings, secure=True)
    assert broker.secure is not None
    _the_other_is_not_running(settings, secure=True)
    was_running = broker.status().running
    broker.secure.prepare(broker.host)
    status = broker.start(timeout=args.timeout)
    created = broker.secure.provision(settings, status.bootstrap)
    print(f"{'already running' if was_running else 'started'}: {status.describe()}")
    print("  clients: SASL_SSL only (SCRAM-SHA-512 over TLS); ACLs decide who does what")
    print(f"  CA to trust: {broker.secure.ca_file}")
    print(f"topics created: {', '.join(created) or 'none (all present)'}")
    print("users (settings per user in an env file; the password stays in its own file):")
    for user, role in ROLES.items():
        print(f"  {user}: {role}\n    {broker.secure.env_file(user)}")
    print(f"act as one: set -a; . {broker.secure.env_file('adattr-job')}; set +a")
    return 0


def _the_other_is_not_running(settings: Settings, *, secure: bool) -> None:
    other = _broker_at(settings, secure=not secure).status()
    if other.running:
        raise BrokerError(
            f"{other.describe()}; `adattr down` stops it, then `adattr up"
            f"{' --secure' if secure else ''}` starts the other one"
        )


def cmd_down(args: argparse.Namespace, settings: Settings) -> int:
    stopped = [b for b in (False, True) if _broker_at(settings, secure=b).stop()]
    names = {False: "kafka", True: "kafka (secure)"}
    print(
        f"{' and '.join(names[b] for b in stopped)}: stopped"
        if stopped
        else "kafka: was not running"
    )
    return 0


def cmd_cluster(args: argparse.Namespace, settings: Settings) -> int:
    from app.cluster import LocalCluster
    from app.kafka_io import KafkaConnection, app_topics, ensure_topics

    cluster = LocalCluster.of(settings)
    if args.cluster_command == "down":
        stopped = cluster.down()
        print(f"stopped: {', '.join(stopped)}" if stopped else "cluster: was not running")
        return 0
    if args.cluster_command == "up":
        cluster.up(timeout=args.timeout)
        created = ensure_topics(KafkaConnection(cluster.bootstrap), app_topics(settings))
        print(f"topics created: {', '.join(created) or 'none (all present)'}")
    for line in cluster.describe():
        print(line)
    if args.cluster_command == "up":
        print(
            f"use it: export ADATTR_BOOTSTRAP_SERVERS={cluster.bootstrap} "
            f"ADATTR_WAREHOUSE={cluster.shared}/warehouse "
            f"ADATTR_CHECKPOINTS={cluster.shared}/checkpoints"
        )
    return 0


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    plain, secure = (_broker_at(settings, secure=b).status() for b in (False, True))
    print(secure.describe() if secure.running and not plain.running else plain.describe())
    print(f"warehouse: {settings.warehouse_uri}")
    print(f"checkpoints: {settings.checkpoints.resolve()}")
    print(f"topics: in {settings.input_topic}, out {settings.output_topic}")
    return 0


def cmd_dim_load(args: argparse.Namespace, settings: Settings) -> int:
    from app.dim_csv import read_dim_csv
    from app.spark import build_spark
    from pipelines.dimension import upsert_dim_ads

    rows = read_dim_csv(Path(args.csv))  # all checks before Spark starts
    spark = build_spark(settings, "adattr-dim-load")
    version, total = upsert_dim_ads(spark, settings.warehouse_uri, rows)
    print(f"dim_ads: upserted {len(rows)} rows from {args.csv}; version {version}, {total} ads")
    return 0


def gen_config(args: argparse.Namespace, settings: Settings) -> GenConfig:
    from app.generator import GenConfig

    cfg = GenConfig.for_settings(
        settings,
        events=args.events,
        seed=args.seed,
        users=args.users,
        ads=args.ads,
        duplicate_ratio=args.duplicate_ratio,
        late_ratio=args.late_ratio,
        malformed_ratio=args.malformed_ratio,
        step_ms=args.step_ms,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        raise UserInputError(str(exc)) from None
    return cfg


def cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from app.dim_csv import write_dim_csv
    from app.generator import plan_traffic, produce
    from app.kafka_io import KafkaConnection, app_topics, ensure_topics

    traffic = plan_traffic(gen_config(args, settings))
    if args.truth:
        Path(args.truth).write_text(json.dumps(traffic.truth, indent=1))
    if args.dim_csv:
        write_dim_csv(Path(args.dim_csv), traffic.dim_rows)
    if args.budgets_csv:
        # Every other campaign gets half of what it will spend: the budget service must alert.
        with Path(args.budgets_csv).open("w") as f:
            f.write("campaign_id,daily_budget\n")
            for i, (campaign, total) in enumerate(sorted(traffic.truth["campaigns"].items())):
                budget = Decimal(total["spend"]) * (Decimal("0.5") if i % 2 else Decimal(2))
                f.write(f"{campaign},{budget.quantize(Decimal('0.01'))}\n")
    records = {"all": traffic.main + traffic.tail, "main": traffic.main, "tail": traffic.tail}
    chosen = records[args.segment]
    kafka = KafkaConnection.of(settings)
    # The input topic only: a producer of ad events may see no other (ACLs on a secure broker).
    ensure_topics(kafka, [t for t in app_topics(settings) if t.name == settings.input_topic])
    produce(chosen, kafka, settings.input_topic, rate=args.rate)
    print(f"generate: {len(chosen):,} records ({args.segment}) to {settings.input_topic}")
    return 0


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    from app.spark import build_spark
    from pipelines import job
    from pipelines.dimension import DimensionMissingError
    from pipelines.publish import PublishError

    metrics = None
    if settings.metrics_port:
        from app.metrics import serve
        from pipelines.metrics import JobMetrics

        metrics = JobMetrics()
        serve(metrics.registry, settings)
    spark = build_spark(settings, "adattr-attribution")
    started = time.monotonic()
    try:
        job.run(spark, settings, available_now=args.available_now, metrics=metrics)
    except (DimensionMissingError, job.JobFailedError, job.JobRunningError, PublishError) as exc:
        print(f"adattr run: {exc}", file=sys.stderr)
        return 1
    print(f"run: stopped after {time.monotonic() - started:.1f}s")
    return cmd_summary(args, settings, spark)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from app import replay as r
    from app.kafka_io import KafkaConnection
    from app.spark import build_spark
    from pipelines import job
    from pipelines.dimension import DimensionMissingError
    from pipelines.publish import PublishError

    topic, kafka = settings.input_topic, KafkaConnection.of(settings)
    partitions = r.describe_topic(kafka, topic)  # checks before Spark
    if args.from_offsets:
        chosen: dict[int, int] | None = r.parse_offsets(args.from_offsets, topic, partitions)
        why = f"replay --from-offsets {args.from_offsets}"
    elif args.from_timestamp:
        ms = r.parse_timestamp(args.from_timestamp)
        chosen = r.offsets_at(kafka, topic, partitions, ms)
        why = f"replay --from-timestamp {args.from_timestamp}"
    else:
        chosen, why = None, "replay --from-earliest"
    spark = build_spark(settings, "adattr-replay")
    warehouse = settings.warehouse_uri
    upto = r.ledger_read_upto(spark, warehouse, topic) if job.has_ledger(spark, warehouse) else {}
    start = r.plan(topic=topic, partitions=partitions, chosen=chosen, read_upto=upto)
    made: list[job.Generation] = []

    def new_generation() -> None:
        old = job.current_generation(settings.checkpoints)
        gen = job.new_generation(
            settings.checkpoints, old.number + 1, r.spark_starting_offsets(topic, start), why
        )
        made.append(gen)
        print(f"replay: generation {gen.number} ({gen.app_id}) replaces {old.number}; {why}")
        for p, offset in sorted(start.items()):
            at = "earliest" if offset == r.EARLIEST else str(offset)
            print(f"  {topic}[{p}] from {at} (held {partitions[p].low}..{partitions[p].high - 1})")
        print(f"  offsets read again: up to {r.rereads(start, partitions, upto):,}")

    started = time.monotonic()
    try:
        job.run(spark, settings, available_now=not args.keep_running, before_start=new_generation)
    except (DimensionMissingError, job.JobFailedError, job.JobRunningError, PublishError) as exc:
        print(f"adattr replay: {exc}", file=sys.stderr)
        return 1
    print(
        f"replay: generation {made[0].number} caught up in {time.monotonic() - started:.1f}s; "
        "`adattr run` continues it, `adattr audit` checks it"
    )
    return cmd_summary(args, settings, spark)


def cmd_summary(args: argparse.Namespace, settings: Settings, spark: object = None) -> int:
    from app.spark import build_spark
    from app.verify import campaign_summary

    session = spark or build_spark(settings, "adattr-summary")
    rows = campaign_summary(session, settings.warehouse_uri)  # type: ignore[arg-type]
    print(
        f"{'campaign':<12} {'impressions':>12} {'clicks':>8} {'spend':>16} "
        f"{'conversions':>11} {'revenue':>14} {'(pending)':>9}"
    )
    for campaign, imps, clicks, spend, conversions, revenue, pending in rows:
        print(
            f"{campaign:<12} {imps:>12,} {clicks:>8,} {spend:>16.6f} "
            f"{conversions:>11,} {revenue:>14.2f} {pending:>9,}"
        )
    return 0


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from app.spark import build_spark
    from app.verify import diff, observed

    try:
        truth = json.loads(Path(args.truth).read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot read truth file {args.truth}: {exc}") from None
    spark = build_spark(settings, "adattr-verify")
    problems = diff(truth, observed(spark, settings.warehouse_uri))
    if problems:
        print(f"verify: {len(problems)} difference(s) from {args.truth}:")
        for line in problems[:50]:
            print(f"  {line}")
        return 1
    print(
        f"verify: OK: {truth['records']:,} records, {len(truth['windows']):,} windows, "
        f"{sum(truth['quarantine'].values()):,} quarantined, {truth['duplicates']:,} duplicates, "
        f"{truth['late']:,} late, {len(truth['attributions']):,} conversions "
        f"({sum(a['status'] == 'attributed' for a in truth['attributions']):,} attributed), "
        f"{len(truth['ctr_1h']):,} hourly CTR windows, {len(truth['sessions']):,} closed "
        f"sessions: the tables match {args.truth} exactly"
    )
    return 0


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    from app.audit import audit
    from app.kafka_io import KafkaConnection
    from app.spark import build_spark
    from pipelines.job import current_generation

    spark = build_spark(settings, "adattr-audit")
    gen = current_generation(settings.checkpoints)
    checks = audit(spark, settings.warehouse_uri, KafkaConnection.of(settings))
    print(f"audit of every generation (current: {gen.number}, {gen.app_id}):")
    for check in checks:
        print(f"  {'OK    ' if check.ok else 'BREACH'} {check.name}: {check.detail}")
    breaches = sum(not check.ok for check in checks)
    print(f"audit: {len(checks)} checks, {breaches} breach(es)")
    return 1 if breaches else 0


def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    from app.reconcile import reconcile
    from app.spark import build_spark

    spark = build_spark(settings, "adattr-reconcile")
    started = time.monotonic()
    diffs = reconcile(
        spark,
        settings.warehouse_uri,
        max_bytes=settings.max_record_bytes,
        lookback_seconds=settings.attribution_lookback_seconds,
        session_gap_seconds=settings.session_gap_seconds,
    )
    print("reconcile: every table recomputed from bronze_ad_events in one batch job, vs the stream")
    for d in diffs:
        print(
            f"  {'OK  ' if d.ok else 'DIFF'} {d.table}: {d.rows:,} rows; "
            f"{d.missing:,} missing, {d.unexpected:,} unexpected"
        )
        for example in d.examples:
            print(f"         {example}")
    bad = sum(not d.ok for d in diffs)
    print(f"reconcile: {len(diffs)} tables, {bad} differ ({time.monotonic() - started:.1f}s)")
    return 1 if bad else 0


def cmd_drill(args: argparse.Namespace, settings: Settings) -> int:
    from app import drills

    if args.drill == "worker":
        from app.cluster_drills import drill_worker

        return drill_worker(settings, seed=args.seed, events=args.events)
    if args.drill == "broker" and args.cluster:
        from app.cluster_drills import drill_broker_cluster

        return drill_broker_cluster(settings, seed=args.seed, events=args.events)
    if args.drill == "crash":
        points = (
            drills.JOB_POINTS
            if args.points == "all"
            else tuple(p for p in args.points.split(",") if p)
        )
        unknown = [p for p in points if p not in drills.JOB_POINTS]
        if unknown:
            raise UserInputError(
                f"unknown crash point(s) {', '.join(unknown)}; known: {drills.describe_points()}"
            )
        return drills.drill_crash(
            settings,
            kills=args.kills,
            seed=args.seed,
            events=args.events,
            points=points,
            cluster=args.cluster,
        )
    if args.drill == "replay":
        return drills.drill_replay(settings, seed=args.seed, events=args.events, full=args.full)
    return drills.drill_broker(
        settings, seed=args.seed, events=args.events, down_seconds=args.down_seconds
    )


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from app.bench import bench

    return bench(
        settings,
        quick=args.quick,
        events=args.events,
        repeats=args.repeats,
        only_fixed=args.fixed_only,
        publish_rows=args.publish_rows,
    )


def cmd_quality(args: argparse.Namespace, settings: Settings) -> int:
    from app.quality import run_quality
    from app.spark import build_spark

    spark = build_spark(settings, "adattr-quality")
    report = run_quality(
        spark,
        settings.warehouse_uri,
        settings.data_dir / "gx",
        lookback_seconds=settings.attribution_lookback_seconds,
    )
    failed = len(report.failures)
    print(f"quality: {report.checked} expectations checked, {failed} failed")
    for f in report.failures:
        print(f"  FAILED {f.table}: {f.expectation}: {f.why}")
        print(f"         unexpected: {f.unexpected}; e.g. {f.examples}")
    if report.docs is not None:
        print(f"Data Docs: file://{report.docs.resolve()}")
    return 1 if failed else 0


def cmd_consume(args: argparse.Namespace, settings: Settings) -> int:
    from app.consumer import BudgetMetrics, BudgetStore, consume, read_budgets_csv
    from app.kafka_io import KafkaConnection

    metrics = None
    if settings.metrics_port and (args.until_idle or not args.report):
        from app.metrics import serve

        metrics = BudgetMetrics()
        serve(metrics.registry, settings)
    store = BudgetStore(settings.consumer_db_url)
    try:
        if args.budgets:
            budgets = read_budgets_csv(Path(args.budgets))
            store.load_budgets(budgets)
            print(f"budgets: {len(budgets)} campaigns from {args.budgets}")
        if not args.report or args.until_idle:
            stats = consume(
                KafkaConnection.of(settings),
                settings.output_topic,
                store,
                until_idle=args.until_idle,
                idle_seconds=args.idle_seconds,
                crash_at=settings.crash_at,
                metrics=metrics,
            )
            print(
                f"consume: {stats.records:,} records, {stats.applied:,} applied, "
                f"{stats.ignored_older:,} older than what is stored (ignored), "
                f"{len(stats.alerts)} new budget alert(s)"
            )
        if args.report:
            print(f"{'campaign':<12} {'spend':>16} {'daily budget':>14}")
            for campaign, spend, budget in store.spend_per_campaign():
                shown = f"{budget:.2f}" if budget is not None else "-"
                print(f"{campaign:<12} {spend:>16.6f} {shown:>14}")
            alerts = store.alerts()
            print(f"budget alerts: {len(alerts)}")
            for campaign, day, spend, budget in alerts:
                print(f"  {campaign} {day}: spend {spend:.6f} >= daily budget {budget:.2f}")
    finally:
        store.close()
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from app.demo import run_demo

    return run_demo(settings, events=args.events, seed=args.seed)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adattr",
        description="Real-time ad-event attribution with exactly-once results "
        "(Spark Structured Streaming + Delta Lake + Kafka). Settings come from ADATTR_* "
        "environment variables; see the README.",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="Spark's own output on the console too (ADATTR_VERBOSE=true); by default it goes to "
        "<data_dir>/logs/spark.log",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    up = add("up", cmd_up, "start the local Kafka broker (KRaft) and create the topics")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the broker")
    up.add_argument(
        "--secure",
        action="store_true",
        help="SASL_SSL only: a CA and broker certificate made on the spot, SCRAM users for the "
        "job, the budget service and the event producers, ACLs (data in <data_dir>/kafka-secure)",
    )
    add("down", cmd_down, "stop the local Kafka broker")
    add("status", cmd_status, "say what runs where")

    cluster = sub.add_parser(
        "cluster",
        help="a Spark standalone cluster (master, two workers) and a three-node Kafka cluster "
        "(replication 3, min.insync.replicas 2) on loopback",
        description="a Spark standalone cluster and a three-node Kafka cluster on loopback",
    )
    cluster_sub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    for name, help_text in (
        ("up", "start what is not running yet and create the topics"),
        ("down", "stop the workers, the master and the Kafka nodes"),
        ("status", "what runs where: PIDs, ports, master URL, bootstrap servers"),
    ):
        action = cluster_sub.add_parser(name, help=help_text, description=help_text)
        action.set_defaults(handler=cmd_cluster, cluster_command=name)
        if name == "up":
            action.add_argument("--timeout", type=float, default=180.0)

    dim = sub.add_parser("dim", help="manage the dim_ads dimension", description="manage dim_ads")
    dim_sub = dim.add_subparsers(dest="dim_command", required=True, metavar="ACTION")
    load = dim_sub.add_parser(
        "load",
        help="upsert a CSV (ad_id,campaign_id,advertiser_id,cpm,cpc) into dim_ads",
        description="upsert a CSV (ad_id,campaign_id,advertiser_id,cpm,cpc) into dim_ads",
    )
    load.add_argument("csv", help="CSV file with a header row")
    load.set_defaults(handler=cmd_dim_load)

    gen = add("generate", cmd_generate, "produce realistic ad events (and a truth file)")
    gen.add_argument("--events", type=int, default=10_000, help="records in the main segment")
    gen.add_argument("--seed", type=int, default=7, help="same seed, same events")
    gen.add_argument("--rate", type=float, default=None, help="records/s (default: max speed)")
    gen.add_argument("--duplicate-ratio", type=float, default=0.02)
    gen.add_argument("--late-ratio", type=float, default=0.001)
    gen.add_argument("--malformed-ratio", type=float, default=0.01)
    gen.add_argument("--users", type=int, default=500)
    gen.add_argument("--ads", type=int, default=50)
    gen.add_argument(
        "--step-ms",
        type=int,
        default=200,
        help="event time between consecutive records (default 200: 20k records span ~67 min)",
    )
    gen.add_argument("--truth", help="write the expected results to this JSON file")
    gen.add_argument("--dim-csv", help="write the matching dim_ads CSV to this file")
    gen.add_argument(
        "--budgets-csv", help="write daily budgets per campaign (half of them too small)"
    )
    gen.add_argument(
        "--segment",
        choices=("all", "main", "tail"),
        default="all",
        help="main: everything but the late events; tail: only the late events, to send "
        "after the job has processed main (so they are late whatever the batch boundaries)",
    )

    run = add("run", cmd_run, "run the attribution job (until SIGTERM/SIGINT)")
    run.add_argument(
        "--available-now", action="store_true", help="process everything in the topic, then exit"
    )
    replay = add(
        "replay",
        cmd_replay,
        "start a new checkpoint generation that re-reads the input from chosen offsets; "
        "tables stay exact (see README: Replays)",
    )
    where = replay.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--from-offsets",
        metavar="JSON",
        help='e.g. \'{"ad-events":{"0":1200,"3":0}}\'; partitions not named are not replayed',
    )
    where.add_argument(
        "--from-timestamp", metavar="ISO", help="e.g. 2026-11-20T10:00:00Z (Kafka record time)"
    )
    where.add_argument("--from-earliest", action="store_true", help="everything Kafka holds")
    replay.add_argument(
        "--keep-running",
        action="store_true",
        help="keep the job running after catching up (default: stop when caught up)",
    )
    add("summary", cmd_summary, "print spend per campaign from gold_ad_metrics_1m")
    verify = add("verify", cmd_verify, "compare the tables with a truth file; non-zero on any diff")
    verify.add_argument("--truth", required=True, help="truth file from `adattr generate --truth`")
    add("audit", cmd_audit, "check the ledger's invariants against the tables and Kafka")
    add(
        "reconcile",
        cmd_reconcile,
        "recompute every table from bronze in batch mode and diff it with the stream's",
    )
    drill = sub.add_parser(
        "drill",
        help="crash, replay, broker and worker drills on the local stack or cluster; non-zero "
        "on any discrepancy",
        description="Each drill works in its own folder and topics under <data_dir>/drills, "
        "generates traffic with a truth file, hurts the job, then verifies every table against "
        "the truth, audits the ledger and reconciles every table from bronze.",
    )
    drill_sub = drill.add_subparsers(dest="drill", required=True, metavar="DRILL")
    crash = drill_sub.add_parser(
        "crash", help="named crash points, then K SIGKILLs of the job's process tree"
    )
    crash.add_argument("--kills", type=int, default=5, help="random SIGKILLs (default 5)")
    crash.add_argument(
        "--points",
        default="all",
        help="named crash points to hit first, comma-separated, 'all' (default) or ''",
    )
    worker_drill = drill_sub.add_parser(
        "worker",
        help="on the local cluster: SIGKILL a Spark worker and its executor mid-batch, "
        "start a replacement, finish",
    )
    replay_drill = drill_sub.add_parser("replay", help="replays after a complete run")
    for d in (crash, replay_drill, worker_drill):
        d.add_argument("--seed", type=int, default=7)
        d.add_argument("--events", type=int, default=3000)
        d.set_defaults(handler=cmd_drill)
    drill_sub.choices["replay"].add_argument(
        "--full", action="store_true", help="several offsets, a timestamp and the earliest"
    )
    broker_drill = drill_sub.add_parser(
        "broker", help="SIGKILL the Kafka broker mid-run, restart it, finish"
    )
    broker_drill.add_argument("--seed", type=int, default=7)
    broker_drill.add_argument("--events", type=int, default=3000)
    broker_drill.add_argument(
        "--down-seconds",
        type=float,
        default=15.0,
        help="how long the single broker stays down (not with --cluster: there the node stays "
        "down until the job has committed two batches without it)",
    )
    for d in (crash, broker_drill):
        d.add_argument(
            "--cluster",
            action="store_true",
            help="submit the job to the local cluster (`adattr cluster up`; started if none "
            "runs) with spark-submit; the broker drill kills the node leading most input "
            "partitions and expects the job to carry on",
        )
    broker_drill.set_defaults(handler=cmd_drill)
    bench_cmd = add(
        "bench",
        cmd_bench,
        "throughput (B0 read, B2 at-least-once, B3 exactly-once), latency, memory; JSON + PNG",
    )
    bench_cmd.add_argument("--quick", action="store_true", help="4,000 events, 1 repeat (CI)")
    bench_cmd.add_argument("--events", type=int, help="records preloaded (default 200,000)")
    bench_cmd.add_argument("--repeats", type=int, help="runs of each variant (default 3)")
    bench_cmd.add_argument(
        "--fixed-only",
        action="store_true",
        help="only the fixed cost of a 1,000-record batch and of a batch of none",
    )
    bench_cmd.add_argument(
        "--publish-rows",
        type=int,
        default=0,
        metavar="N",
        help="only the publishing path: a batch that changed N gold rows, to Kafka in one "
        "transaction through the driver",
    )
    add(
        "quality",
        cmd_quality,
        "validate every table with the Great Expectations suites; writes Data Docs",
    )
    consume_cmd = add(
        "consume",
        cmd_consume,
        "the budget service: read ad-metrics (read_committed) into a database, exactly once",
    )
    consume_cmd.add_argument(
        "--until-idle", action="store_true", help="stop when caught up (no record for a while)"
    )
    consume_cmd.add_argument(
        "--idle-seconds", type=float, default=5.0, help="how long 'idle' is (default 5)"
    )
    consume_cmd.add_argument("--report", action="store_true", help="print spend and alerts")
    consume_cmd.add_argument("--budgets", help="CSV campaign_id,daily_budget to load first")
    demo = add("demo", cmd_demo, "start Kafka, generate traffic, run the job, verify, summarise")
    demo.add_argument("--events", type=int, default=20_000)
    demo.add_argument("--seed", type=int, default=7)
    return parser


def _keep_kafka_client_lines_in_a_file(path: Path) -> None:
    """librdkafka's own lines (a connection retried, the broker a drill stopped, a client closed
    while a broker is away) tell an adattr user nothing the command does not say itself: they go
    to ``path``; the command's errors still reach the console as exceptions. --verbose: stderr."""
    from app.kafka_io import CLIENT_LOG

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    CLIENT_LOG.addHandler(handler)
    CLIENT_LOG.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose:  # in the environment, so that the jobs a command starts inherit it
        os.environ["ADATTR_VERBOSE"] = "true"
    logging.basicConfig(level=logging.INFO, format="  %(message)s", stream=sys.stderr)
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"adattr: bad setting: {exc}", file=sys.stderr)
        return 2
    if not settings.verbose:
        _keep_kafka_client_lines_in_a_file(settings.data_dir / "logs" / "kafka-clients.log")
    try:
        if args.command in TALK_TO_KAFKA and settings.kafka_security_protocol != "PLAINTEXT":
            from app.kafka_io import KafkaConnection, check_access

            check_access(KafkaConnection.of(settings))  # a wrong password or CA: say so at once
        return int(args.handler(args, settings))
    except USER_ERRORS as exc:
        print(f"adattr {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from confluent_kafka import KafkaException

        if isinstance(exc, KafkaException):  # e.g. the broker went away mid-command
            from app.kafka_io import KafkaConnection, explain

            print(
                f"adattr {args.command}: {explain(exc, KafkaConnection.of(settings))}",
                file=sys.stderr,
            )
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
