"""The ``adattr`` command line: settings are read here, once, and passed down.

Heavy imports (pyspark, confluent_kafka) happen inside the handlers, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from app.broker import BrokerError, LocalBroker
from app.settings import Settings, SettingsError

Handler = Callable[[argparse.Namespace, Settings], int]


def local_broker(settings: Settings) -> LocalBroker:
    first = settings.bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise BrokerError(
            f"ADATTR_BOOTSTRAP_SERVERS={settings.bootstrap_servers} is not a loopback address; "
            "`adattr up` only starts a local broker (use your cluster's own tooling for others)"
        )
    return LocalBroker(
        data_dir=settings.data_dir / "kafka",
        jars_dir=settings.jars_dir,
        host="127.0.0.1" if host == "localhost" else host,
        port=int(port),
        controller_port=settings.kafka_controller_port,
    )


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from app.kafka_io import app_topics, ensure_topics

    broker = local_broker(settings)
    was_running = broker.status().running
    status = broker.start(timeout=args.timeout)
    created = ensure_topics(status.bootstrap, app_topics(settings))
    print(f"{'already running' if was_running else 'started'}: {status.describe()}")
    print(f"topics created: {', '.join(created) or 'none (all present)'}")
    return 0


def cmd_down(args: argparse.Namespace, settings: Settings) -> int:
    broker = local_broker(settings)
    print("kafka: stopped" if broker.stop() else "kafka: was not running")
    return 0


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    broker = local_broker(settings)
    status = broker.status()
    print(status.describe())
    print(f"warehouse: {settings.warehouse.resolve()}")
    print(f"checkpoints: {settings.checkpoints.resolve()}")
    print(f"topics: in {settings.input_topic}, out {settings.output_topic}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adattr",
        description="Real-time ad-event attribution with exactly-once results "
        "(Spark Structured Streaming + Delta Lake + Kafka). Settings come from ADATTR_* "
        "environment variables; see the README.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    up = add("up", cmd_up, "start the local Kafka broker (KRaft) and create the topics")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for the broker")
    add("down", cmd_down, "stop the local Kafka broker")
    add("status", cmd_status, "say what runs where")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"adattr: bad setting: {exc}", file=sys.stderr)
        return 2
    from app.errors import USER_ERRORS

    try:
        return int(args.handler(args, settings))
    except USER_ERRORS as exc:
        print(f"adattr {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
