"""SLO attainment over a sliding window of finished requests, for the ``slo`` flip policy.

The front doors record every request that finished normally (``observe``):
its TTFT, its time per output token and its objectives (the request's own SLO,
else the config's ``flip.ttft_slo_ms`` / ``tpot_slo_ms``). ``attainment(now)``
is the share of the window's requests with an objective that met it, per
metric; a metric nobody set an objective for is None (the policy ignores it).
Thread-safe: front doors record from their event loops, the controller reads
from the supervision thread.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from tetriserve.control_plane.flip.base import Attainment


@dataclass(frozen=True)
class _Finished:
    at: float
    ttft_met: bool | None  # None: no TTFT objective
    tpot_met: bool | None


class SloWindow:
    def __init__(self, window_s: float, ttft_slo_ms: float | None = None, tpot_slo_ms: float | None = None) -> None:
        self.window_s = window_s
        self.ttft_slo_ms = ttft_slo_ms
        self.tpot_slo_ms = tpot_slo_ms
        self._done: deque[_Finished] = deque()
        self._lock = threading.Lock()

    def observe(
        self,
        now: float,
        ttft_ms: float,
        tpot_ms: float | None,
        ttft_slo_ms: float | None = None,
        tpot_slo_ms: float | None = None,
    ) -> None:
        """One finished request (``tpot_ms`` None: it had one output token); its own objectives win."""
        ttft_goal = ttft_slo_ms if ttft_slo_ms is not None else self.ttft_slo_ms
        tpot_goal = tpot_slo_ms if tpot_slo_ms is not None else self.tpot_slo_ms
        ttft_met = None if ttft_goal is None else ttft_ms <= ttft_goal
        tpot_met = None if tpot_goal is None or tpot_ms is None else tpot_ms <= tpot_goal
        with self._lock:
            self._done.append(_Finished(now, ttft_met, tpot_met))

    def attainment(self, now: float) -> Attainment:
        with self._lock:
            while self._done and self._done[0].at < now - self.window_s:
                self._done.popleft()
            done = list(self._done)
        ttft = [f.ttft_met for f in done if f.ttft_met is not None]
        tpot = [f.tpot_met for f in done if f.tpot_met is not None]
        judged = sum(1 for f in done if f.ttft_met is not None or f.tpot_met is not None)  # no objective: no sample
        return Attainment(
            sum(ttft) / len(ttft) if ttft else None,
            sum(tpot) / len(tpot) if tpot else None,
            judged,
        )
