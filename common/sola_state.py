"""SOLA §4.3, the state monitor: each request's real-time latencies and lengths, and the system's statistics.

After every iteration SOLA updates, per request r (Table 1's request states),

    t_r^TTFT   the real-time TTFT: (now − arrival) while its prompt computes, (first token − arrival) after
    t_r^TPOT   the real-time TPOT: (now − first token) / (l_r^out − 1) once it has two tokens, else 0
    l_r^out    the output tokens generated so far
    l_r^left   the predicted tokens still to generate, from the output-length distribution D_i

and, over the live requests (Table 1's system states),

    p_i^TTFT = max_r t_r^TTFT / T^TTFT,   p_i^TPOT = max_r t_r^TPOT / T^TPOT     (§4.3 (2))
    D_i       finished requests' output lengths by (input-length range, max-output range)   (§4.3 (4))
    m_i^ratio the used share of the KV cache                                                  (§4.3 (5))

Each request is measured against its own SLO (T_r^TTFT, T_r^TPOT; the service's SLO classes give one to a
request that names none), so p_i is the largest ratio t_r / T_r; a request without that SLO counts in neither
maximum. t^TPOT counts the time since the first token over the tokens after it (TPOT excludes the first
token), and it counts the time up to ``now``, so a request waiting for its next token sees its TPOT grow.

The monitor is fed from the views the schedulers already build (the prefill planner's ``ReqView``s, the
colocated engine's decoding requests), as plain ``Observed`` records; it lives in ``common`` because both
sides feed it — the prefill engine its prompts, the colocated engine its prompts and its decodes — and it
imports neither side's views. It reads no clock: ``update`` takes the time. A request's first-token time is
the ``now`` of the first update that sees it with a token: the scheduler updates at the start of the iteration
after the one that produced the token, so the first-token time is late by the scheduling gap between the two.

D_i: the ranges are powers of two (the bit length of the input length and of ``max_tokens``), which SOLA
leaves open; the last ``DISTRIBUTION_KEPT`` lengths of each range are kept. l^left is the median of the
range's lengths that exceed l^out, less l^out; with none recorded it is the request's own estimate (the length
predictor's), else ``max_tokens − l^out``. A request leaves the monitor, and its length goes into D_i, when an
update no longer lists it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

DISTRIBUTION_KEPT = 256  # lengths kept per (input range, output range) of D_i


@dataclass(frozen=True)
class Observed:
    """One live request at an iteration's end, as the scheduler's views give it."""

    request_id: str
    arrival: float
    prompt_len: int  # l^in
    max_tokens: int
    generated: int = 0  # l^out: output tokens so far (0 while its prompt computes)
    ttft_slo_s: float | None = None  # T_r^TTFT
    tpot_slo_s: float | None = None  # T_r^TPOT (the service's TBT objective)
    estimate: int | None = None  # the length predictor's total output estimate, when there is one


@dataclass(frozen=True)
class RequestState:
    """Table 1's request states at iteration i."""

    request_id: str
    t_ttft: float
    t_tpot: float  # 0 until the request has two output tokens
    l_out: int
    l_left: int
    l_in: int
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None

    @property
    def prefilling(self) -> bool:
        return self.l_out == 0

    @property
    def ttft_ratio(self) -> float | None:
        """t^TTFT / T^TTFT; None without a TTFT SLO."""
        return self.t_ttft / self.ttft_slo_s if self.ttft_slo_s else None

    @property
    def tpot_ratio(self) -> float | None:
        """t^TPOT / T^TPOT; None without a TPOT SLO or before the request has a TPOT."""
        return self.t_tpot / self.tpot_slo_s if self.tpot_slo_s and self.t_tpot > 0 else None


def _share_met(ratios: Sequence[float]) -> float:
    """The share of requests meeting their SLO (ratio ≤ 1); 1 when none has the SLO."""
    return sum(1 for x in ratios if x <= 1.0) / len(ratios) if ratios else 1.0


