"""`adattr up | down | status | cluster`: the local Kafka broker (plain or secure) and the local
Spark + Kafka cluster."""

from __future__ import annotations

import argparse

from app.cli.commands import Add, Subcommands
from app.runtime.settings import Settings
from app.stack.broker import (
    BrokerError,
    broker_at,
    local_broker,
    port_is_free,
    wait_until_ready,
)


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.kafka_io import KafkaConnection, app_topics, ensure_topics

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
    from app.stack.secure_kafka import ROLES

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
    other = broker_at(settings, secure=not secure).status()
    if other.running:
        raise BrokerError(
            f"{other.describe()}; `adattr down` stops it, then `adattr up"
            f"{' --secure' if secure else ''}` starts the other one"
        )


def cmd_down(args: argparse.Namespace, settings: Settings) -> int:
    stopped = [b for b in (False, True) if broker_at(settings, secure=b).stop()]
    names = {False: "kafka", True: "kafka (secure)"}
    print(
        f"{' and '.join(names[b] for b in stopped)}: stopped"
        if stopped
        else "kafka: was not running"
    )
    return 0


def cmd_cluster(args: argparse.Namespace, settings: Settings) -> int:
    from app.runtime.kafka_io import KafkaConnection, app_topics, ensure_topics
    from app.stack.cluster import LocalCluster

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
    plain, secure = (broker_at(settings, secure=b).status() for b in (False, True))
    print(secure.describe() if secure.running and not plain.running else plain.describe())
    print(f"warehouse: {settings.warehouse_uri}")
    print(f"checkpoints: {settings.checkpoints.resolve()}")
    print(f"topics: in {settings.input_topic}, out {settings.output_topic}")
    return 0


def add_commands(sub: Subcommands, add: Add) -> None:
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
