"""The checked-in stubs under protos/ must be exactly what ``python -m tetriserve.protos.generate`` writes."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("grpc_tools")

from tetriserve.protos.generate import PROTO_DIR, generate


def test_protos_up_to_date(tmp_path: Path) -> None:
    written = generate(tmp_path)
    assert written, "protoc wrote nothing"
    names = sorted(p.name for p in written)
    assert names == ["tetriserve_pb2.py", "tetriserve_pb2.pyi", "tetriserve_pb2_grpc.py"]
    stale = [p.name for p in written if (PROTO_DIR / p.name).read_bytes() != p.read_bytes()]
    assert not stale, f"stale generated stubs {stale}: run `python -m tetriserve.protos.generate`"


def test_grpc_stub_imports_messages_from_the_package() -> None:
    source = (PROTO_DIR / "tetriserve_pb2_grpc.py").read_text()
    assert "from tetriserve.protos import tetriserve_pb2" in source
