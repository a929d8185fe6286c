"""Output tokens generated on another engine count as output here: a vLLM logits processor (decode engines).

A decode engine gets each request as ``prompt + every token generated so far``
(the prefill worker's first token; everything before an SCLS slice move): vLLM
cannot add a request with output already generated. ``engine.sampling.to_vllm``
shifts ``min_tokens`` and ``max_tokens`` by those k prior tokens and names k in
``extra_args[PRIOR_KEY]``; this processor adds what the penalties that count
output occurrences would have charged for them, so sampling matches one engine
that generated every token itself.

vLLM runs custom processors first, then the repetition penalty r over prompt
and output tokens, then subtracts f·count + p·[count > 0] for output tokens.
For a prior token t (in the prompt, so r already applies to it) we want

    rep(l_t) − f·(c_out + c_prior) − p·[c_out + c_prior > 0]

and vLLM will compute rep(l'_t) − f·c_out − p·[c_out > 0], so

    l'_t = rep⁻¹( rep(l_t) − f·c_prior − p·[c_prior > 0 and c_out = 0] )

with rep(x) = x/r for x > 0, x·r otherwise. Requests without presence or
frequency penalty are not tracked, so they cost nothing here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from tetriserve.engine.sampling import PRIOR_KEY

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams


@dataclass(frozen=True)
class _Prior:
    tokens: torch.Tensor  # distinct prior tokens
    counts: torch.Tensor  # their occurrences among the prior tokens (float)
    token_list: tuple[int, ...]
    presence: float
    frequency: float
    repetition: float
    output: list[int]  # vLLM's running output list (a live reference)


class PriorOutputPenalties(LogitsProcessor):
    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        self.priors: dict[int, _Prior] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # penalties change which token is most likely

    def _new(self, params: SamplingParams, prompt: list[int] | None, output: list[int]) -> _Prior | None:
        k = int((params.extra_args or {}).get(PRIOR_KEY, 0))
        if k <= 0 or not prompt or not (params.presence_penalty or params.frequency_penalty):
            return None
        counts = Counter(prompt[-k:])
        tokens = tuple(counts)
        return _Prior(
            torch.tensor(tokens, dtype=torch.long, device=self.device),
            torch.tensor([counts[t] for t in tokens], dtype=torch.float32, device=self.device),
            tokens,
            float(params.presence_penalty),
            float(params.frequency_penalty),
            float(params.repetition_penalty),
            output,
        )

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.priors, batch_update, self._new)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, prior in self.priors.items():
            row = logits[index]
            values = row[prior.tokens]
            r = prior.repetition
            y = torch.where(values > 0, values / r, values * r) if r != 1.0 else values
            seen = set(prior.output)
            absent = torch.tensor([t not in seen for t in prior.token_list], dtype=torch.float32, device=self.device)
            y = y - prior.frequency * prior.counts - prior.presence * absent
            row[prior.tokens] = torch.where(y > 0, y * r, y / r) if r != 1.0 else y
        return logits
