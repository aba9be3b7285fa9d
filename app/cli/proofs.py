"""`adattr drill | bench`: the crash, replay, broker and worker drills, and the benchmark."""

from __future__ import annotations

import argparse

from app.cli.commands import Add, Subcommands
from app.runtime.errors import UserInputError
from app.runtime.settings import Settings


def cmd_drill(args: argparse.Namespace, settings: Settings) -> int:
    from app.tools import drills

    if args.drill == "worker":
        from app.tools.cluster_drills import drill_worker

        return drill_worker(settings, seed=args.seed, events=args.events)
    if args.drill == "cluster":
        from app.tools.cluster_drills import drill_cluster

        return drill_cluster(settings, seed=args.seed, events=args.events)
    if args.drill == "broker" and args.cluster:
        from app.tools.cluster_drills import drill_broker_cluster

        return drill_broker_cluster(settings, seed=args.seed, events=args.events)
    if args.drill == "crash":
        points = (
            drills.JOB_POINTS
            if args.points == "all"
            else tuple(p for p in args.points.split(",") if p)
        )
        if args.broker_outage is not None and (args.cluster or args.broker_outage < 0):
            raise UserInputError(
                "--broker-outage takes seconds >= 0 and the drill's own single broker "
                "(not --cluster: `drill broker --cluster` loses a node of the cluster's three)"
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
            replay=args.replay,
            broker_outage_s=args.broker_outage,
        )
    if args.drill == "replay":
        return drills.drill_replay(settings, seed=args.seed, events=args.events, full=args.full)
    return drills.drill_broker(
        settings, seed=args.seed, events=args.events, down_seconds=args.down_seconds
    )


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    from app.tools.bench import bench

    if args.soak is not None and args.soak <= 0:
        raise UserInputError(f"--soak takes minutes above 0, not {args.soak:g}")
    if args.rate is not None and args.soak is None:
        raise UserInputError("--rate is the soak's rate: use it with --soak")
    if args.rate is not None and args.rate <= 0:
        raise UserInputError(f"--rate takes events/s above 0, not {args.rate:g}")
    return bench(
        settings,
        quick=args.quick,
        events=args.events,
        repeats=args.repeats,
        only_fixed=args.fixed_only,
        publish_rows=args.publish_rows,
        soak_minutes=args.soak,
        soak_rate=args.rate,
    )


def add_commands(sub: Subcommands, add: Add) -> None:
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
    crash.add_argument(
        "--replay",
        action="store_true",
        help="then the replay drill's replay (partition 0 from its middle) on what the crashes "
        "left: every table must be unchanged",
    )
    crash.add_argument(
        "--broker-outage",
        type=float,
        metavar="SECONDS",
        help="the broker drill's outage in the last run: once it committed a batch, the drill's "
        "own broker is SIGKILLed and restarted SECONDS later (start no local broker before)",
    )
    worker_drill = drill_sub.add_parser(
        "worker",
        help="on the local cluster: SIGKILL a Spark worker and its executor mid-batch, "
        "start a replacement, finish",
    )
    cluster_drill = drill_sub.add_parser(
        "cluster",
        help="on the local cluster, in one run: the worker drill's fault, then the broker "
        "drill's (the Kafka node leading most input partitions), then finish",
    )
    replay_drill = drill_sub.add_parser("replay", help="replays after a complete run")
    for d in (crash, replay_drill, worker_drill, cluster_drill):
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
    bench_cmd.add_argument(
        "--quick", action="store_true", help="4,000 events, 1 repeat, 15 s of latency (CI)"
    )
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
    bench_cmd.add_argument(
        "--soak",
        type=float,
        nargs="?",
        const=30.0,
        metavar="MINUTES",
        help="only the soak: the job for MINUTES (default 30) at half of B3's sustained rate "
        "(measured first, one run), 1 s trigger; batch time, latency and files per table for "
        "every 5 minutes",
    )
    bench_cmd.add_argument(
        "--rate", type=float, help="--soak at this many events/s instead (B3 is not measured)"
    )
