"""The parts of an in-process vLLM ``LLMEngine`` that tetriserve's engine code reaches, as it has them.

vLLM declares ``LLMEngine`` for every way it can run: its core client as the ``EngineCoreClient`` base and a
step's outputs as generation or pooling outputs. A worker's engine is one way only: in process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``engine_env``), so its client is an ``InprocClient`` that holds the
``EngineCore`` and through it the scheduler, and it serves a generating model, so every step's output is a
``RequestOutput``. ``InProcessEngine`` declares that engine; ``open_engine`` builds one. Importing this module
imports no vLLM (its types are read by the type checker only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.logprobs import Logprob
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.metrics.loggers import StatLoggerFactory


class Completion(Protocol):
    """One sequence of a ``RequestOutput`` (vLLM's ``CompletionOutput``): this step's tokens, when a delta."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def logprobs(self) -> Sequence[dict[int, Logprob] | None] | None: ...


class GeneratedOutput(Protocol):
    """vLLM's ``RequestOutput`` of one request after one step."""

    @property
    def request_id(self) -> str: ...

    @property
    def finished(self) -> bool: ...

    @property
    def outputs(self) -> Sequence[Completion]: ...


class EngineCore(Protocol):
    """vLLM's ``EngineCore`` in this process: the scheduler every step runs, and ``post_step``, the hook a step
    ends with (an attribute, so that ``EngineLoop`` can wrap it)."""

    scheduler: Scheduler
    post_step: Callable[[bool], None]


class InProcessClient(Protocol):
    """vLLM's ``InprocClient``: the engine core it runs in this process."""

    @property
    def engine_core(self) -> EngineCore: ...

    def shutdown(self) -> None: ...


class InProcessEngine(Protocol):
    """An ``LLMEngine`` of a generating model that runs its core in this process."""

    @property
    def vllm_config(self) -> VllmConfig: ...

    @property
    def engine_core(self) -> InProcessClient: ...

    def add_request(self, request_id: str, prompt: TokensPrompt, params: SamplingParams) -> str: ...

    def abort_request(self, request_ids: list[str]) -> None: ...

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> Sequence[GeneratedOutput]: ...


def open_engine(engine_args: EngineArgs, stat_loggers: list[StatLoggerFactory] | None = None) -> InProcessEngine:
    """``LLMEngine.from_engine_args(engine_args, stat_loggers=stat_loggers)``, as the in-process engine it is
    (the environment of ``engine_env`` must be in place before vLLM is first imported)."""
    from vllm.v1.engine.llm_engine import LLMEngine

    # vLLM's declared types are those of every engine (see the module's docstring); this one's are narrower
    engine: InProcessEngine = LLMEngine.from_engine_args(  # type: ignore[assignment]
        engine_args, stat_loggers=stat_loggers
    )
    return engine
