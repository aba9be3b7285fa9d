"""Kafka plumbing shared by the CLI, the generator and the tests: topic set-up and client configs.

Delivery assumptions: producers here are idempotent (``enable.idempotence``) so a retried send
cannot duplicate a record inside Kafka; a producer *application* that re-sends after a timeout
still can, which is why events carry an ``event_id`` and the job deduplicates on it. Consumers
say ``isolation.level`` explicitly every time, because librdkafka defaults to read_committed and
the Java client to read_uncommitted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from app.settings import Settings


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def app_topics(settings: Settings) -> list[TopicSpec]:
    return [
        TopicSpec(settings.input_topic, settings.input_partitions, {}),
        TopicSpec(settings.output_topic, settings.input_partitions, {}),
        # One marker per (generation, batch), keyed by it: compaction keeps the latest only.
        TopicSpec(settings.control_topic, 1, {"cleanup.policy": "compact"}),
    ]


def ensure_topics(bootstrap: str, topics: list[TopicSpec], timeout: float = 30.0) -> list[str]:
    """Creates the topics that do not exist yet; returns the names it created."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [
        NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, config=t.config)
        for t in topics
        if t.name not in existing
    ]
    if not wanted:
        return []
    created = []
    for name, future in admin.create_topics(wanted, operation_timeout=timeout).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    _wait_for_leaders(admin, [t.name for t in topics], timeout)
    return created


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout: float) -> None:
    """A new topic answers "not leader" until its partitions have leaders: wait for that."""
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=timeout).topics
        missing = [
            n
            for n in names
            if n not in topics
            or topics[n].error is not None
            or any(p.leader < 0 for p in topics[n].partitions.values())
        ]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise KafkaException(
                f"topics without partition leaders after {timeout:.0f}s: {missing}"
            )
        time.sleep(0.1)


def producer_config(bootstrap: str, **extra: object) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        # Broker-side dedup of retried sends, and ordering per partition under retries.
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "compression.type": "lz4",
        **extra,
    }


def consumer_config(
    bootstrap: str, group: str, *, committed_only: bool, **extra: object
) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        # Stated, never defaulted: read_committed hides aborted and open transactions.
        "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **extra,
    }
