"""CacheOpt admission: padded grants with reuse, SLO-aware selection and amortisation, proactive allocation and a
global reserve (CacheOpt §3.3.1–§3.3.3; Table 2's notation; §5's defaults).

Each request's demand is its *padded* prediction Mᵢ = s_p + s_o + b, where s_o is the served estimate, already
Hoeffding-padded by the length predictor at confidence c = α/(1+βλ) (CacheOpt §3.2, eq. 3–4,
``length_predictor/padding.py``). vLLM's paged KV allocates blocks on demand and keeps no per-request reservation
to carve up, so each of the paper's allocation steps becomes a rule of whether a waiting request may start:

* **reuse of allocated-but-unused KV** (§3.3.1, the embedding method): admission is time-aware. A newcomer may use
  KV that a running request has been granted but will only grow into later, provided the newcomer is predicted to
  finish first, with ``buffer_tokens`` (the paper's b) of slack per request. This is the peak check of ``peak.py``
  over every predicted finish; with two requests it reduces to the paper's condition
  aⱼ − (uⱼ + s_iᵒ) − (s_iᵖ + s_iᵒ) ≥ b.
* **request selection** (§3.3.2): waiting requests (new to this engine, or preempted and returned) are put to
  admission by ascending remaining time to their TBT SLO, RT_tbt = SLO_tbt − (now − their latest token); those
  without an SLO come last, in arrival order. A request with RT_tbt − T_I^max < ε is *critical* (T_I^max: the
  longest recent step, ``DecodeState.max_step_s``; ε: one smoothed step, ``DecodeState.step_s``, the paper's
  "small number"). Critical requests go first, in descending order of their basic demand s_p + B
  (B = ``basic_tokens``), and start on that basic demand when the padded check refuses them: s_p + B must fit
  the free KV less the reserve. What their full demand lacks later comes from vLLM's preemption of a running
  request in the §3.4 order, the paper's "preemptions are executed to make A'_kvc = D_kvc".
* **amortisation** (§3.3.2, case Σ Mᵢ > A'_kvc): a non-critical request the peak check refuses may still start
  with its demand cut. The excess E_kvc = Σ Mᵢ + D_kvc − A'_kvc (tokens; A'_kvc: the batch's KV less the reserve;
  D_kvc: the critical members' basic demands) is spread over the non-critical members, the newcomer included, by
  wᵢ = RTᵢ/ΣRT × s_iᵖ/Σs^p: member i's grant is Aᵢ = Mᵢ − E_kvc · wᵢ/Σw, so a looser SLO and a longer prompt take
  a larger cut. It starts when every such grant still covers its member's context + B, and each member whose
  grant runs out before its predicted finish has a running request rⱼ predicted to finish before then, releasing
  at least that member's cut (the paper's rⱼ "that will release its KVC shortly before rᵢ exhausts its allocated
  KVC").
* **proactive allocation** (§3.3.3): a running request that has outlived its padded estimate is treated as still
  needing m = ``proactive_iters`` more iterations' tokens (one token per decode iteration), granted ahead of
  need, before any newcomer is admitted, instead of being ignored until its next block allocation fails.
* **global reserve** (§3.3.3): ``reserve_blocks`` are kept out of what admission grants. vLLM allocates from the
  one shared pool, so a request that overruns its grant draws on those blocks instead of forcing a preemption.

An empty batch admits whatever fits now, so a request larger than its grant still runs (alone). Decisions it
counts (``common/decisions.py``): ``slack_order`` (a step whose waiting requests it put in an order other than
arrival), ``critical`` (a critical request started on its basic demand that the padded check refused),
``amortised`` (a request started with an amortised grant that the padded check refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from tetriserve.common.decisions import Decisions
from tetriserve.decode_worker.admission.peak import admits
from tetriserve.decode_worker.views import DecodeReqView, DecodeState, blocks_for

TOKENS_PER_ITER = 1  # a decode iteration makes one token per request (no speculative decoding)


class CacheOptAdmission:
    name: ClassVar[str] = "cacheopt"

    def __init__(
        self, reserve_blocks: int = 8, proactive_iters: int = 2, buffer_tokens: int = 8, basic_tokens: int = 8
    ) -> None:
        if min(reserve_blocks, proactive_iters, buffer_tokens, basic_tokens) < 0:
            raise ValueError(
                "cacheopt admission: reserve_blocks, proactive_iters, buffer_tokens and basic_tokens must be >= 0"
            )
        self.reserve_blocks = reserve_blocks
        self.proactive_iters = proactive_iters
        self.buffer_tokens = buffer_tokens
        self.basic_tokens = basic_tokens
        self.decisions = Decisions(self.name)
        self._critical: frozenset[str] = frozenset()  # this step's critical requests, from ``order``

    # -- demands ----------------------------------------------------------------------------------------
    def remaining(self, r: DecodeReqView) -> int:
        """Its padded remaining demand; once outlived, m iterations' tokens (capped by max_tokens)."""
        rem = r.predicted_remaining("estimate")
        if rem == 0:
            rem = min(self.proactive_iters * TOKENS_PER_ITER, max(0, r.max_tokens - r.generated))
        return rem

    def demand(self, r: DecodeReqView) -> int:
        """Mᵢ in tokens: its context, its padded remaining output and the buffer b."""
        return r.context + self.remaining(r) + self.buffer_tokens

    def basic(self, r: DecodeReqView) -> int:
        """Its basic demand in tokens: its context and B (a request that lost its KV needs its context back)."""
        return r.context + self.basic_tokens

    # -- §3.3.2 selection -------------------------------------------------------------------------------
    @staticmethod
    def is_critical(r: DecodeReqView, state: DecodeState) -> bool:
        """RT_tbt − T_I^max < ε, with ε one smoothed step."""
        slack = r.tbt_slack(state.now)
        return slack is not None and slack - state.max_step_s < state.step_s

    def order(self, waiting: Sequence[DecodeReqView], state: DecodeState) -> list[DecodeReqView]:
        """Critical requests first, by descending basic demand; then ascending TBT slack; no SLO last."""
        critical = [r for r in waiting if self.is_critical(r, state)]
        rest = [r for r in waiting if not self.is_critical(r, state)]
        critical.sort(key=lambda r: (-self.basic(r), r.arrival_time))

        def by_slack(r: DecodeReqView) -> tuple[bool, float, float]:
            slack = r.tbt_slack(state.now)
            return (slack is None, slack if slack is not None else 0.0, r.arrival_time)

        ordered = critical + sorted(rest, key=by_slack)
        self._critical = frozenset(r.request_id for r in critical)
        arrival = sorted(waiting, key=lambda r: r.arrival_time)
        if [r.request_id for r in ordered] != [r.request_id for r in arrival]:
            self.decisions.count("slack_order")
        return ordered

    # -- admission --------------------------------------------------------------------------------------
    def admit(self, req: DecodeReqView, state: DecodeState) -> bool:
        if admits(req, state, self.remaining, reserve=self.reserve_blocks, pad=self.buffer_tokens):
            return True
        if req.request_id in self._critical:
            need = blocks_for(self.basic(req), state.block_size) - req.held_blocks
            if need <= state.free_blocks - self.reserve_blocks:
                self.decisions.count("critical")
                return True
            return False
        if self.amortises(req, state):
            self.decisions.count("amortised")
            return True
        return False

    def grants(self, req: DecodeReqView, state: DecodeState) -> dict[str, float]:
        """Aᵢ in tokens for every member of the batch with ``req`` (critical members: their basic demand; the
        others: Mᵢ less their share of the excess by wᵢ = RTᵢ/ΣRT × s_iᵖ/Σs^p)."""
        members = (*state.running, req)
        available = (state.capacity + req.held_blocks - self.reserve_blocks) * state.block_size  # A'_kvc
        fixed = {r.request_id: float(self.basic(r)) for r in members if r.request_id in self._critical}
        shared = [r for r in members if r.request_id not in self._critical]
        excess = sum(map(self.demand, shared)) + sum(fixed.values()) - available  # E_kvc
        out = dict(fixed)
        if excess <= 0 or not shared:
            out.update({r.request_id: float(self.demand(r)) for r in shared})
            return out
        for r, w in zip(shared, _weights(shared, state), strict=True):
            out[r.request_id] = self.demand(r) - excess * w
        return out

    def amortises(self, req: DecodeReqView, state: DecodeState) -> bool:
        """Whether ``req`` may start on an amortised grant: every non-critical member keeps its context + B, and
        each one whose grant runs out before its predicted finish has a running request predicted to finish
        before then, releasing at least its cut."""
        if not state.running:
            return False
        grants = self.grants(req, state)
        for r in (*state.running, req):
            if r.request_id in self._critical:
                continue
            grant = grants[r.request_id]
            if grant < self.basic(r):
                return False
            if grant < r.context + self.remaining(r) and not self._released_for(r, grant, state):
                return False
        return True

    def _released_for(self, r: DecodeReqView, grant: float, state: DecodeState) -> bool:
        """A running request other than ``r`` finishes before ``r`` has generated ``grant − context`` tokens and
        releases at least ``r``'s cut Mᵢ − Aᵢ."""
        lasts, cut = grant - r.context, self.demand(r) - grant
        return any(
            self.remaining(j) < lasts and j.context + self.remaining(j) >= cut
            for j in state.running
            if j.request_id != r.request_id
        )


def _weights(members: Sequence[DecodeReqView], state: DecodeState) -> list[float]:
    """wᵢ / Σw with wᵢ = RTᵢ/ΣRT × s_iᵖ/Σs^p (CacheOpt §3.3.2). RT is clamped at 0 (a late request takes no cut);
    a request without an SLO counts as the loosest one's RT (1 when none has an SLO); all equal when ΣRT is 0."""
    slacks = [r.tbt_slack(state.now) for r in members]
    loosest = max((max(0.0, s) for s in slacks if s is not None), default=1.0)
    rt = [max(0.0, s) if s is not None else loosest for s in slacks]
    if sum(rt) == 0:
        rt = [1.0] * len(members)
    sp = [float(r.prompt_len) for r in members]
    w = [t / sum(rt) * p / sum(sp) for t, p in zip(rt, sp, strict=True)]
    return [x / sum(w) for x in w]
