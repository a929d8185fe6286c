"""Test doubles for the front doors: an in-process ``ServingBackend``, a tiny tokenizer, a loop thread.

``FakeBackend`` echoes the prompt's token ids (cycled) one chunk at a time, so
a generation with ``max_tokens == len(prompt)`` detokenizes back to the prompt
text. Knobs in ``FakeBehavior`` make it slow, fail before/after the first
token, or end with an error chunk; it records every request, abort and early
close so tests can assert on them (polling with ``wait_until``). Its two
workers (prefill-0, decode-0) keep policies in a dict; ``set_policy`` goes
through the real ``policy_admin`` checks and records what each worker received.
The decode worker judges its changes with the real ``DecodeConfig`` validation
and ``decode_policies``, as ``DecodeWorker.set_policy`` does.

``LoopThread`` runs an asyncio loop in a daemon thread, so gateway servers can
serve while a test drives them with blocking clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tests.elastic_support import SimulatedCluster
from tetriserve.common.config import DecodeConfig
from tetriserve.common.request import Request
from tetriserve.common.stream import StreamChunk, TokenLogprobs
from tetriserve.control_plane.elastic import parse_role, role_counts
from tetriserve.decode_worker.policy import decode_policies, decode_policy_settings, updated_decode_config
from tetriserve.decode_worker.preemption.stats import PreemptionStats
from tetriserve.decode_worker.slices import SliceMoves
from tetriserve.frontdoor.admission import Overloaded
from tetriserve.frontdoor.backend import ClusterStatus, WorkerPolicy, WorkerStatus, lifecycle_fields
from tetriserve.frontdoor.policy_admin import apply_changes, parse_changes, resolve_targets

_T = TypeVar("_T")

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SENTENCES = [
    "hello world, this is a tiny tokenizer for tests.",
    "The quick brown fox jumps over the lazy dog.",
    "Disaggregated prefill and decode serve long prompts without stalling decodes.",
    "héllo wörld, naïve café — unicode text 😀 and 中文 too.",
] * 20


@functools.cache
def tokenizer_dir() -> str:
    """A directory with a byte-level BPE ``PreTrainedTokenizerFast`` and a chat template (built once)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_SENTENCES, trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    path = tempfile.mkdtemp(prefix="tetriserve-test-tokenizer-")
    fast.save_pretrained(path)
    import atexit

    atexit.register(shutil.rmtree, path, True)
    return path


FAKE_QUEUES = ("fcfs", "sjf", "ljf")


def default_policies() -> dict[str, dict[str, str]]:
    """What the fake's workers report before any change (shaped like the real workers' ``policies()``)."""
    prefill = {"queue": "fcfs", "chunking": "fixed", "chunk_size": "512", "sched_batch": "16"}
    shown = {"dispatch": "power-of-two", "predictor": "bucket-quantile", "predictor_state": "ready"}
    return {"prefill-0": {**prefill, **shown}, "decode-0": decode_policies_shown(DecodeConfig())}


def decode_policies_shown(cfg: DecodeConfig) -> dict[str, str]:
    """What a ``DecodeWorker`` built from ``cfg`` reports in ``policies()`` (before any preemption)."""
    return {**decode_policy_settings(cfg), **PreemptionStats().summary(), **SliceMoves().summary()}


def fake_logprobs(token: int, position: int, top: int) -> TokenLogprobs:
    """What ``FakeBackend`` sends for output ``position``: the sampled ``token`` at -(1 + position/10), then the
    ``top`` alternatives by rank: the sampled token itself, then ids 40, 41, ... each 0.5 lower."""
    others = [t for t in range(40, 40 + top) if t != token][: max(0, top - 1)]
    sampled = -(1.0 + position / 10)
    return TokenLogprobs((token, *others), tuple(sampled - 0.5 * k for k in range(1 + len(others))))


@dataclass
class FakeBehavior:
    """Per-test knobs of ``FakeBackend``."""

    token_delay_s: float = 0.0
    fail_first_calls: int = 0  # raise ConnectionError (before any chunk) on this many generate calls
    fail_after_tokens: int | None = None  # raise ConnectionError after this many tokens
    error_after_tokens: int | None = None  # end with an error chunk after this many tokens
    unavailable: bool = False  # ... marked as the service's own (nothing could take the request)
    full_retry_after_s: int | None = None  # raise Overloaded before any chunk (every prefill worker full)
    healthy: bool = True


