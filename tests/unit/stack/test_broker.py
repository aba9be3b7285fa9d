import base64
import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from app.stack import broker


def test_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # First byte 0xF8: base64 index 62, which URL-safe base64 writes as '-'.
    dashed = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))
    plain = uuid.UUID(bytes=bytes([0x10]) + bytes(15))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    drawn = iter([dashed, dashed, plain])
    monkeypatch.setattr(broker.uuid, "uuid4", lambda: next(drawn))

    cluster_id = broker.new_cluster_id()

    assert cluster_id == base64.urlsafe_b64encode(plain.bytes).decode().rstrip("=")
    assert len(cluster_id) == 22


def test_a_free_port_lies_below_the_kernels_ephemeral_range_and_is_free() -> None:
    low, _ = broker._ephemeral_ports()
    ports = {broker.free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports), (ports, low)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", ports.pop()))


def test_a_port_something_listens_on_is_never_given_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Every candidate drawn is the port that is taken.
        monkeypatch.setattr(broker.random, "sample", lambda r, k: [port] * k)
        with pytest.raises(RuntimeError, match="no free port"):
            broker.free_port()


def test_a_port_is_given_out_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    first = broker.free_port()
    # Every try lands on the port given out already (its listener not up yet), then on another.
    monkeypatch.setattr(broker.random, "sample", lambda r, k: [first] * (k - 1) + [first - 1])
    assert broker.free_port() == first - 1


def test_a_port_another_process_chose_a_moment_ago_is_not_given_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Another process (another test worker) does not share this one's memory of ports given,
    only the claims on disk: a port claimed within the last minute is skipped, a stale claim
    is not."""
    monkeypatch.setattr(broker, "_CLAIMS", tmp_path / "claims")
    first = broker.free_port()
    assert (tmp_path / "claims" / str(first)).exists()
    broker._GIVEN.discard(first)  # as another process, which never gave it out
    monkeypatch.setattr(broker.random, "sample", lambda r, k: [first] * (k - 1) + [first - 1])
    assert broker.free_port() == first - 1
    broker._GIVEN.discard(first)
    old = time.time() - 2 * broker._CLAIM_S
    os.utime(tmp_path / "claims" / str(first), (old, old))
    monkeypatch.setattr(broker.random, "sample", lambda r, k: [first] * k)
    assert broker.free_port() == first
