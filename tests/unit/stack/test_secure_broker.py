"""The secure local broker's pieces without a JVM: its TLS material, its config, its ACLs."""

from __future__ import annotations

import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ResourcePatternType

from app.runtime.kafka_io import BUDGET_GROUP, KafkaConnection, explain
from app.runtime.settings import Settings
from app.stack import secure_kafka as sk
from app.stack.broker import BrokerError, LocalBroker, _overlay, local_broker


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _properties(text: str) -> dict[str, str]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def test_overlay_replaces_keys_in_place_and_adds_the_rest() -> None:
    base = "# a comment\nlisteners=PLAINTEXT://h:1\nlog.dirs=/d\n"
    overlay = "# why\nlisteners=SASL_SSL://h:1\nsasl.enabled.mechanisms=SCRAM-SHA-512\n"

    merged = _overlay(base, overlay)

    assert merged.splitlines() == [
        "# a comment",
        "listeners=SASL_SSL://h:1",
        "log.dirs=/d",
        "sasl.enabled.mechanisms=SCRAM-SHA-512",
    ]


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> sk.SecureKafka:
    secure = sk.SecureKafka(tmp_path_factory.mktemp("secure"))
    secure.prepare("127.0.0.1")
    return secure


def test_the_broker_certificate_is_signed_by_the_ca_for_the_loopback_address(
    material: sk.SecureKafka,
) -> None:
    tls = material.tls_dir
    verified = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            tls / "ca.pem",
            "-purpose",
            "sslserver",
            tls / "broker.crt",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr
    shown = subprocess.run(
        ["openssl", "x509", "-in", tls / "broker.crt", "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in shown and "DNS:localhost" in shown
    # One file with the key (unencrypted PKCS#8, what Kafka's PEM key store reads) and the cert.
    pem = (tls / "broker.pem").read_text()
    # pragma: allowlist nextline secret (names the PEM header, holds no key)
    assert "-----BEGIN PRIVATE KEY-----" in pem and "-----BEGIN CERTIFICATE-----" in pem


def test_secrets_are_private_and_made_once(material: sk.SecureKafka) -> None:
    assert _mode(material.secrets_dir) == 0o700
    passwords = {user: material.password_file(user) for user in (sk.ADMIN, *sk.USERS)}
    assert all(_mode(p) == 0o600 for p in passwords.values())
    assert _mode(material.tls_dir / "ca.key") == 0o600
    assert _mode(material.tls_dir / "broker.pem") == 0o600
    before = {user: p.read_text() for user, p in passwords.items()}
    assert len(set(before.values())) == len(before)  # one password per user

    material.prepare("127.0.0.1")

    assert {user: p.read_text() for user, p in passwords.items()} == before


def test_the_secure_config_has_no_plaintext_listener_and_denies_by_default(
    material: sk.SecureKafka, tmp_path: Path
) -> None:
    broker = LocalBroker(
        data_dir=tmp_path, jars_dir=tmp_path, port=19001, controller_port=19002, secure=material
    )

    config = broker._write_config()

    assert _mode(config) == 0o600  # it holds the broker's own password
    props = _properties(config.read_text())
    assert props["listeners"] == "SASL_SSL://127.0.0.1:19001,CONTROLLER://127.0.0.1:19002"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:19001"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SSL"
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:adattr-admin;User:CN=adattr-broker"
    assert props["log.dirs"] == str(tmp_path.resolve() / "data")  # the base file's keys stay
    assert "PLAINTEXT://" not in config.read_text()


def _grants(settings: Settings) -> dict[str, set[tuple[str, str, str, str]]]:
    out: dict[str, set[tuple[str, str, str, str]]] = {}
    for b in sk.acl_bindings(settings):
        pattern = "*" if b.resource_pattern_type == ResourcePatternType.PREFIXED else ""
        out.setdefault(b.principal, set()).add(
            (b.restype.name, b.name + pattern, b.operation.name, b.permission_type.name)
        )
    return out


def test_each_user_may_do_its_own_work_only() -> None:
    settings = replace(Settings.from_env({}), input_topic="in", output_topic="out")
    grants = _grants(settings)

    assert set(grants) == {"User:adattr-job", "User:adattr-budget", "User:adattr-events"}
    assert all(permission == "ALLOW" for g in grants.values() for *_, permission in g)
    ops = {user: {g[:3] for g in found} for user, found in grants.items()}
    assert ops["User:adattr-events"] == {("TOPIC", "in", "WRITE"), ("TOPIC", "in", "DESCRIBE")}
    assert ops["User:adattr-budget"] == {
        ("TOPIC", "out", "READ"),
        ("TOPIC", "out", "DESCRIBE"),
        ("GROUP", BUDGET_GROUP, "READ"),
    }
    job = ops["User:adattr-job"]
    assert ("TOPIC", "in", "READ") in job and ("TOPIC", "in", "WRITE") not in job
    assert ("TOPIC", "out", "WRITE") in job and ("TOPIC", "adattr-control", "WRITE") in job
    txn = settings.publisher_transactional_id
    assert {("TRANSACTIONAL_ID", txn, "WRITE"), ("TRANSACTIONAL_ID", txn, "DESCRIBE")} <= job
    assert not any(op in ("ALL", "CREATE", "ALTER", "DELETE") for _, _, op in job)
    assert {kind for kind, *_ in job} == {"TOPIC", "TRANSACTIONAL_ID", "GROUP"}


def test_the_local_broker_matches_the_protocol_it_is_asked_for(tmp_path: Path) -> None:
    base = replace(Settings.from_env({}), data_dir=tmp_path)
    sasl = replace(base, kafka_security_protocol="SASL_SSL")

    assert local_broker(base).secure is None
    assert local_broker(base, secure=True).data_dir == tmp_path / "kafka-secure"
    assert local_broker(sasl, secure=True).secure is not None
    with pytest.raises(BrokerError, match=r"SASL_SSL: `adattr up --secure` starts"):
        local_broker(sasl)
    with pytest.raises(BrokerError, match=r"SSL: the local broker listens on PLAINTEXT, or"):
        local_broker(replace(base, kafka_security_protocol="SSL"), secure=True)


def test_a_refusal_names_the_user_and_what_it_was_refused() -> None:
    kafka = KafkaConnection("h:1", "SASL_SSL", "SCRAM-SHA-512", "adattr-budget", "x", "")
    refused = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    other = KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT))

    assert explain(refused, kafka).startswith(
        "Kafka refused User:adattr-budget at h:1: no ACL allows it on the topic "
        "(TOPIC_AUTHORIZATION_FAILED"
    )
    assert explain(other, kafka).startswith("Kafka error: ")
    assert explain(other, kafka).endswith("(_MSG_TIMED_OUT)")
