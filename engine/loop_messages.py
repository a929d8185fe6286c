"""The typed messages of an engine loop (``engine/loop.py``): what its owner sends the engine thread, and what the
thread hands back (per-request deltas, the published snapshot)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from tetriserve.common.stream import TokenLogprobs
from tetriserve.engine.sampling import from_vllm_logprobs
from tetriserve.engine.stats import EngineStats
from tetriserve.engine.vllm_engine import GeneratedOutput

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

logger = logging.getLogger(__name__)

_T_co = TypeVar("_T_co", covariant=True)  # what a scheduler call returns


@dataclass(frozen=True)
class Delta:
    """New output tokens of one request: one engine step's, or the steps' of one stream interval (``logprobs``: one
    entry per token, when asked for)."""

    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprobs, ...] | None = None


Sink = Callable[[Delta], None]
Hook = Callable[[], None]


@dataclass(frozen=True)
class InlineSink:
    """A request's sink on the engine thread: ``take(delta)`` for each delta that does not finish the request,
    True if it took it there, False to leave it to the event loop's sink; ``flush()`` once after a batch's
    deltas, if it took any (one flush shared by many requests runs once)."""

    take: Callable[[Delta], bool]
    flush: Hook


@dataclass(frozen=True)
class Output:
    """Where a request's deltas go: ``sink``, called on ``loop`` (the event loop that added the request), unless
    ``inline`` takes them on the engine thread first. A finish always goes to ``sink``."""

    loop: asyncio.AbstractEventLoop
    sink: Sink
    inline: InlineSink | None = None


@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    output: Output
    on_added: Hook | None = None  # called on the engine thread once vLLM has the request (tracing)


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class CallScheduler(Generic[_T_co]):
    fn: Callable[[Scheduler], _T_co]
    result: concurrent.futures.Future[_T_co]  # only the engine thread sets it, to what ``fn`` returned


@dataclass(frozen=True)
class Stop:
    """End the engine thread (``close``)."""


Command = AddRequest | AbortRequest | CallScheduler[object] | Stop


@dataclass(frozen=True)
class EngineSnapshot:
    """What the engine thread published after its latest step."""

    stats: EngineStats
    extra: object = None  # ``snapshot_fn(scheduler)``


def merged(batch: list[tuple[Output, Delta]]) -> list[tuple[Output, Delta]]:
    """One delta per request where several steps' are held: tokens (and logprobs) joined in order, up to its
    finish; the requests' order of first appearance kept."""
    out: list[tuple[Output, Delta]] = []
    at: dict[int, int] = {}  # id of a request's output -> its place in ``out``
    for output, delta in batch:
        i = at.get(id(output))
        if i is None or out[i][1].finish_reason is not None:
            at[id(output)] = len(out)
            out.append((output, delta))
            continue
        prev = out[i][1]
        logprobs = prev.logprobs + delta.logprobs if prev.logprobs is not None and delta.logprobs is not None else None
        out[i] = (output, Delta(prev.token_ids + delta.token_ids, delta.finish_reason, delta.error, logprobs))
    return out


def dispatch(batch: list[tuple[Output, Delta]]) -> None:
    """Hand ``batch`` (from the engine thread) to the outputs' inline sinks where they take it, the rest to the
    event loops that added its requests: one wake-up per loop, none for a batch the inline sinks took whole."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Sink, Delta]]] = {}
    flushes: dict[Hook, None] = {}
    for output, delta in batch:
        if output.inline is not None and delta.finish_reason is None and _took(output.inline, delta):
            flushes[output.inline.flush] = None
            continue
        by_loop.setdefault(output.loop, []).append((output.sink, delta))
    for flush in flushes:
        try:
            flush()
        except Exception:
            logger.exception("engine output flush failed")
    for loop, deltas in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, deltas)
        except RuntimeError:  # that loop has closed: nobody is waiting for these
            logger.debug("dropped %d deltas for a closed event loop", len(deltas))


def _deliver(batch: list[tuple[Sink, Delta]]) -> None:
    for sink, delta in batch:
        try:
            sink(delta)
        except Exception:  # one request's consumer must not cost the others their tokens
            logger.exception("engine output sink failed")


def delta_of(out: GeneratedOutput) -> Delta:
    """The delta of one vLLM ``RequestOutput`` (``RequestOutputKind.DELTA``)."""
    completion = out.outputs[0] if out.outputs else None
    tokens = tuple(completion.token_ids) if completion is not None else ()
    reason = None
    if out.finished:
        reason = (completion.finish_reason if completion is not None else None) or "stop"
    error = "KV cache transfer failed" if reason == "error" else None
    logprobs = from_vllm_logprobs(completion.logprobs) if completion is not None else None
    return Delta(tokens, reason, error, logprobs)


def _took(inline: InlineSink, delta: Delta) -> bool:
    try:
        return inline.take(delta)
    except Exception:  # its owner's bug: the delta takes the ordinary way
        logger.exception("inline engine output sink failed")
        return False
