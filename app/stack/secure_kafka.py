"""The local broker of ``adattr up --secure``: TLS material, SCRAM users and ACLs.

Everything is made on the spot, once, under one folder (``<data_dir>/kafka-secure``):
``tls/`` holds a CA made for this broker alone and the broker's certificate (SAN: the loopback
address and ``localhost``, so clients verify the host name); ``secrets/`` (mode 0700) holds a
random password per user, one file each (0600), and one ``<user>.env`` per user with the
``ADATTR_*`` settings that connect as that user (the password by file, never by value).

Users and what the ACLs let them do (nothing else: ``allow.everyone.if.no.acl.found=false``):

- ``adattr-job``: read the input topic; write and read the output and control topics (it reads
  the control topic back on every start, and the operator tools it also runs as read the
  output); use its own transactional id.
- ``adattr-budget``: read the output topic (``adattr consume``).
- ``adattr-events``: write the input topic (the ad servers; ``adattr generate``).
- ``adattr-admin``: the broker's own user (inter-broker traffic), and the one that creates the
  topics, users and ACLs here. A super user, with the broker certificate's subject.

The admin's SCRAM credential must exist before the broker first starts (it talks to itself as
that user), so it is given to ``kafka-storage format`` (``--add-scram``); that process's argument
list holds it for the second the format runs, on this machine only. The other users are made
through the admin API afterwards and never appear in an argument list.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from app.runtime.kafka_io import (
    BUDGET_GROUP,
    KafkaAccessError,
    KafkaConnection,
    admin_client,
    app_topics,
    check_access,
    ensure_topics,
)
from app.runtime.settings import Settings, read_password

MECHANISM = "SCRAM-SHA-512"
ADMIN = "adattr-admin"
JOB = "adattr-job"
BUDGET = "adattr-budget"
EVENTS = "adattr-events"
ROLES = {
    JOB: "the job (adattr run) and the operator tools (audit, replay)",
    BUDGET: "the budget service (adattr consume): reads the output topic",
    EVENTS: "the ad servers (adattr generate): write the input topic",
}
USERS = tuple(ROLES)
BROKER_CN = "adattr-broker"
SCRAM_ITERATIONS = 8192


class SecureSetupError(RuntimeError):
    pass


@dataclass(frozen=True)
class SecureKafka:
    """The secure broker's folder: its TLS material, users' secrets and env files."""

    root: Path

    @property
    def tls_dir(self) -> Path:
        return self.root.resolve() / "tls"

    @property
    def secrets_dir(self) -> Path:
        return self.root.resolve() / "secrets"

    @property
    def ca_file(self) -> Path:
        return self.tls_dir / "ca.pem"

    def password_file(self, user: str) -> Path:
        return self.secrets_dir / f"{user}.password"

    def env_file(self, user: str) -> Path:
        return self.secrets_dir / f"{user}.env"

    def prepare(self, host: str) -> None:
        """Makes what is missing: the CA, the broker's certificate, a password per user."""
        for folder, mode in ((self.tls_dir, 0o755), (self.secrets_dir, 0o700)):
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(mode)
        if not (self.tls_dir / "broker.pem").exists():
            _make_certificates(self.tls_dir, host)
        for user in (ADMIN, *USERS):
            path = self.password_file(user)
            if not path.exists():
                _write_private(path, secrets.token_urlsafe(24) + "\n")

    def broker_values(self) -> dict[str, str]:
        """What server-secure.properties needs filled in."""
        return {
            "admin_user": ADMIN,
            "admin_password": read_password(self.password_file(ADMIN)),
            "tls_dir": str(self.tls_dir),
            "broker_cn": BROKER_CN,
        }

    def format_scram_argument(self) -> str:
        password = read_password(self.password_file(ADMIN))
        return f"{MECHANISM}=[name={ADMIN},password={password}]"

    def connection(self, bootstrap: str, user: str = ADMIN) -> KafkaConnection:
        return KafkaConnection(
            bootstrap,
            "SASL_SSL",
            MECHANISM,
            user,
            read_password(self.password_file(user)),
            str(self.ca_file),
        )

    def client_env(self, settings: Settings, user: str) -> dict[str, str]:
        """The settings that connect as ``user`` to this broker, for these topics."""
        return {
            "ADATTR_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "ADATTR_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "ADATTR_KAFKA_SASL_MECHANISM": MECHANISM,
            "ADATTR_KAFKA_SASL_USERNAME": user,
            "ADATTR_KAFKA_SASL_PASSWORD_FILE": str(self.password_file(user)),
            "ADATTR_KAFKA_SSL_CA_FILE": str(self.ca_file),
            "ADATTR_INPUT_TOPIC": settings.input_topic,
            "ADATTR_OUTPUT_TOPIC": settings.output_topic,
            "ADATTR_CONTROL_TOPIC": settings.control_topic,
        }

    def provision(self, settings: Settings, bootstrap: str, timeout: float = 60.0) -> list[str]:
        """Creates the topics, the users and the ACLs of ``settings`` (idempotent: running it
        again changes nothing, and another set of topics adds its own ACLs), writes each user's
        env file and checks that each user can log in. Returns the topics it created."""
        admin_conn = self.connection(bootstrap)
        created = ensure_topics(admin_conn, app_topics(settings), timeout)
        admin = admin_client(admin_conn)
        _wait_all(
            admin.alter_user_scram_credentials(
                [_scram_upsert(user, read_password(self.password_file(user))) for user in USERS]
            ),
            "creating the SCRAM users",
            timeout,
        )
        _wait_all(admin.create_acls(acl_bindings(settings)), "creating the ACLs", timeout)
        for user in USERS:
            text = "".join(f"{k}={v}\n" for k, v in self.client_env(settings, user).items())
            _write_private(self.env_file(user), text)
            _wait_for_login(self.connection(bootstrap, user), timeout)
        return created


