"""The files behind README "Running on a real cluster", checked without a cluster: the settings
file loads through the same strict loader every command uses, the Kubernetes submit script's
dry run builds the command the README describes, the image pins what pyproject.toml pins, and
the broker settings are the ones the transactional producer needs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from app.runtime.settings import Settings
from pipelines.publish import TRANSACTION_TIMEOUT_MS

REPO = Path(__file__).resolve().parents[3]
ENV_FILE = REPO / "infra" / "cluster" / "adattr.env.example"
SUBMIT = REPO / "infra" / "k8s" / "submit.sh"


def _assignments(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def test_the_settings_file_loads_with_every_name_known(tmp_path: Path) -> None:
    env = _assignments(ENV_FILE)
    # The mounted secret's files, here made on the spot: the loader reads both.
    password = tmp_path / "password"
    password.write_text("not-the-real-one\n")  # pragma: allowlist secret (a test's stand-in)
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    assert env["ADATTR_KAFKA_SASL_PASSWORD_FILE"] == "/etc/adattr/kafka/password"
    env |= {"ADATTR_KAFKA_SASL_PASSWORD_FILE": str(password), "ADATTR_KAFKA_SSL_CA_FILE": str(ca)}

    settings = Settings.from_env(env)

    assert settings.kafka_security_protocol == "SASL_SSL"
    assert len(settings.bootstrap_servers.split(",")) >= 3
    assert (
        settings.table_path("gold_ad_metrics_1m")
        == "s3a://adattr-prod/warehouse/gold_ad_metrics_1m"
    )
    # The run lock is an flock: checkpoints on a mounted file system, not object storage.
    assert settings.local_warehouse is None and str(settings.checkpoints).startswith("/mnt/")
    assert "ADATTR_KAFKA_SASL_PASSWORD" not in env


def _dry_run(*extra: str, env_file: Path = ENV_FILE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *("bash", str(SUBMIT), "--dry-run", "--master", "k8s://https://k8s.example:6443"),
            *("--image", "registry.example/adattr:1.0", "--env-file", str(env_file), *extra),
        ],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_kubernetes_submission_passes_every_setting_to_the_driver_pod() -> None:
    done = _dry_run("--", "run")
    assert done.returncode == 0, done.stderr
    command = done.stdout
    for expected in (
        "spark-submit --master k8s://https://k8s.example:6443 --deploy-mode cluster",
        "spark.kubernetes.container.image=registry.example/adattr:1.0",
        "spark.driver.extraJavaOptions=-Duser.timezone=UTC",
    ):
        assert expected in command
    # The executors read Kafka with the CA file and write state and carried rows beside the
    # checkpoints: the secret and the volume are mounted in every pod, at the same paths.
    for pod in ("driver", "executor"):
        for expected in (
            f"spark.kubernetes.{pod}.secrets.adattr-kafka=/etc/adattr/kafka",
            f"spark.kubernetes.{pod}.volumes.persistentVolumeClaim.shared.mount.path"
            "=/mnt/adattr-shared",
            f"spark.kubernetes.{pod}.volumes.persistentVolumeClaim.shared.options.claimName"
            "=adattr-shared",
        ):
            assert expected in command, expected
    for name in _assignments(ENV_FILE):
        assert f"spark.kubernetes.driverEnv.{name}=" in command, name
    assert command.rstrip().endswith("local:///opt/adattr/app/submit.py run")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (
            "ADATTR_KAFKA_SASL_PASSWORD=hunter2",
            "sets the password itself",
        ),  # pragma: allowlist secret
        ("SPARK_HOME=/opt/spark", "not an ADATTR_ setting: SPARK_HOME"),
    ],
)
def test_the_submission_refuses_a_password_or_a_foreign_variable(
    tmp_path: Path, line: str, why: str
) -> None:
    env_file = tmp_path / "bad.env"
    env_file.write_text(f"ADATTR_INPUT_TOPIC=ad-events\n{line}\n")
    done = _dry_run(env_file=env_file)
    assert done.returncode == 2 and why in done.stderr
    assert "hunter2" not in done.stdout


def test_the_image_pins_what_pyproject_pins() -> None:
    dockerfile = (REPO / "infra" / "k8s" / "Dockerfile").read_text()
    pyproject = (REPO / "pyproject.toml").read_text()
    pins = dict(re.findall(r'"([a-z-]+)==([0-9.]+)"', pyproject))
    assert re.search(rf"^FROM apache/spark:{re.escape(pins['pyspark'])}-", dockerfile, re.M)
    installed = dict(re.findall(r"([a-z-]+)==([0-9.]+)", dockerfile))
    assert installed, "the image installs adattr's dependencies"
    for package, version in installed.items():
        assert pins.get(package) == version, package
    assert "COPY infra/.jars/spark/*.jar /opt/spark/jars/" in dockerfile
    assert "PASSWORD" not in dockerfile.upper().replace("THE KAFKA PASSWORD", "")


def test_the_broker_settings_hold_what_transactions_need() -> None:
    broker = _assignments(REPO / "infra" / "kafka" / "production-broker.properties")
    assert broker["default.replication.factor"] == "3"
    assert broker["min.insync.replicas"] == "2"
    assert broker["transaction.state.log.replication.factor"] == "3"
    assert broker["transaction.state.log.min.isr"] == "2"
    assert broker["unclean.leader.election.enable"] == "false"
    assert int(broker["transaction.max.timeout.ms"]) >= TRANSACTION_TIMEOUT_MS
    assert broker["allow.everyone.if.no.acl.found"] == "false"
