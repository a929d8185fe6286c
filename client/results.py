"""What the SDK returns: streamed ``Chunk``s, a collected ``Completion``, health, cluster and policy views.

All are frozen dataclasses built from the protobuf messages, so callers never
touch generated code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tetriserve.protos import tetriserve_pb2 as pb


@dataclass(frozen=True)
class Usage:
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability (None if the server had none) and ``top``, (token id, string,
    log-probability) of the most likely tokens at its position: the sampled one first, then by rank."""

    token_id: int
    token: str
    logprob: float | None
    top: tuple[tuple[int, str, float], ...] = ()

    @classmethod
    def from_proto(cls, msg: pb.TokenLogprob) -> TokenLogprob:
        top = tuple((t.token_id, t.token, t.logprob) for t in msg.top)
        return cls(msg.token_id, msg.token, msg.logprob if msg.HasField("logprob") else None, top)


@dataclass(frozen=True)
class Chunk:
    """New tokens of one request. The last chunk has ``finish_reason``, ``usage`` and ``e2e_ms``.

    ``text`` is the text of the new tokens; it can be empty while a character
    spans several tokens (it then arrives with the next chunk).
    """

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    metrics: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    logprobs: tuple[TokenLogprob, ...] = ()  # with the ``logprobs`` option: one per token of ``token_ids``

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @classmethod
    def from_proto(cls, msg: pb.GenerateResponse) -> Chunk:
        return cls(
            request_id=msg.request_id,
            token_ids=tuple(msg.token_ids),
            text=msg.text,
            finish_reason=msg.finish_reason if msg.HasField("finish_reason") else None,
            usage=Usage(msg.usage.prompt_tokens, msg.usage.completion_tokens) if msg.HasField("usage") else None,
            ttft_ms=msg.ttft_ms if msg.HasField("ttft_ms") else None,
            e2e_ms=msg.e2e_ms if msg.HasField("e2e_ms") else None,
            metrics=MappingProxyType(dict(msg.metrics)),
            logprobs=tuple(TokenLogprob.from_proto(lp) for lp in msg.logprobs),
        )


@dataclass(frozen=True)
class Completion:
    """A whole generation, collected from its chunks by ``complete()``."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None
    usage: Usage | None
    ttft_ms: float | None
    e2e_ms: float | None
    metrics: Mapping[str, float]
    logprobs: tuple[TokenLogprob, ...] = ()


class CompletionCollector:
    """Folds chunks into a ``Completion`` (shared by the sync and async clients)."""

    def __init__(self, request_id: str) -> None:
        self._request_id = request_id
        self._token_ids: list[int] = []
        self._text: list[str] = []
        self._last: Chunk | None = None
        self._ttft_ms: float | None = None
        self._logprobs: list[TokenLogprob] = []

    def add(self, chunk: Chunk) -> None:
        self._token_ids.extend(chunk.token_ids)
        self._logprobs.extend(chunk.logprobs)
        self._text.append(chunk.text)
        if self._ttft_ms is None:
            self._ttft_ms = chunk.ttft_ms
        self._last = chunk

    def result(self) -> Completion:
        last = self._last
        return Completion(
            request_id=self._request_id,
            token_ids=tuple(self._token_ids),
            text="".join(self._text),
            finish_reason=last.finish_reason if last else None,
            usage=last.usage if last else None,
            ttft_ms=self._ttft_ms,
            e2e_ms=last.e2e_ms if last else None,
            metrics=last.metrics if last else MappingProxyType({}),
            logprobs=tuple(self._logprobs),
        )


@dataclass(frozen=True)
class HealthStatus:
    serving: bool
    model: str

    @classmethod
    def from_proto(cls, msg: pb.HealthResponse) -> HealthStatus:
        return cls(serving=msg.serving, model=msg.model)


@dataclass(frozen=True)
class WorkerInfo:
    """One worker in ``cluster_status()``; ``policy`` is empty when the worker did not answer in time.

    ``state`` is the supervisor's (starting, active, dead, restarting), ``health`` the monitor's by its own
    clock (serving, starting, stale, stuck, draining, dead); ``incarnation`` counts the worker's lives from 0.
    ``lifecycle`` is the elastic controller's (starting, active, draining, flipping); ``flips`` counts its role
    changes, ``last_flip_ms`` the latest from the order to its first request in the new role and
    ``last_flip_switch_ms`` from the end of its drain (None: no flip yet, or none served since);
    ``last_flip_engine_ms`` is the role swap on its engine alone, as the worker timed it. ``transport`` is the
    KV transport its endpoint runs (shm, tcp).
    """

    worker_id: str
    role: str
    state: str
    load: Mapping[str, float]
    policy: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    incarnation: int = 0
    restarts: int = 0
    health: str = ""
    lifecycle: str = ""
    flips: int = 0
    last_flip_ms: float | None = None
    last_flip_switch_ms: float | None = None
    last_flip_engine_ms: float | None = None
    transport: str = ""


@dataclass(frozen=True)
class ClusterStatus:
    model: str
    workers: tuple[WorkerInfo, ...]
    requests_in_flight: int
    dashboard_url: str
    preset: str = ""  # the paper's configuration the service runs ("" for none)
    mode: str = ""  # disaggregated | colocated

    @classmethod
    def from_proto(cls, msg: pb.ClusterStatusResponse) -> ClusterStatus:
        workers = tuple(
            WorkerInfo(
                w.worker_id,
                w.role,
                w.state,
                MappingProxyType(dict(w.load)),
                MappingProxyType(dict(w.policy)),
                w.incarnation,
                w.restarts,
                w.health,
                w.lifecycle,
                w.flips,
                w.last_flip_ms if w.HasField("last_flip_ms") else None,
                w.last_flip_switch_ms if w.HasField("last_flip_switch_ms") else None,
                w.last_flip_engine_ms if w.HasField("last_flip_engine_ms") else None,
                w.transport,
            )
            for w in msg.workers
        )
        return cls(
            model=msg.model,
            workers=workers,
            requests_in_flight=msg.requests_in_flight,
            dashboard_url=msg.dashboard_url,
            preset=msg.preset,
            mode=msg.mode,
        )


@dataclass(frozen=True)
class WorkerPolicy:
    """One worker's scheduling policies, e.g. ``{"queue": "sjf", "sched_batch": "128"}``."""

    worker_id: str
    role: str
    policy: Mapping[str, str]


@dataclass(frozen=True)
class PolicyUpdate:
    """What ``set_policy()`` changed: every targeted worker with its policies as they now are."""

    workers: tuple[WorkerPolicy, ...]

    def policy_of(self, worker_id: str) -> Mapping[str, str]:
        """The policies of ``worker_id``; ``KeyError`` if the change did not touch it."""
        for w in self.workers:
            if w.worker_id == worker_id:
                return w.policy
        raise KeyError(worker_id)

    @classmethod
    def from_proto(cls, msg: pb.SetPolicyResponse) -> PolicyUpdate:
        return cls(tuple(WorkerPolicy(w.worker_id, w.role, MappingProxyType(dict(w.policy))) for w in msg.workers))