def acl_bindings(settings: Settings) -> list[AclBinding]:
    topic, txn, group = ResourceType.TOPIC, ResourceType.TRANSACTIONAL_ID, ResourceType.GROUP
    read, write, describe = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    grants = [
        (JOB, topic, literal, settings.input_topic, (read, describe)),
        (JOB, topic, literal, settings.output_topic, (write, read, describe)),
        (JOB, topic, literal, settings.control_topic, (write, read, describe)),
        (JOB, txn, literal, settings.publisher_transactional_id, (write, describe)),
        # librdkafka's consumers look their group's coordinator up even when they assign
        # partitions themselves and commit nothing: the job's control-topic reader and the
        # operator tools' readers are all named adattr-*, the budget service's group is its own.
        (JOB, group, prefixed, "adattr-", (read,)),
        (BUDGET, topic, literal, settings.output_topic, (read, describe)),
        (BUDGET, group, literal, BUDGET_GROUP, (read,)),
        (EVENTS, topic, literal, settings.input_topic, (write, describe)),
    ]
    return [
        AclBinding(kind, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW)
        for user, kind, pattern, name, operations in grants
        for operation in operations
    ]


def _scram_upsert(user: str, password: str) -> UserScramCredentialUpsertion:
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    return UserScramCredentialUpsertion(user, info, password.encode())


def _wait_all(futures: dict[Any, Future[Any]], what: str, timeout: float) -> None:
    for future in futures.values():
        try:
            future.result(timeout=timeout)
        except Exception as exc:
            raise SecureSetupError(f"{what} failed: {exc}") from None


def _wait_for_login(kafka: KafkaConnection, timeout: float) -> None:
    """A new SCRAM credential reaches the broker's cache through the metadata log: a moment."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            check_access(kafka, timeout=5)
            return
        except KafkaAccessError as exc:
            if time.monotonic() > deadline:
                raise SecureSetupError(f"{kafka.username} cannot log in: {exc}") from None
        time.sleep(0.2)


def _write_private(path: Path, text: str) -> None:
    """Written with mode 0600 from the start (never readable by others, not even briefly)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _make_certificates(folder: Path, host: str) -> None:
    """A CA and the broker's certificate signed by it, with openssl. The broker's PEM file holds
    its unencrypted PKCS#8 key (what Kafka's PEM key store reads) and its certificate."""
    ca_key, ca_pem = folder / "ca.key", folder / "ca.pem"
    key, csr, crt = folder / "broker.key", folder / "broker.csr", folder / "broker.crt"
    extensions = folder / "broker.ext"
    names = ["DNS:localhost", "IP:127.0.0.1"] + ([f"IP:{host}"] if host != "127.0.0.1" else [])
    extensions.write_text(
        f"subjectAltName={','.join(names)}\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        # clientAuth too: the broker presents the same certificate to its own controller.
        "extendedKeyUsage=serverAuth,clientAuth\n"
    )
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-noenc", "-keyout", ca_key, "-out", ca_pem,
         "-days", "3650", "-subj", "/CN=adattr local CA",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", "-newkey", "rsa:2048", "-noenc", "-keyout", key, "-out", csr,
         "-subj", f"/CN={BROKER_CN}"],
        ["x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-CAcreateserial",
         "-out", crt, "-days", "825", "-extfile", extensions],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(
            ["openssl", *map(str, step)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SecureSetupError(f"openssl {step[0]} failed: {done.stderr.strip()}")
    ca_key.chmod(0o600)
    _write_private(folder / "broker.pem", key.read_text() + crt.read_text())
    for leftover in (key, csr, extensions):
        leftover.unlink()
