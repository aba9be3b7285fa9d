"""Kafka security settings: validated at the edge, mapped in one place to librdkafka's keys and
to the Java client's (Spark source), and the password never printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.runtime.kafka_io import CLIENT_LOG, KafkaConnection, consumer_config, producer_config
from app.runtime.settings import Settings, SettingsError

PASSWORD = 'pa"ss\\word-7f3a'  # a quote and a backslash: the JAAS line must escape both
CERT = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
# pragma: allowlist nextline secret (a test value, not a real one)
KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"


@pytest.fixture
def pems(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "ca.pem").write_text(CERT)
    (tmp_path / "client.pem").write_text(CERT + KEY)
    (tmp_path / "password").write_text(PASSWORD + "\n")
    return {
        "ADATTR_KAFKA_SSL_CA_FILE": str(tmp_path / "ca.pem"),
        "ADATTR_KAFKA_SSL_CLIENT_PEM": str(tmp_path / "client.pem"),
        "ADATTR_KAFKA_SASL_PASSWORD_FILE": str(tmp_path / "password"),
    }


def sasl_ssl(**more: str) -> dict[str, str]:
    return {
        "ADATTR_BOOTSTRAP_SERVERS": "kafka-1:9094,kafka-2:9094",
        "ADATTR_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "ADATTR_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "ADATTR_KAFKA_SASL_USERNAME": "adattr-job",
        **more,
    }


def test_plaintext_by_default_adds_no_security_key() -> None:
    kafka = KafkaConnection.of(Settings.from_env({}))
    assert kafka.librdkafka() == {
        "bootstrap.servers": "127.0.0.1:9092",
        "security.protocol": "PLAINTEXT",
        "logger": CLIENT_LOG,
    }
    assert kafka.spark_options() == {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "kafka.security.protocol": "PLAINTEXT",
    }


def test_sasl_ssl_with_mutual_tls_maps_to_both_clients(pems: dict[str, str]) -> None:
    kafka = KafkaConnection.of(Settings.from_env(sasl_ssl(**pems)))
    client_pem = pems["ADATTR_KAFKA_SSL_CLIENT_PEM"]
    rd = kafka.librdkafka()
    assert {k: v for k, v in rd.items() if k != "logger"} == {
        "bootstrap.servers": "kafka-1:9094,kafka-2:9094",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "adattr-job",
        "sasl.password": PASSWORD,  # the file's first line, without its line end
        "ssl.ca.location": pems["ADATTR_KAFKA_SSL_CA_FILE"],
        "ssl.certificate.location": client_pem,
        "ssl.key.location": client_pem,
    }
    spark = kafka.spark_options()
    assert spark == {
        "kafka.bootstrap.servers": "kafka-1:9094,kafka-2:9094",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        # pragma: allowlist nextline secret (a test value, not a real one)
        'required username="adattr-job" password="pa\\"ss\\\\word-7f3a";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": pems["ADATTR_KAFKA_SSL_CA_FILE"],
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.location": client_pem,
    }
    # Every librdkafka client adattr makes carries them: producers, consumers, admin calls.
    for conf in (producer_config(kafka), consumer_config(kafka, "g", committed_only=True)):
        assert conf["sasl.password"] == PASSWORD and conf["security.protocol"] == "SASL_SSL"


def test_a_pem_behind_a_symlink_is_named_by_its_path_not_its_target(tmp_path: Path) -> None:
    """A Kubernetes secret volume: ``ca.pem`` -> ``..data/ca.pem``, ``..data`` -> a per-pod
    folder. The executors get the driver's path, so it must be the one every pod has."""
    volume = tmp_path / "kafka"
    (volume / "..2026_11_26_10_00_00.123").mkdir(parents=True)
    (volume / "..2026_11_26_10_00_00.123" / "ca.pem").write_text(CERT)
    (volume / "..data").symlink_to("..2026_11_26_10_00_00.123")
    (volume / "ca.pem").symlink_to("..data/ca.pem")
    env = sasl_ssl(
        ADATTR_KAFKA_SASL_PASSWORD="s3cret", ADATTR_KAFKA_SSL_CA_FILE=str(volume / "ca.pem")
    )
    kafka = KafkaConnection.of(Settings.from_env(env))
    assert kafka.spark_options()["kafka.ssl.truststore.location"] == str(volume / "ca.pem")
    assert kafka.librdkafka()["ssl.ca.location"] == str(volume / "ca.pem")


