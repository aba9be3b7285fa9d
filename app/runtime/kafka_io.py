"""Kafka plumbing shared by the CLI, the generator and the tests: topic set-up and client configs.

Delivery assumptions: producers here are idempotent (``enable.idempotence``) so a retried send
cannot duplicate a record inside Kafka; a producer *application* that re-sends after a timeout
still can, which is why events carry an ``event_id`` and the job deduplicates on it. Consumers
say ``isolation.level`` explicitly every time, because librdkafka defaults to read_committed and
the Java client to read_uncommitted.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from app.runtime.settings import Settings, read_password

# librdkafka's own log lines (connection retries, a broker going away in a drill) go to this
# logger instead of straight to stderr; the CLI sends it to a file unless --verbose.
CLIENT_LOG = logging.getLogger("adattr.kafka-client")
# The consumer group of `adattr consume` (the budget service); ACLs on a secure broker name it.
BUDGET_GROUP = "adattr-budget-service"

_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@dataclass(frozen=True)
class KafkaConnection:
    """Where Kafka is and how to authenticate to it: the one place the security settings become
    each client's own keys (librdkafka's for the publisher, consumers, admin calls, generator;
    the Java client's, prefixed ``kafka.``, for the Spark source). Settings were validated."""

    bootstrap: str
    protocol: str = "PLAINTEXT"
    mechanism: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""
    client_pem: str = ""

    @classmethod
    def of(cls, settings: Settings) -> KafkaConnection:
        password = settings.kafka_sasl_password
        if settings.kafka_sasl_password_file:
            password = read_password(Path(settings.kafka_sasl_password_file))
        return cls(
            settings.bootstrap_servers,
            settings.kafka_security_protocol,
            settings.kafka_sasl_mechanism,
            settings.kafka_sasl_username,
            password,
            _absolute(settings.kafka_ssl_ca_file),
            _absolute(settings.kafka_ssl_client_pem),
        )

    def librdkafka(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": self.protocol,
            "logger": CLIENT_LOG,
        }
        if self.protocol.startswith("SASL_"):
            conf |= {
                "sasl.mechanism": self.mechanism,
                "sasl.username": self.username,
                "sasl.password": self.password,
            }
        if self.ca_file:
            conf["ssl.ca.location"] = self.ca_file
        if self.client_pem:
            conf |= {
                "ssl.certificate.location": self.client_pem,
                "ssl.key.location": self.client_pem,
            }
        return conf

    def spark_options(self) -> dict[str, str]:
        """The Spark Kafka source's options. The JAAS line holds the password: Spark redacts
        option values that match ``spark.redaction.regex`` ("password") in plans and the UI."""
        opts = {
            "kafka.bootstrap.servers": self.bootstrap,
            "kafka.security.protocol": self.protocol,
        }
        if self.protocol.startswith("SASL_"):
            opts["kafka.sasl.mechanism"] = self.mechanism
            opts["kafka.sasl.jaas.config"] = (
                f"{_JAAS_MODULES[self.mechanism]} required "
                f'username="{_jaas_quote(self.username)}" password="{_jaas_quote(self.password)}";'
            )
        if self.ca_file:
            opts |= {
                "kafka.ssl.truststore.type": "PEM",
                "kafka.ssl.truststore.location": self.ca_file,
            }
        if self.client_pem:
            opts |= {
                "kafka.ssl.keystore.type": "PEM",
                "kafka.ssl.keystore.location": self.client_pem,
            }
        return opts


def _absolute(path: str) -> str:
    """The path made absolute, its symlinks kept: a Kubernetes secret volume's files are
    symlinks into a per-pod folder (``..data`` -> ``..2026_11_26_...``), so a resolved path
    would name a folder no executor pod has, and none after the secret rotates."""
    return os.path.abspath(path) if path else ""


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


class KafkaAccessError(RuntimeError):
    """Kafka could not be reached, trusted or logged in to, or it refused an operation: the
    message is one line naming the cause."""


_AUTHORIZATION = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "consumer group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
}


