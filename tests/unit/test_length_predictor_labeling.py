"""Relabelling pairs through the gRPC front door, against the in-process fake backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("grpc")

from tests.fakes import FakeBackend, LoopThread, tokenizer_dir
from tetriserve.frontdoor.core import FrontDoor
from tetriserve.frontdoor.gateway_grpc import start_grpc_server
from tetriserve.length_predictor.data import Pair, read_pairs
from tetriserve.length_predictor.labeling import LabelOptions, label_with_cluster


@pytest.fixture(scope="module")
def target() -> Iterator[tuple[str, FakeBackend]]:
    backend = FakeBackend(tokenizer_dir())  # echoes the prompt; max_model_len 64
    loop = LoopThread()
    server, port = loop.run(start_grpc_server(backend, "127.0.0.1", 0, front=FrontDoor(backend)))
    yield f"127.0.0.1:{port}", backend
    loop.run(server.stop(None))
    loop.stop()


def test_labels_come_from_the_cluster_and_keep_the_format(target: tuple[str, FakeBackend], tmp_path: Path) -> None:
    address, backend = target
    pairs = [
        Pair("a", 1, "train", "hello world", 2, 999),
        Pair("b", 1, "test", "The quick brown fox", 4, 999),
        Pair("c", 3, "val", "tiny " * 200, 200, 999),  # too long for max_model_len=64: rejected, dropped
        Pair("d", 1, "train", "", 0, 999),  # empty prompt: sent as a single space
    ]
    out = tmp_path / "labelled.jsonl"
    stats = label_with_cluster(pairs, out, LabelOptions(address, max_tokens=5, concurrency=3), progress=False)
    assert (stats.labelled, stats.rejected, stats.hit_max_tokens) == (3, 1, 3)
    got = read_pairs(out)
    assert [(p.conv, p.split, p.prompt) for p in got] == [(p.conv, p.split, p.prompt) for p in pairs if p.conv != "c"]
    assert all(p.response_len == 5 and p.source == "cluster:tiny-test" for p in got)  # the echo backend's length
    assert all(r.sampling.max_tokens == 5 for r in backend.requests)


def test_label_options_validate() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        LabelOptions(max_tokens=0)
    with pytest.raises(ValueError, match="concurrency"):
        LabelOptions(concurrency=0)