@dataclass
class FakeBackend:
    """In-process ``ServingBackend`` that echoes prompts."""

    model_path: str
    model_name: str = "tiny-test"
    max_model_len: int = 64
    behavior: FakeBehavior = field(default_factory=FakeBehavior)
    requests: list[Request] = field(default_factory=list)
    abort_calls: list[str] = field(default_factory=list)
    closed_early: list[str] = field(default_factory=list)
    generate_calls: int = 0
    policies: dict[str, dict[str, str]] = field(default_factory=default_policies)
    policy_changes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # what each worker received
    decode_config: DecodeConfig = field(default_factory=DecodeConfig)  # decode-0's
    _abort_events: dict[str, asyncio.Event] = field(default_factory=dict)
    cluster: SimulatedCluster = field(default_factory=lambda: _simulated())

    def reset(self) -> None:
        self.behavior = FakeBehavior()
        self.requests.clear()
        self.abort_calls.clear()
        self.closed_early.clear()
        self.generate_calls = 0
        self.policies = default_policies()
        self.policy_changes.clear()
        self.decode_config = DecodeConfig()
        self.cluster = _simulated()

    async def generate(self, request: Request) -> AsyncIterator[StreamChunk]:
        self.generate_calls += 1
        b = self.behavior
        if b.fail_first_calls > 0:
            b.fail_first_calls -= 1
            raise ConnectionError("fake backend: no prefill worker reachable")
        if b.full_retry_after_s is not None:
            raise Overloaded("overloaded: every prefill worker is full (fake)", b.full_retry_after_s)
        self.requests.append(request)
        rid, prompt = request.request_id, request.prompt_token_ids
        aborted = self._abort_events[rid] = asyncio.Event()
        finished = False
        try:
            for i in range(request.sampling.max_tokens):
                if b.token_delay_s:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(aborted.wait(), b.token_delay_s)
                if aborted.is_set():
                    finished = True
                    yield StreamChunk(rid, (), finish_reason="abort", prompt_tokens=len(prompt))
                    return
                if b.fail_after_tokens is not None and i >= b.fail_after_tokens:
                    raise ConnectionError("fake backend: decode worker lost")
                if b.error_after_tokens is not None and i >= b.error_after_tokens:
                    finished = True
                    error = "service unavailable: fake, lost 4 times" if b.unavailable else "fake KV transfer failed"
                    yield StreamChunk(rid, (), finish_reason="error", error=error, retry=b.unavailable)
                    return
                tok = prompt[i % len(prompt)]
                last = i == request.sampling.max_tokens - 1
                stop = tok in request.sampling.stop_token_ids
                reason = "stop" if stop else ("length" if last else None)
                finished = reason is not None
                metrics = {"fake_metric": 1.0} if finished else {}
                lps = None if request.sampling.logprobs is None else (fake_logprobs(tok, i, request.sampling.logprobs),)
                yield StreamChunk(
                    rid, (tok,), reason, prompt_tokens=len(prompt), worker="fake-0", metrics=metrics, logprobs=lps
                )
                if finished:
                    return
        finally:
            self._abort_events.pop(rid, None)
            if not finished:
                self.closed_early.append(rid)

    async def abort(self, request_id: str, reason: str = "abort") -> bool:
        self.abort_calls.append(request_id)
        event = self._abort_events.get(request_id)
        if event is None:
            return False
        event.set()
        return True

    async def healthy(self) -> bool:
        return self.behavior.healthy

    async def status(self) -> ClusterStatus:
        self.cluster.tick()
        lives = self.cluster.elastic.lifecycles()
        workers = []
        for wid, m in self.cluster.members.items():
            workers.append(
                WorkerStatus(
                    wid,
                    m["role"],
                    "running",
                    dict(m["load"]),
                    dict(self.policies.get(wid, {})),
                    incarnation=m["incarnation"],
                    health=m["state"],
                    **lifecycle_fields(lives[wid]),
                )
            )
        return ClusterStatus(self.model_name, tuple(workers), len(self._abort_events), "http://127.0.0.1:8265")

    async def flip(self, worker_id: str, role: str) -> str:
        return self.cluster.elastic.flip(worker_id, parse_role(role), time.monotonic())

    async def scale(self, prefill: int | None, decode: int | None) -> list[str]:
        return self.cluster.elastic.scale(role_counts(prefill, decode), time.monotonic())

    async def set_policy(self, worker_id: str | None, changes: dict[str, str]) -> list[WorkerPolicy]:
        role, targets = resolve_targets(worker_id, {"prefill-0": "prefill-0"}, {"decode-0": "decode-0"})
        parsed = parse_changes(role, changes)
        setter = self._decode_set_policy if role == "decode" else self._prefill_set_policy
        return await apply_changes({wid: functools.partial(setter, wid) for wid in targets}, parsed, role)

    async def _decode_set_policy(self, worker_id: str, changes: dict[str, Any]) -> dict[str, str]:
        """Stands in for ``DecodeWorker.set_policy``: the same checks, the same ValueErrors."""
        self.policy_changes.append((worker_id, dict(changes)))
        cfg = updated_decode_config(self.decode_config, changes)
        decode_policies(cfg)
        self.decode_config = cfg
        self.policies[worker_id] = decode_policies_shown(cfg)
        return dict(self.policies[worker_id])

    async def _prefill_set_policy(self, worker_id: str, changes: dict[str, Any]) -> dict[str, str]:
        """Stands in for ``PrefillWorker.set_policy``: a ValueError naming the config field on bad input."""
        self.policy_changes.append((worker_id, dict(changes)))
        if changes.get("queue", "fcfs") not in FAKE_QUEUES:
            raise ValueError(f"prefill.queue_policy: unknown policy {changes['queue']!r}; known: {list(FAKE_QUEUES)}")
        if changes.get("sched_batch", 1) < 1:
            raise ValueError(f"prefill.sched_batch must be >= 1, got {changes['sched_batch']}")
        self.policies[worker_id].update({k: str(v) for k, v in changes.items()})
        return dict(self.policies[worker_id])


def _simulated() -> SimulatedCluster:
    loads = {"prefill-0": {"queued": 1.0}, "decode-0": {"free_kv_blocks": 42.0}}
    return SimulatedCluster({"prefill-0": "prefill", "decode-0": "decode"}, loads)


class LoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float = 30.0) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    """Poll ``predicate`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)
