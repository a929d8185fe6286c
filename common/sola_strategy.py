"""SOLA §4.4.1, Table 2: which constrained problem an iteration solves, and the a%-level loosening.

Each iteration solves one of two problems, optimising the latency that is less fulfilled against its SLO and
holding the other as the constraint:

    optimise TTFT subject to TPOT:  min max_r t_r^TTFT   s.t.  max_r t_r^TPOT ≤ T^TPOT
    optimise TPOT subject to TTFT:  min max_r t_r^TPOT   s.t.  max_r t_r^TTFT ≤ T^TTFT

Table 2 (its text is garbled in the copy this was built from; reconstructed from §4.4.1's prose, Fig. 5 and
the legible cells):

    | condition (either)                                     | problem                                       |
    | (1) 1 > p^TPOT > p^TTFT   (2) p^TPOT > 1 > p^TTFT       | optimise TPOT s.t. TTFT                       |
    | (1) 1 > p^TTFT > p^TPOT   (2) p^TTFT > 1 > p^TPOT       | optimise TTFT s.t. TPOT                       |
    | p^TTFT > 1 and p^TPOT > 1                              | loosen the constraint to its a%-level maximum |
    |                                                        | until it holds, then as the rows above        |

In the third row the legible cell reads "p^TTFT > 1 > p^TPOT": loosening the TPOT constraint turns the state
into row 2's case (2). The loosened latency is read here as the constraint of the less-fulfilled problem —
the larger p is optimised, the other loosened — which keeps §4.4.1's rule "optimise the less fulfilled
latency" in every row; the table's one legible direction is the case p^TTFT ≥ p^TPOT. A tie, both p equal
(no request with an SLO gives both 0), optimises TTFT: prefill first, vLLM's default order (SOLA §6.1's vLLM-D).

The a%-level maximum (§4.4.1): with a% of the requests meeting the constraint's SLO, the maximum in the
constraint (eq. 1 or eq. 2) becomes the value that a% of the requests are at or below, the ⌈a·n⌉-th smallest
of n. With no request meeting it, a is one request's share (1/n): the constraint is loosened until one
latency satisfies it (Fig. 5). Unloosened, a = 1 and the a%-level maximum is the maximum.

The comparison reads p over a sliding window of iterations (§4.4.2: "a sliding window over iterations to
compare the fulfillment between TTFT and TPOT, to mitigate the influence of sudden changes"): the mean of the
last ``window`` iterations' p^TTFT and p^TPOT, this one included. SOLA gives no window length; the default
(``prefill.sola_window_iters``) is 8 iterations, a few decode steps of the running batch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tetriserve.common.decisions import Decisions
from tetriserve.common.sola_state import SystemState

Objective = Literal["ttft", "tpot"]  # "ttft": optimise TTFT subject to TPOT; "tpot": the other way round


def level_max(values: Sequence[float], level: float = 1.0) -> float:
    """The a%-level maximum: the ⌈a·n⌉-th smallest of ``values`` (the maximum at a = 1); −∞ for none."""
    if not values:
        return -math.inf
    if not 0.0 < level <= 1.0:
        raise ValueError(f"a%-level must be in (0, 1], got {level}")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(level * len(ordered) - 1e-9)) - 1]


@dataclass(frozen=True)
class Problem:
    """One iteration's constrained problem: what it optimises, and the a% level of its constraint."""

    objective: Objective
    level: float = 1.0  # a: the constraint's maximum is its a%-level maximum (1: the maximum)
    p_ttft: float = 0.0  # the windowed p^TTFT compared
    p_tpot: float = 0.0  # the windowed p^TPOT compared

    @property
    def loosened(self) -> bool:
        return self.level < 1.0


def loosened_level(share_met: float, n: int) -> float:
    """a for a constraint that ``share_met`` of ``n`` requests meet: at least one request's share."""
    return max(share_met, 1.0 / n) if n > 0 else 1.0


def choose(p_ttft: float, p_tpot: float, state: SystemState | None = None) -> Problem:
    """Table 2: the problem for (windowed) p^TTFT and p^TPOT; ``state`` gives the a% shares when both fail."""
    objective: Objective = "tpot" if p_tpot > p_ttft else "ttft"
    level = 1.0
    if p_ttft > 1.0 and p_tpot > 1.0 and state is not None:
        if objective == "ttft":  # TPOT is the constraint
            level = loosened_level(state.tpot_share_met, len(state.tpot_ratios))
        else:
            level = loosened_level(state.ttft_share_met, len(state.ttft_ratios))
    return Problem(objective, level, p_ttft, p_tpot)


class SlidingWindow:
    """The mean of the last ``size`` iterations' p^TTFT and p^TPOT."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"sliding window must hold >= 1 iteration, got {size}")
        self._ttft: deque[float] = deque(maxlen=size)
        self._tpot: deque[float] = deque(maxlen=size)

    def push(self, p_ttft: float, p_tpot: float) -> tuple[float, float]:
        self._ttft.append(p_ttft)
        self._tpot.append(p_tpot)
        return sum(self._ttft) / len(self._ttft), sum(self._tpot) / len(self._tpot)


class ProblemSwitch:
    """Per iteration: push the state's p into the window and choose the problem (Table 2).

    Decisions (``decided.sola.*``), what it chose otherwise than the prefill-first default: ``tpot_iterations``
    (an iteration optimising TPOT), ``switched_to_tpot`` (from TTFT to TPOT), ``loosened`` (an iteration
    whose constraint is its a%-level maximum)."""

    def __init__(self, window: int = 8, decisions: Decisions | None = None) -> None:
        self.window = SlidingWindow(window)
        self.decisions = decisions if decisions is not None else Decisions("sola")
        self.last: Problem | None = None

    def decide(self, state: SystemState) -> Problem:
        p_ttft, p_tpot = self.window.push(state.p_ttft, state.p_tpot)
        problem = choose(p_ttft, p_tpot, state)
        if problem.objective == "tpot":
            self.decisions.count("tpot_iterations")
            if self.last is None or self.last.objective == "ttft":
                self.decisions.count("switched_to_tpot")
        if problem.loosened:
            self.decisions.count("loosened")
        self.last = problem
        return problem
