"""Shared fixtures: one SparkSession per test run, and a real Kafka broker.

The broker fixture uses ``ADATTR_BOOTSTRAP_SERVERS`` when it is set (a broker you run) and
otherwise starts its own ``kafka.Kafka`` from the fetched jars on free loopback ports in a
temporary folder, and stops it at the end of the run, so no test depends on a process started
by hand and none is left behind.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.broker import LocalBroker, free_port
from app.settings import Settings


@pytest.fixture(scope="session")
def base_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    root = tmp_path_factory.mktemp("adattr")
    return replace(
        Settings.from_env({}),
        warehouse=root / "warehouse",
        checkpoints=root / "checkpoints",
        data_dir=root / "data",
        spark_master="local[2]",
        shuffle_partitions=2,
        spark_driver_memory="2g",
        verbose=True,  # the in-process JVM's output stays in what pytest captures
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
    )
    broker.start(timeout=120)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark(base_settings: Settings):  # type: ignore[no-untyped-def]
    from app.spark import build_spark

    session = build_spark(base_settings, app_name="adattr-tests")
    yield session
    session.stop()


def isolated_settings(base: Settings, bootstrap: str, root: Path) -> Settings:
    """Own warehouse, checkpoints and topics under root, on the shared broker."""
    suffix = root.name.replace("_", "-")[-40:]
    return replace(
        base,
        bootstrap_servers=bootstrap,
        warehouse=root / "warehouse",
        checkpoints=root / "checkpoints",
        input_topic=f"ad-events-{suffix}",
        output_topic=f"ad-metrics-{suffix}",
        control_topic=f"adattr-control-{suffix}",
    )


@pytest.fixture
def settings(base_settings: Settings, tmp_path: Path, kafka_bootstrap: str) -> Settings:
    return isolated_settings(base_settings, kafka_bootstrap, tmp_path)