def check_access(kafka: KafkaConnection, timeout: float = 20.0) -> None:
    """Connects once and fails fast, naming the cause, when the broker cannot be trusted (an
    unknown CA) or refuses the credentials. librdkafka reports those through its error callback
    only; a metadata call just waits out its timeout and says "transport failure"."""
    from confluent_kafka.admin import AdminClient

    seen: list[KafkaError] = []
    conf: dict[str, Any] = {**kafka.librdkafka(), "error_cb": seen.append}
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=1)
            return
        except KafkaException as exc:
            last = exc.args[0]
        admin.poll(0)  # serves the error callback
        for error in seen:
            if error.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
                # librdkafka prefixes the broker's address: said once, at the front.
                cause = re.sub(r"^\S+://\S+: ", "", error.str())
                raise KafkaAccessError(
                    f"Kafka at {kafka.bootstrap} ({kafka.protocol}{_as_user(kafka)}): {cause}"
                )
        if time.monotonic() > deadline:
            found = seen[-1].str() if seen else str(last)
            raise KafkaAccessError(f"no Kafka broker answered at {kafka.bootstrap}: {found}")


def explain(exc: KafkaException, kafka: KafkaConnection) -> str:
    """One line for a Kafka error: who was refused what when an ACL is missing."""
    error = exc.args[0]
    if not isinstance(error, KafkaError):
        return f"Kafka error: {error}"
    resource = _AUTHORIZATION.get(error.code())
    if resource is None:
        return f"Kafka error: {error.str()} ({error.name()})"
    who = f"User:{kafka.username}" if kafka.protocol.startswith("SASL_") else "this client"
    return (
        f"Kafka refused {who} at {kafka.bootstrap}: no ACL allows it on the {resource} "
        f"({error.name()}: {error.str()})"
    )


def _as_user(kafka: KafkaConnection) -> str:
    return f" as {kafka.username}" if kafka.protocol.startswith("SASL_") else ""


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


def admin_client(kafka: KafkaConnection) -> AdminClient:
    return AdminClient(kafka.librdkafka())


def ensure_topics(
    kafka: KafkaConnection, topics: list[TopicSpec], timeout: float = 30.0
) -> list[str]:
    """Creates the topics that do not exist yet; returns the names it created."""
    admin = admin_client(kafka)
    existing = set(admin.list_topics(timeout=timeout).topics)
    # Replicas: the broker's default.replication.factor (1 on the local broker, 3 on `adattr
    # cluster`, whatever a production cluster sets).
    wanted = [
        NewTopic(t.name, num_partitions=t.partitions, replication_factor=-1, config=t.config)
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


def delete_topics(kafka: KafkaConnection, names: list[str], timeout: float = 30.0) -> list[str]:
    """Deletes those of the topics that exist and waits until the broker no longer lists them;
    returns the names still listed when ``timeout`` ran out (none: all gone)."""
    admin = admin_client(kafka)
    doomed = [name for name in names if name in admin.list_topics(timeout=10).topics]
    if not doomed:
        return []
    for future in admin.delete_topics(doomed, operation_timeout=timeout).values():
        future.result()
    deadline = time.monotonic() + timeout
    while left := sorted(set(doomed) & set(admin.list_topics(timeout=10).topics)):
        if time.monotonic() > deadline:
            return left
        time.sleep(0.2)  # the deletion is asynchronous: poll until the broker stops listing them
    return []


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


def producer_config(kafka: KafkaConnection, **extra: object) -> dict[str, object]:
    return {
        **kafka.librdkafka(),
        # Broker-side dedup of retried sends, and ordering per partition under retries.
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 20,
        "batch.size": 1_000_000,
        "compression.type": "lz4",
        **extra,
    }


def consumer_config(
    kafka: KafkaConnection, group: str, *, committed_only: bool, **extra: object
) -> dict[str, object]:
    return {
        **kafka.librdkafka(),
        "group.id": group,
        # Stated, never defaulted: read_committed hides aborted and open transactions.
        "isolation.level": "read_committed" if committed_only else "read_uncommitted",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **extra,
    }