def test_plain_mechanism_uses_the_plain_login_module() -> None:
    env = sasl_ssl(ADATTR_KAFKA_SASL_MECHANISM="PLAIN", ADATTR_KAFKA_SASL_PASSWORD="s3cret")
    jaas = KafkaConnection.of(Settings.from_env(env)).spark_options()["kafka.sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.plain.PlainLoginModule required ")


def test_the_password_is_never_in_a_repr_or_an_error(pems: dict[str, str]) -> None:
    env = sasl_ssl(ADATTR_KAFKA_SASL_PASSWORD=PASSWORD)
    settings = Settings.from_env(env)
    assert PASSWORD not in repr(settings)
    assert PASSWORD not in repr(KafkaConnection.of(settings))
    both = {**env, "ADATTR_KAFKA_SASL_PASSWORD_FILE": pems["ADATTR_KAFKA_SASL_PASSWORD_FILE"]}
    with pytest.raises(SettingsError) as raised:
        Settings.from_env(both)
    assert PASSWORD not in str(raised.value) and "exactly one" in str(raised.value)
    plaintext = {"ADATTR_KAFKA_SASL_PASSWORD": PASSWORD}
    with pytest.raises(SettingsError, match="ADATTR_KAFKA_SASL_PASSWORD=<hidden>") as raised:
        Settings.from_env(plaintext)
    assert PASSWORD not in str(raised.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"ADATTR_KAFKA_SECURITY_PROTOCOL": "TLS"},
            "ADATTR_KAFKA_SECURITY_PROTOCOL='TLS': must be one of PLAINTEXT, SSL",
        ),
        (sasl_ssl(ADATTR_KAFKA_SASL_MECHANISM=""), "ADATTR_KAFKA_SASL_MECHANISM=''"),
        (
            sasl_ssl(ADATTR_KAFKA_SASL_MECHANISM="GSSAPI", ADATTR_KAFKA_SASL_PASSWORD="x"),
            "must be one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN",
        ),
        (
            sasl_ssl(ADATTR_KAFKA_SASL_USERNAME="", ADATTR_KAFKA_SASL_PASSWORD="x"),
            "SASL_SSL needs a user name",
        ),
        (sasl_ssl(), "needs the password from exactly one of"),
        (
            sasl_ssl(ADATTR_KAFKA_SASL_PASSWORD_FILE="/nonexistent/pw"),
            "ADATTR_KAFKA_SASL_PASSWORD_FILE='/nonexistent/pw': cannot be read",
        ),
        (
            {"ADATTR_KAFKA_SASL_USERNAME": "u"},
            "ADATTR_KAFKA_SASL_USERNAME='u': is for SASL_SSL or SASL_PLAINTEXT, not PLAINTEXT",
        ),
        (
            {"ADATTR_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "ADATTR_KAFKA_SSL_CA_FILE": "x"},
            "ADATTR_KAFKA_SASL_MECHANISM",  # the first thing missing is said first
        ),
        (
            {"ADATTR_KAFKA_SSL_CA_FILE": "/etc/hostname"},
            "is for SSL or SASL_SSL, not PLAINTEXT",
        ),
    ],
)
def test_bad_security_settings_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as raised:
        Settings.from_env(env)
    assert message in str(raised.value)


def test_pem_files_are_checked_for_what_each_client_needs(tmp_path: Path) -> None:
    (tmp_path / "empty.pem").write_text("not a pem\n")
    (tmp_path / "cert-only.pem").write_text(CERT)
    (tmp_path / "encrypted.pem").write_text(
        CERT + KEY.replace("PRIVATE KEY", "ENCRYPTED PRIVATE KEY")
    )
    ssl = {"ADATTR_KAFKA_SECURITY_PROTOCOL": "SSL"}
    with pytest.raises(SettingsError, match="holds no PEM certificate"):
        Settings.from_env({**ssl, "ADATTR_KAFKA_SSL_CA_FILE": str(tmp_path / "empty.pem")})
    for bad in ("cert-only.pem", "encrypted.pem"):
        with pytest.raises(SettingsError, match="no unencrypted PKCS#8 private key"):
            Settings.from_env({**ssl, "ADATTR_KAFKA_SSL_CLIENT_PEM": str(tmp_path / bad)})
    settings = Settings.from_env(
        {**ssl, "ADATTR_KAFKA_SSL_CA_FILE": str(tmp_path / "cert-only.pem")}
    )
    assert KafkaConnection.of(settings).librdkafka()["security.protocol"] == "SSL"
