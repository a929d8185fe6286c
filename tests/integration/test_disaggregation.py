"""The KV cache really moves: the disaggregated cluster reproduces a colocated vLLM engine token for token.

32 ShareGPT prompts, greedy, float32. The decode engine's own counters must show
it computed one token per request (the first generated token, fed back as
input) and received every prompt token's KV from the connector (pulled from the prefill worker's shared-memory
slabs: the default transport, one host). With presence,
frequency and repetition penalties, ``min_tokens`` and stop tokens the output is
still the colocated engine's: the prefill worker's token counts as output on the
decode worker.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.integration.conftest import wait_room_seen
from tetriserve.common.request import Request, SamplingSpec

N_PROMPTS = 32
MAX_PROMPT_TOKENS = 384
SAMPLING = SamplingSpec(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(model_path: str) -> dict[str, tuple[int, ...]]:
    from transformers import AutoTokenizer

    from tetriserve.common.sharegpt import sample_prompts

    tok = AutoTokenizer.from_pretrained(model_path)
    texts = sample_prompts(N_PROMPTS, seed=7, max_scan=3000)
    return {f"sg-{i}": tuple(tok.encode(t)[:MAX_PROMPT_TOKENS]) for i, t in enumerate(texts)}


def _engine_stats(handle: Any) -> dict[str, Any]:
    import ray

    return ray.get(handle.stats.remote())


@pytest.fixture(scope="module")
def colocated(cluster: Any, model_path: str) -> Any:
    import ray

    from tetriserve.engine.colocated import ColocatedEngine
    from tetriserve.engine.settings import engine_env

    actor = (
        ray.remote(ColocatedEngine)
        .options(num_cpus=0, runtime_env={"env_vars": engine_env(cluster.config.engine)})
        .remote(cluster.config.engine, model_path, cluster.config.prefill.chunk_size)
    )
    yield actor
    ray.kill(actor)


def _disaggregated(cluster: Any, prompts: dict[str, tuple[int, ...]], sampling: SamplingSpec, tag: str) -> Any:
    from tetriserve.frontdoor.ray_backend import RayBackend

    backend = RayBackend(cluster, "tiny-llama")

    async def run_all() -> dict[str, tuple[int, ...]]:
        async def one(rid: str, ids: tuple[int, ...]) -> tuple[int, ...]:
            out: list[int] = []
            async for chunk in backend.generate(Request(f"{rid}-{tag}", ids, sampling)):
                assert chunk.finish_reason in (None, "length", "stop"), chunk.error
                out.extend(chunk.token_ids)
            return tuple(out)

        try:
            results = await asyncio.gather(*(one(rid, ids) for rid, ids in prompts.items()))
        finally:
            backend.close()
        return dict(zip(prompts, results, strict=True))

    return asyncio.run(run_all())


def _assert_same(disaggregated: dict[str, tuple[int, ...]], colocated: dict[str, tuple[int, ...]]) -> None:
    mismatched = [rid for rid in colocated if disaggregated[rid] != colocated[rid]]
    assert not mismatched, (
        f"{len(mismatched)}/{len(colocated)} differ, e.g. {mismatched[0]}: "
        f"{disaggregated[mismatched[0]]} vs {colocated[mismatched[0]]}"
    )


def test_disaggregated_equals_colocated(cluster: Any, colocated: Any, prompts: dict[str, tuple[int, ...]]) -> None:
    import ray

    decode = next(iter(cluster.decode.values()))
    prefill = next(iter(cluster.prefill.values()))
    before_d, before_p = _engine_stats(decode), _engine_stats(prefill)

    disaggregated = _disaggregated(cluster, prompts, SAMPLING, "plain")
    _assert_same(disaggregated, ray.get(colocated.generate_many.remote(dict(prompts), SAMPLING), timeout=600))
    assert all(a.startswith("shm://") for a in cluster.supervision.addresses.values())  # the default: shm
    assert all(len(v) == SAMPLING.max_tokens for v in disaggregated.values())

    after_d, after_p = _engine_stats(decode), _engine_stats(prefill)
    prompt_tokens = sum(len(p) for p in prompts.values())
    eng_d0, eng_d1 = before_d["engine"], after_d["engine"]
    kv_d0, kv_d1 = before_d["kv"], after_d["kv"]
    # decode engine: every prompt token came from the connector, only the fed-back first token was computed
    assert eng_d1.prompt_tokens_external - eng_d0.prompt_tokens_external == prompt_tokens
    assert eng_d1.prompt_tokens_computed - eng_d0.prompt_tokens_computed == len(prompts)
    assert kv_d1.requests_loaded - kv_d0.requests_loaded == len(prompts)
    assert kv_d1.tokens_loaded - kv_d0.tokens_loaded == prompt_tokens
    assert kv_d1.bytes_loaded - kv_d0.bytes_loaded > 0
    assert kv_d1.load_failures == kv_d0.load_failures
    # the bytes that landed are the bytes the prefill side sent
    sent = after_p["transport"].bytes_sent - before_p["transport"].bytes_sent
    landed = after_d["transport"].bytes_received - before_d["transport"].bytes_received
    assert sent == landed > kv_d1.bytes_loaded - kv_d0.bytes_loaded  # landed includes the small per-request headers
    assert after_p["kv"].requests_packed - before_p["kv"].requests_packed == len(prompts)
    assert after_p["kv"].bytes_packed - before_p["kv"].bytes_packed == kv_d1.bytes_loaded - kv_d0.bytes_loaded
    assert after_p["transport"].transfers_failed == before_p["transport"].transfers_failed
    # one host, shm: every request's KV was pulled by the decode worker from the prefill's slabs (one-sided)
    assert after_d["transport"].transfers_pulled - before_d["transport"].transfers_pulled == len(prompts)
    # prefill engine: computed (or prefix-cached) every prompt token, generated exactly one token per request
    e_p0, e_p1 = before_p["engine"], after_p["engine"]
    assert (e_p1.prompt_tokens_computed + e_p1.prompt_tokens_cached) - (
        e_p0.prompt_tokens_computed + e_p0.prompt_tokens_cached
    ) == prompt_tokens
    assert e_p1.prompt_tokens_external == e_p0.prompt_tokens_external


def test_penalties_min_tokens_and_stop_tokens_count_the_prefill_token_as_output(
    cluster: Any, colocated: Any, prompts: dict[str, tuple[int, ...]]
) -> None:
    import collections

    import ray

    plain = ray.get(colocated.generate_many.remote(dict(prompts), SAMPLING), timeout=600)
    # the most frequent generated tokens stop generation, but not before min_tokens
    common = collections.Counter(t for out in plain.values() for t in out[1:]).most_common(6)
    sampling = SamplingSpec(
        max_tokens=16,
        temperature=0.0,
        presence_penalty=0.7,
        frequency_penalty=0.5,
        repetition_penalty=1.3,
        min_tokens=6,
        stop_token_ids=tuple(t for t, _ in common),
    )
    expected = ray.get(colocated.generate_many.remote(dict(prompts), sampling), timeout=600)
    assert expected != plain  # the penalties change the output
    assert any(len(v) < sampling.max_tokens for v in expected.values())  # and some stop on a stop token
    assert all(len(v) >= sampling.min_tokens for v in expected.values())
    _assert_same(_disaggregated(cluster, prompts, sampling, "penalized"), expected)


def test_prompts_offloaded_to_the_decode_worker_give_the_colocated_output_too(
    cluster: Any, colocated: Any, prompts: dict[str, tuple[int, ...]]
) -> None:
    """The test cluster offloads a prompt once its prefill queue would wait 10 ms (``prefill.offload_wait_s``)
    but its decode worker takes none (``decode.max_local_prompts`` 0) until this test gives it room: a burst of
    32 prompts then has some computed, first token included, on the decode worker, which streams them whole."""
    import ray

    decode = next(iter(cluster.decode.values()))
    prefill = next(iter(cluster.prefill.values()))
    changed = time.time()
    ray.get(decode.set_policy.remote({"max_local_prompts": 2}))
    wait_room_seen([prefill], 2, since=changed)  # its room reaches the prefill worker with a load broadcast
    try:
        before_d, before_p = _engine_stats(decode), _engine_stats(prefill)
        disaggregated = _disaggregated(cluster, prompts, SAMPLING, "offloaded")
        after_d, after_p = _engine_stats(decode), _engine_stats(prefill)
    finally:
        ray.get(decode.set_policy.remote({"max_local_prompts": 0}))
    _assert_same(disaggregated, ray.get(colocated.generate_many.remote(dict(prompts), SAMPLING), timeout=600))
    offloaded = after_p["handoffs"]["offloaded"] - before_p["handoffs"]["offloaded"]
    assert 0 < offloaded < len(prompts)
    # the prompts offloaded were computed by the decode engine, every one of the others' came as KV
    computed = after_d["engine"].prompt_tokens_computed - before_d["engine"].prompt_tokens_computed
    loaded = after_d["kv"].requests_loaded - before_d["kv"].requests_loaded
    assert loaded == len(prompts) - offloaded and computed > len(prompts)


def test_short_prompts_go_to_the_decode_worker_before_they_queue_and_give_the_colocated_output_too(
    cluster: Any, colocated: Any, prompts: dict[str, tuple[int, ...]]
) -> None:
    """``prefill.offload_max_tokens``, set at run time: prompts sent one at a time (no backlog, so only their
    length sends them) of at most that many tokens are computed, first token included, on the decode worker;
    the longer ones on the prefill worker, their KV sent."""
    import ray

    decode = next(iter(cluster.decode.values()))
    prefill = next(iter(cluster.prefill.values()))
    by_length = sorted(prompts.items(), key=lambda item: len(item[1]))
    chosen = dict(by_length[:2] + by_length[-2:])
    limit = len(by_length[1][1])
    assert len(by_length[-2][1]) > limit
    changed = time.time()
    ray.get(decode.set_policy.remote({"max_local_prompts": 2}))
    ray.get(prefill.set_policy.remote({"offload_max_tokens": limit}))
    wait_room_seen([prefill], 2, since=changed)  # or the first prompt may find no room yet (or the last test's)
    try:
        before_d, before_p = _engine_stats(decode), _engine_stats(prefill)
        disaggregated = {}
        for rid, ids in chosen.items():  # one at a time
            disaggregated.update(_disaggregated(cluster, {rid: ids}, SAMPLING, "short"))
        after_d, after_p = _engine_stats(decode), _engine_stats(prefill)
    finally:
        ray.get(prefill.set_policy.remote({"offload_max_tokens": 0}))
        ray.get(decode.set_policy.remote({"max_local_prompts": 0}))
    _assert_same(disaggregated, ray.get(colocated.generate_many.remote(chosen, SAMPLING), timeout=600))
    assert after_p["handoffs"]["offloaded"] - before_p["handoffs"]["offloaded"] == 2
    assert after_d["kv"].requests_loaded - before_d["kv"].requests_loaded == 2


def test_seeded_sampling_is_reproducible_from_run_to_run(cluster: Any, prompts: dict[str, tuple[int, ...]]) -> None:
    few = dict(list(prompts.items())[:6])
    seeded = SamplingSpec(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    first = _disaggregated(cluster, few, seeded, "seeded-1")
    assert first == _disaggregated(cluster, few, seeded, "seeded-2")
    other = _disaggregated(cluster, few, SamplingSpec(max_tokens=12, temperature=1.0, seed=99, ignore_eos=True), "s3")
    assert other != first  # the seed matters


def test_seeded_prompt_longer_than_a_chunk_samples_as_if_unchunked(
    cluster: Any, colocated: Any, prompts: dict[str, tuple[int, ...]]
) -> None:
    """After each prompt chunk but the last vLLM rewinds a seeded request's generator with a CUDA-only call;
    on CPU our engine worker does it (engine/cpu_worker.py). The long request and those stepped beside it
    complete (``_disaggregated`` fails on an error), the draws repeat from run to run, and the first token
    is the one the colocated engine samples from the unchunked prompt."""
    import itertools

    import ray

    chunk = cluster.config.prefill.chunk_size
    words = itertools.cycle(itertools.chain.from_iterable(prompts.values()))
    batch = {"long": tuple(itertools.islice(words, 2 * chunk + 50)), **dict(list(prompts.items())[:3])}
    seeded = SamplingSpec(max_tokens=4, temperature=1.0, seed=7, ignore_eos=True)
    first = _disaggregated(cluster, batch, seeded, "chunked-1")
    assert all(len(tokens) == seeded.max_tokens for tokens in first.values())
    assert first == _disaggregated(cluster, batch, seeded, "chunked-2")
    unchunked = ray.get(colocated.generate_many.remote(batch, seeded), timeout=600)
    assert first["long"][0] == unchunked["long"][0]
