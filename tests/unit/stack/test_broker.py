import base64
import uuid

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
