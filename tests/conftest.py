"""Shared fixtures: one SparkSession per test run, and real Kafka brokers.

The broker fixture uses ``ADATTR_BOOTSTRAP_SERVERS`` when it is set (a broker you run) and
otherwise starts its own ``kafka.Kafka`` from the fetched jars on free loopback ports in a
temporary folder, and stops it at the end of the run, so no test depends on a process started
by hand and none is left behind. The secure broker (SASL_SSL, SCRAM users, ACLs) is started the
way a user starts it, with ``adattr up --secure``, and stopped with ``adattr down``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from app.runtime.settings import Settings
from app.stack.broker import LocalBroker, free_port
from app.stack.secure_kafka import MECHANISM, SecureKafka
from tests.builders import TEST_JVM_OPTIONS, adattr_env, run_adattr


@pytest.fixture(scope="session")
def base_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    root = tmp_path_factory.mktemp("adattr")
    return replace(
        Settings.from_env({}),
        warehouse=str(root / "warehouse"),
        checkpoints=root / "checkpoints",
        data_dir=root / "data",
        spark_master="local[2]",
        shuffle_partitions=2,
        spark_driver_memory="2g",
        verbose=True,  # the in-process JVM's output stays in what pytest captures
        # TEST_JVM_OPTIONS are for the short JVMs of subprocesses: this session's JVM lives
        # as long as the run and runs whole jobs, which C2 pays off (an in-process job test,
        # test_writes_are_idempotent_even_without_delta_txn, took 105 s on C1 only, 63 s on C2).
    )


@pytest.fixture(scope="session")
def kafka_bootstrap(
    tmp_path_factory: pytest.TempPathFactory, base_settings: Settings
) -> Iterator[str]:
    given = os.environ.get("ADATTR_BOOTSTRAP_SERVERS")
    if given:
        yield given
        return
    broker = LocalBroker(
        data_dir=tmp_path_factory.mktemp("kafka"),
        jars_dir=base_settings.jars_dir,
        port=free_port(),
        controller_port=free_port(),
        java_options=Settings.from_env({"ADATTR_JVM_OPTIONS": TEST_JVM_OPTIONS}).java_options,
    )
    broker.start(timeout=120)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark(base_settings: Settings):  # type: ignore[no-untyped-def]
    from app.runtime.spark import build_spark

    session = build_spark(base_settings, app_name="adattr-tests")
    yield session
    session.stop()


def isolated_settings(base: Settings, bootstrap: str, root: Path) -> Settings:
    """Own warehouse, checkpoints and topics under root, on the shared broker."""
    suffix = root.name.replace("_", "-")[-40:]
    return replace(
        base,
        bootstrap_servers=bootstrap,
        warehouse=str(root / "warehouse"),
        checkpoints=root / "checkpoints",
        input_topic=f"ad-events-{suffix}",
        output_topic=f"ad-metrics-{suffix}",
        control_topic=f"adattr-control-{suffix}",
    )


@pytest.fixture
def settings(base_settings: Settings, tmp_path: Path, kafka_bootstrap: str) -> Settings:
    return isolated_settings(base_settings, kafka_bootstrap, tmp_path)


@dataclass(frozen=True)
class SecureBroker:
    """The broker of ``adattr up --secure``, and the settings that connect to it as a user."""

    bootstrap: str
    kafka: SecureKafka
    env: dict[str, str]  # what `adattr up --secure` ran with
    up_output: str

    def provision(self, settings: Settings) -> None:
        """The topics and ACLs of ``settings`` (own topics per test), made as the admin."""
        self.kafka.provision(replace(settings, bootstrap_servers=self.bootstrap), self.bootstrap)

    def as_user(self, settings: Settings, user: str) -> Settings:
        return replace(
            settings,
            bootstrap_servers=self.bootstrap,
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism=MECHANISM,
            kafka_sasl_username=user,
            kafka_sasl_password_file=str(self.kafka.password_file(user)),
            kafka_ssl_ca_file=str(self.kafka.ca_file),
        )


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    data_dir = tmp_path_factory.mktemp("secure")
    env = adattr_env(
        data_dir=str(data_dir),
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        kafka_controller_port=str(free_port()),
    )
    up = run_adattr(env, "up", "--secure", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield SecureBroker(
            env["ADATTR_BOOTSTRAP_SERVERS"], SecureKafka(data_dir / "kafka-secure"), env, up.stdout
        )
    finally:
        down = run_adattr(env, "down", timeout=120)
        assert "kafka (secure): stopped" in down.stdout, down.stdout + down.stderr
