"""A small step-by-step model of one decode engine's KV (for policy tests, no vLLM).

Each step: waiting requests are put to the admission policy in its order (first
refusal holds the rest); every running request needs the blocks of context + 1;
while the batch does not fit, the preemption order's first victim goes back to
the front of the waiting queue holding nothing (recompute); then every running
request generates one token and those that reach their true length finish.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tetriserve.common.length import LengthEstimate
from tetriserve.decode_worker.admission.base import AdmissionPolicy
from tetriserve.decode_worker.preemption.order import PreemptionOrder, VllmOrder
from tetriserve.decode_worker.views import DecodeReqView, DecodeState, blocks_for


@dataclass
class SimResult:
    preemptions: int
    steps: int
    finished: int
    max_batch: int


def view(rid: str, prompt: int, truth: int, predicted: int, arrival: float, width: int = 100) -> DecodeReqView:
    """A request whose predicted range is [predicted, predicted + width) (exact when predicted = truth)."""
    est = LengthEstimate(predicted, predicted, predicted + width, predicted // width, 0.9, "sim")
    return DecodeReqView(rid, prompt, max_tokens=truth, arrival_time=arrival, estimate=est)


def simulate(
    reqs: list[DecodeReqView],
    num_blocks: int,
    block_size: int,
    admission: AdmissionPolicy,
    order: PreemptionOrder | None = None,
    max_steps: int = 100_000,
) -> SimResult:
    """``max_tokens`` of each view is its true output length."""
    order = order or VllmOrder()
    waiting = list(reqs)
    running: list[DecodeReqView] = []
    preemptions = finished = max_batch = steps = 0
    while (waiting or running) and steps < max_steps:
        steps += 1
        used = sum(r.held_blocks for r in running)
        state = DecodeState(num_blocks - used, block_size, tuple(running), now=float(steps))
        for r in admission.order(waiting, state):
            if not admission.admit(r, state):
                break
            state = state.with_admitted(r)
            waiting.remove(r)
        running = list(state.running)
        need = {r.request_id: blocks_for(r.context + 1, block_size) for r in running}
        while running and sum(need[r.request_id] for r in running) > num_blocks:
            victim = order.victims(running)[0]
            running.remove(victim)
            waiting.insert(0, replace(victim, held_blocks=0))
            preemptions += 1
        max_batch = max(max_batch, len(running))
        nxt = []
        for r in running:
            r = replace(r, generated=r.generated + 1, held_blocks=need[r.request_id])
            if r.generated >= r.max_tokens:
                finished += 1
            else:
                nxt.append(r)
        running = nxt
    return SimResult(preemptions, steps, finished, max_batch)
