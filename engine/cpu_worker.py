"""The vLLM worker of tetriserve's CPU engines: seeded sampling survives a prompt split into chunks.

A step that computes a chunk of a prompt other than its last still samples a
token for the request, and vLLM discards it. So that a seeded request draws
the same numbers however its prompt was chunked, vLLM then rewinds the
request's generator with ``gen.set_offset(gen.get_offset() - 4)``
(``GPUModelRunner._bookkeeping_sync``). Only CUDA's Philox generators have an
offset: on a CPU engine the call raises, the whole step fails, and every
request in it fails with it — one user's seeded long prompt would cost the
others theirs (plain vLLM's CPU engine dies the same way).

Here the worker hands every seeded request a ``RewindableGenerator`` and marks
where it stands before each step's sampling; vLLM's rewind returns it to that
mark. The draws, and so the sampled tokens, are then the ones an unchunked
prompt gets. Selected by ``build_engine_args`` (``worker_cls``, ``CPU_WORKER_CLASS``) on CPU only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import GrammarOutput
    from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput


class RewindableGenerator(torch.Generator):
    """A CPU generator that can return to the state ``mark`` saved.

    vLLM only ever calls ``set_offset(get_offset() - 4)``, meaning "undo this
    step's draw"; that is what ``set_offset`` does, whatever its argument.
    """

    _mark: torch.Tensor | None = None

    @classmethod
    def like(cls, generator: torch.Generator) -> RewindableGenerator:
        twin = cls(device=generator.device)
        twin.set_state(generator.get_state())
        return twin

    def mark(self) -> None:
        self._mark = self.get_state()

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> RewindableGenerator:  # offset: see the class docstring
        if self._mark is not None:
            self.set_state(self._mark)
        return self


class TetriCPUWorker(CPUWorker):
    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput | AsyncModelRunnerOutput:
        runner = self.model_runner
        batch = runner.input_batch
        for index, generator in list(batch.generators.items()):
            if not isinstance(generator, RewindableGenerator):
                generator = RewindableGenerator.like(generator)
                batch.generators[index] = generator
                runner.requests[batch.req_ids[index]].generator = generator  # a resumed request keeps its draws
            generator.mark()
        # vLLM's CPUWorker reaches the type checker unannotated here: its result is declared at the override
        output: ModelRunnerOutput | AsyncModelRunnerOutput = super().sample_tokens(grammar_output)
        return output