@dataclass(frozen=True)
class SystemState:
    """Table 1's system states at iteration i."""

    now: float
    requests: tuple[RequestState, ...] = ()
    m_ratio: float = 0.0
    ttft_ratios: tuple[float, ...] = field(default=(), repr=False)
    tpot_ratios: tuple[float, ...] = field(default=(), repr=False)

    @classmethod
    def of(cls, now: float, requests: Iterable[RequestState], m_ratio: float = 0.0) -> SystemState:
        reqs = tuple(requests)
        ttft = tuple(x for x in (r.ttft_ratio for r in reqs) if x is not None)
        tpot = tuple(x for x in (r.tpot_ratio for r in reqs) if x is not None)
        return cls(now, reqs, m_ratio, ttft, tpot)

    @property
    def p_ttft(self) -> float:
        """p_i^TTFT = max_r t_r^TTFT / T_r^TTFT (0 when no request has a TTFT SLO)."""
        return max(self.ttft_ratios, default=0.0)

    @property
    def p_tpot(self) -> float:
        """p_i^TPOT = max_r t_r^TPOT / T_r^TPOT (0 when no request has a TPOT yet)."""
        return max(self.tpot_ratios, default=0.0)

    @property
    def ttft_share_met(self) -> float:
        """a% of §4.4.1 for TTFT: the share of requests within their TTFT SLO."""
        return _share_met(self.ttft_ratios)

    @property
    def tpot_share_met(self) -> float:
        """a% of §4.4.1 for TPOT: the share of requests with a TPOT within their TPOT SLO."""
        return _share_met(self.tpot_ratios)

    def get(self, request_id: str) -> RequestState | None:
        return next((r for r in self.requests if r.request_id == request_id), None)


def _range(n: int) -> int:
    return max(0, n).bit_length()


class LengthDistribution:
    """D_i: output lengths of finished requests by (input-length range, max-output range), powers of two."""

    def __init__(self, kept: int = DISTRIBUTION_KEPT) -> None:
        self.kept = kept
        self._lengths: dict[tuple[int, int], deque[int]] = {}

    def record(self, l_in: int, max_tokens: int, l_out: int) -> None:
        key = (_range(l_in), _range(max_tokens))
        self._lengths.setdefault(key, deque(maxlen=self.kept)).append(l_out)

    def predict_left(self, l_in: int, max_tokens: int, l_out: int) -> int | None:
        """The median of the range's lengths above ``l_out``, less ``l_out``; None with none recorded."""
        seen = self._lengths.get((_range(l_in), _range(max_tokens)), ())
        longer = [n for n in seen if n > l_out]
        if not longer:
            return None
        return max(0, min(max_tokens, math.ceil(statistics.median(longer))) - l_out)

    def __len__(self) -> int:
        return sum(len(d) for d in self._lengths.values())


class StateMonitor:
    """Updated once an iteration with the live requests (§4.3); returns the system state."""

    def __init__(self, distribution: LengthDistribution | None = None) -> None:
        self.distribution = distribution or LengthDistribution()
        self._first_token: dict[str, float] = {}  # request id -> when its first token was seen
        self._last: dict[str, Observed] = {}  # the previous update's requests

    def l_left(self, o: Observed) -> int:
        predicted = self.distribution.predict_left(o.prompt_len, o.max_tokens, o.generated)
        if predicted is not None:
            return predicted
        total = o.estimate if o.estimate is not None else o.max_tokens
        return max(0, min(total, o.max_tokens) - o.generated)

    def state_of(self, o: Observed, now: float) -> RequestState:
        first = self._first_token.get(o.request_id)
        t_ttft = (first if first is not None else now) - o.arrival
        t_tpot = (now - first) / (o.generated - 1) if first is not None and o.generated >= 2 else 0.0
        return RequestState(
            o.request_id,
            max(0.0, t_ttft),
            max(0.0, t_tpot),
            o.generated,
            self.l_left(o),
            o.prompt_len,
            o.ttft_slo_s,
            o.tpot_slo_s,
        )

    def update(
        self, now: float, observed: Sequence[Observed], used_blocks: int = 0, total_blocks: int | None = None
    ) -> SystemState:
        live = {o.request_id: o for o in observed}
        for rid, last in self._last.items():  # finished (or aborted): its length goes into D_i
            if rid not in live:
                if last.generated > 0:
                    self.distribution.record(last.prompt_len, last.max_tokens, last.generated)
                self._first_token.pop(rid, None)
        for o in observed:
            if o.generated >= 1 and o.request_id not in self._first_token:
                self._first_token[o.request_id] = now
        self._last = live
        m_ratio = used_blocks / total_blocks if total_blocks else 0.0
        return SystemState.of(now, (self.state_of(o, now) for o in observed), m_ratio)

    @property
    def tracked(self) -> int:
        return len(self._last)
