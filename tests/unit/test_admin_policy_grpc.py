"""The SetPolicy admin RPC end to end over gRPC (gateway + SDK + CLI) against ``FakeBackend``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("grpc")

import grpc

from tests.fakes import FakeBackend, decode_policies_shown
from tests.gateway_support import FakeFrontDoors, backend, client, env
from tetriserve.cli.main import main
from tetriserve.client import AsyncTetriServeClient, InvalidArgument, NotFound, TetriServeClient
from tetriserve.common.config import DecodeConfig
from tetriserve.decode_worker.policy import updated_decode_config
from tetriserve.protos import tetriserve_pb2 as pb
from tetriserve.protos import tetriserve_pb2_grpc as pb_grpc

__all__ = ["backend", "client", "env"]  # fixtures

DECODE_DEFAULT = decode_policies_shown(DecodeConfig())


# ---- SDK round trip ------------------------------------------------------------------------------


def test_set_policy_round_trip_reaches_worker_with_ints(backend: FakeBackend, client: TetriServeClient) -> None:
    update = client.set_policy({"queue": "sjf", "sched_batch": "128", "chunk_size": 256})
    assert [(w.worker_id, w.role) for w in update.workers] == [("prefill-0", "prefill")]
    policy = update.policy_of("prefill-0")
    assert (policy["queue"], policy["sched_batch"], policy["chunk_size"]) == ("sjf", "128", "256")
    assert policy["dispatch"] == "power-of-two"  # untouched keys are reported too
    # string values of int fields arrive at the worker as ints
    assert backend.policy_changes == [("prefill-0", {"queue": "sjf", "sched_batch": 128, "chunk_size": 256})]
    status = client.cluster_status()
    by_id = {w.worker_id: w for w in status.workers}
    assert by_id["prefill-0"].policy["queue"] == "sjf"
    assert dict(by_id["decode-0"].policy) == DECODE_DEFAULT


def test_set_policy_on_one_named_worker(backend: FakeBackend, client: TetriServeClient) -> None:
    update = client.set_policy({"chunking": "none"}, worker_id="prefill-0")
    assert update.policy_of("prefill-0")["chunking"] == "none"
    with pytest.raises(KeyError):
        update.policy_of("decode-0")


@pytest.mark.parametrize("worker_id", ["decode", "decode-0"])
def test_set_policy_on_decode_workers(backend: FakeBackend, client: TetriServeClient, worker_id: str) -> None:
    changes = {"admission.policy": "cacheopt", "preemption.order": "srtf", "admission.reserve_blocks": "2"}
    update = client.set_policy(changes, worker_id=worker_id)
    assert [(w.worker_id, w.role) for w in update.workers] == [("decode-0", "decode")]
    expected = {"admission.policy": "cacheopt", "preemption.order": "srtf", "admission.reserve_blocks": 2}
    # under cacheopt its knobs are listed too, by the names set_policy takes
    assert dict(update.policy_of("decode-0")) == decode_policies_shown(updated_decode_config(DecodeConfig(), expected))
    assert backend.policy_changes == [("decode-0", expected)]  # ints converted, as for prefill
    assert backend.decode_config.admission.reserve_blocks == 2
    by_id = {w.worker_id: w for w in client.cluster_status().workers}
    assert by_id["decode-0"].policy["admission.policy"] == "cacheopt"
    assert by_id["prefill-0"].policy["queue"] == "fcfs"  # the prefill side is untouched


def test_unknown_worker_is_not_found(backend: FakeBackend, client: TetriServeClient) -> None:
    with pytest.raises(NotFound, match="prefill-9") as info:
        client.set_policy({"queue": "sjf"}, worker_id="prefill-9")
    assert "prefill-0" in info.value.details  # the known workers are listed
    assert backend.policy_changes == []


BAD_CHANGES: list[tuple[str, dict[str, str], str | None, str, str]] = [
    # id, changes, worker_id, field, text in the message
    ("unknown key", {"bogus": "1"}, None, "bogus", "unknown prefill policy key"),
    ("decode key to prefill", {"admission.policy": "cacheopt"}, None, "admission.policy", "a decode policy key"),
    ("prefill key to decode", {"queue": "sjf"}, "decode-0", "queue", "a prefill policy key, not a decode one"),
    ("mixed roles", {"preemption.order": "srtf", "queue": "sjf"}, "decode", "queue", "a prefill policy key"),
    ("unknown decode key", {"admission": "greedy"}, "decode", "admission", "unknown decode policy key"),
    ("decode not an int", {"admission.buffer_tokens": "8.5"}, "decode", "admission.buffer_tokens", "an integer"),
    ("decode rejects name", {"admission.policy": "lifo"}, "decode", "admission.policy", "Input should be 'greedy'"),
    (
        "decode rejects bound",
        {"admission.reserve_blocks": "-1"},
        "decode-0",
        "admission.reserve_blocks",
        "greater than or equal to 0",
    ),
    ("decode needs profile", {"preemption.mode": "auto"}, "decode", "preemption.mode", "swap/recompute profile"),
    ("not settable", {"dispatch": "random"}, None, "dispatch", "unknown prefill policy key"),
    ("not an int", {"sched_batch": "lots"}, None, "sched_batch", "must be an integer, got 'lots'"),
    ("float for int", {"chunk_size": "1.5"}, None, "chunk_size", "must be an integer"),
    ("empty value", {"queue": ""}, None, "queue", "must not be empty"),
    ("no changes", {}, None, "changes", "at least one"),
    ("worker rejects name", {"queue": "nope"}, None, "queue", "prefill.queue_policy: unknown policy 'nope'"),
    ("worker rejects value", {"queue": "sjf", "sched_batch": "0"}, None, "sched_batch", "prefill.sched_batch must be"),
]


@pytest.mark.parametrize(
    ("changes", "worker_id", "field", "text"), [c[1:] for c in BAD_CHANGES], ids=[c[0] for c in BAD_CHANGES]
)
def test_bad_change_is_invalid_argument_naming_the_field(
    backend: FakeBackend,
    client: TetriServeClient,
    changes: dict[str, str],
    worker_id: str | None,
    field: str,
    text: str,
) -> None:
    with pytest.raises(InvalidArgument) as info:
        client.set_policy(changes, worker_id=worker_id)
    assert info.value.field == field
    assert text in info.value.details
    assert backend.policies["prefill-0"]["queue"] == "fcfs"  # nothing changed
    assert backend.policies["decode-0"] == DECODE_DEFAULT and backend.decode_config == DecodeConfig()
    reached = backend.policy_changes
    assert reached == [] or field in reached[0][1]  # only a value the worker itself judges reaches it


def test_async_client_set_policy(env: FakeFrontDoors, backend: FakeBackend) -> None:
    async def scenario() -> None:
        async with AsyncTetriServeClient(env.target, timeout=10) as c:
            update = await c.set_policy({"queue": "ljf"})
            assert update.policy_of("prefill-0")["queue"] == "ljf"
            assert (await c.cluster_status()).workers[0].policy["queue"] == "ljf"
            with pytest.raises(NotFound):
                await c.set_policy({"queue": "sjf"}, worker_id="nobody")
            with pytest.raises(InvalidArgument) as info:
                await c.set_policy({"sched_batch": "x"})
            assert info.value.field == "sched_batch"

    asyncio.run(scenario())


def test_bad_decode_value_is_invalid_argument_with_field_metadata(env: FakeFrontDoors, backend: FakeBackend) -> None:
    request = pb.SetPolicyRequest(worker_id="decode", changes={"admission.policy": "lifo"})
    with grpc.insecure_channel(env.target) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.TetriServeStub(channel).SetPolicy(request, timeout=10)
    err: Any = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ("tetriserve-field", "admission.policy") in tuple(err.trailing_metadata())
    assert err.details().startswith("admission.policy: decode-0 rejected the change: decode.admission.policy:")


def test_sdk_rejects_non_mapping_changes(client: TetriServeClient) -> None:
    with pytest.raises(TypeError, match="changes must be a mapping"):
        client.set_policy("queue=sjf")  # type: ignore[arg-type]


# ---- CLI -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arg", ["queue", "=sjf", "queue=", " = "])
def test_cli_bad_key_value_form_exits_2(arg: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["policy", "set", "--target", "127.0.0.1:1", arg])
    assert info.value.code == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_cli_policy_set_needs_a_change(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["policy", "set"])
    assert info.value.code == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_cli_key_given_twice_exits_2(
    backend: FakeBackend, env: FakeFrontDoors, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "set", "--target", env.target, "queue=sjf", "queue=ljf"]) == 2
    assert "queue: given twice" in capsys.readouterr().err
    assert backend.policy_changes == []


def test_cli_policy_set_and_show(backend: FakeBackend, env: FakeFrontDoors, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "set", "--target", env.target, "queue=sjf", "sched_batch=128", "chunking=none"]) == 0
    out = capsys.readouterr().out
    assert "prefill-0" in out and "queue=sjf chunking=none" in out and "sched_batch=128" in out
    assert backend.policy_changes == [("prefill-0", {"queue": "sjf", "sched_batch": 128, "chunking": "none"})]

    assert main(["policy", "show", "--target", env.target, "--json"]) == 0
    shown = {w["worker_id"]: w for w in json.loads(capsys.readouterr().out)["workers"]}
    assert shown["prefill-0"]["policy"]["queue"] == "sjf" and shown["decode-0"]["policy"] == DECODE_DEFAULT

    assert main(["policy", "show", "--target", env.target, "--worker", "decode-0"]) == 0
    out = capsys.readouterr().out
    assert "admission.policy=greedy" in out and "prefill-0" not in out
    assert main(["policy", "show", "--target", env.target, "--worker", "nobody"]) == 1
    assert "no worker 'nobody'" in capsys.readouterr().err


def test_cli_policy_set_and_show_decode(
    backend: FakeBackend, env: FakeFrontDoors, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--target", env.target, "--worker", "decode", "admission.policy=cacheopt", "preemption.order=srtf"]
    assert main(["policy", "set", *args]) == 0
    out = capsys.readouterr().out
    assert "prefill-0" not in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("decode-0")]
    # decode keys in their order: admission (with cacheopt's knobs under cacheopt), preemption policy, counters
    assert line.split()[1:] == [
        "decode",
        "admission.policy=cacheopt",
        "admission.reserve_blocks=8",  # CacheOpt §5: 8 reserved blocks
        "admission.proactive_iters=2",  # CacheOpt §5: m = 2 iterations
        "admission.buffer_tokens=8",
        "admission.basic_tokens=8",  # CacheOpt §5: B = 8 tokens
        "preemption.order=srtf",
        "preemption.mode=recompute",
        "max_local_prompts=2",
        "slice_iters=0",
        "preemptions=0",
        "swapped=0",
        "recomputed=0",
        "preemption_median_ms=-",
        "preemption_p99_ms=-",
        "slice_moved_out=0",
        "slice_moved_in=0",
        "slice_kept=0",
    ]
    assert main(["policy", "show", "--target", env.target, "--worker", "decode"]) == 0
    out = capsys.readouterr().out
    assert "decode-0" in out and "admission.policy=cacheopt" in out and "prefill-0" not in out
    assert main(["policy", "show", "--target", env.target, "--worker", "prefill"]) == 0
    assert "decode-0" not in capsys.readouterr().out

    assert main(["policy", "set", "--target", env.target, "admission.policy=sola"]) == 1  # no --worker: prefill
    assert "admission.policy: a decode policy key, not a prefill one" in capsys.readouterr().err
    assert main(["policy", "set", "--target", env.target, "--worker", "decode-0", "preemption.mode=later"]) == 1
    assert "INVALID_ARGUMENT" in capsys.readouterr().err
    assert backend.decode_config.admission.policy == "cacheopt"


def test_cli_policy_set_errors_exit_1(
    backend: FakeBackend, env: FakeFrontDoors, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["policy", "set", "--target", env.target, "--worker", "prefill-7", "queue=sjf"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err
    assert main(["policy", "set", "--target", env.target, "sched_batch=many"]) == 1
    assert "sched_batch: must be an integer" in capsys.readouterr().err


def test_cli_status_shows_policy_column_and_json(
    backend: FakeBackend, env: FakeFrontDoors, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--target", env.target]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[1].split()
    columns = ["worker", "role", "state", "life", "restarts", "flips", "last_flip", "swap", "kv", "policy", "load"]
    assert header == columns
    prefill = next(line for line in lines if line.startswith("prefill-0"))
    assert "queue=fcfs" in prefill and "queued=1" in prefill
    decode = next(line for line in lines if line.startswith("decode-0"))
    assert decode.index("admission.policy=greedy") == lines[1].index("policy")  # the column lines up

    assert main(["status", "--target", env.target, "--json"]) == 0
    workers = {w["worker_id"]: w for w in json.loads(capsys.readouterr().out)["workers"]}
    assert workers["prefill-0"]["policy"]["sched_batch"] == "16"
    assert workers["decode-0"]["policy"] == DECODE_DEFAULT
    assert workers["decode-0"]["load"]["free_kv_blocks"] == 42.0
    assert workers["decode-0"]["incarnation"] == 0 and workers["decode-0"]["restarts"] == 0
    assert workers["decode-0"]["flips"] == 0 and workers["decode-0"]["last_flip_ms"] is None
