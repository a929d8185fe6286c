"""The decode engine's vLLM scheduler subclass (``scheduler_cls``): admission policies gate who starts.

Each ``schedule()`` call:

    1. views of the running batch (context, tokens generated, the predicted length range from
       ``SamplingParams.extra_args["tetriserve_length"]``) and the KV that is free
    2. every waiting request that would *start decoding* now is put to the admission policy,
       in arrival order, each admitted one folded into the state before the next is asked;
       the first refusal stops admission for this step (no overtaking)
    3. refused requests are held aside for this one call, then ``super().schedule()``

A request that still has to pull its prompt's KV through the connector (no
blocks yet) is never held: it must get its blocks so its KV can land; it is
gated once its KV is in, holding those blocks. Preemptions vLLM performs are
counted (``preemptions``), the measure reserve policies exist to bring down.
"""

from __future__ import annotations

import math
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from common.length import LengthEstimate
from decode_worker.admission import AdmissionPolicy, make_admission_policy
from decode_worker.views import DecodeReqView, DecodeState

LENGTH_KEY = "tetriserve_length"  # SamplingParams.extra_args key: LengthEstimate.to_dict()


class TetriDecodeScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.admission: AdmissionPolicy = make_admission_policy("greedy")
        self.preemptions = 0

    def configure(self, policy: AdmissionPolicy) -> None:
        self.admission = policy

    def _view(self, req: Any) -> DecodeReqView:
        params = req.sampling_params
        extra = (params.extra_args or {}) if params is not None else {}
        est = extra.get(LENGTH_KEY)
        return DecodeReqView(
            request_id=req.request_id,
            prompt_len=req.num_prompt_tokens,
            max_tokens=params.max_tokens if params is not None and params.max_tokens else 1,
            arrival_time=req.arrival_time,
            generated=len(req.output_token_ids),
            estimate=LengthEstimate.from_dict(est) if isinstance(est, dict) else None,
            held_blocks=math.ceil(req.num_computed_tokens / self.block_size),
        )

    def remaining_tokens(self) -> int:
        """Σ predicted tokens still to generate over running and queued requests (called from another thread)."""
        reqs = [*list(self.running), *list(self.kv_holding_waiting), *list(self.waiting)]
        return sum(self._view(r).predicted_remaining("estimate") for r in reqs)

    def _must_pass(self, req: Any) -> bool:
        """A request whose KV has yet to be pulled through the connector (it needs its blocks first)."""
        return req.num_computed_tokens == 0 and req.kv_transfer_params is not None

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        candidates = [
            (queue, req)
            for queue in (self.kv_holding_waiting, self.waiting)
            for req in queue
            if not (self._must_pass(req) or self._is_blocked_waiting_status(req.status))
        ]
        if not candidates:  # the common decode step: nobody waits to start, no views to build
            return super().schedule(*args, **kwargs)
        policy = self.admission
        running = tuple(self._view(r) for r in self.running)
        state = DecodeState(self.kv_cache_manager.block_pool.get_num_free_blocks(), self.block_size, running)
        held: list[tuple[Any, Any]] = []  # (queue, request): refused, or behind a refusal
        for queue, req in sorted(candidates, key=lambda c: c[1].arrival_time):
            view = self._view(req)
            if not held and policy.admit(view, state):
                state = state.with_admitted(view)
            else:
                held.append((queue, req))
        for queue, req in held:
            queue.remove_request(req)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            for queue, req in held:
                queue.add_request(req)

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        self.preemptions += 1
        super()._preempt_request(request, *args, **kwargs)
