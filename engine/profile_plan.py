"""What ``tetriserve profile`` runs, and what every iteration of it computes (SOLA §5.2, AccelGen §4.2).

Three kinds of scenario, each a set of prompts added at once to an idle engine:

    SWEEP     one prompt of S tokens, max_tokens=1           → one iteration of S tokens: t(S), the pivot
    CHUNKED   prompts under a chunk budget c < their length  → iterations mixing (l_has > 0, l_in) pieces,
              (pack: k prompts of c/k; stagger: 4 of 1.5c;     so eq. 3's Σ l_has·l_in and Σ l_in² are
               long: one prompt of up to 16c)                  identifiable
    DECODE    B prompts of L tokens                          → after the last prefill, D iterations in which
              max_tokens chosen so all B finish together        all B requests decode: eq. 4 samples

The composition of every iteration is derived, not guessed: ``simulate_fcfs`` replays vLLM v1's
scheduler for an idle engine (no preemption, no prefix hits, enough KV):

    budget ← c
    for r in running (admission order):  n = min(tokens(r) − computed(r), budget);  budget −= n
    for r in waiting (FCFS) while budget > 0 and |running| < max_num_seqs:
        n = min(prompt(r), budget);  budget −= n;  r → running
    after the step: computed += n; a request whose computed reached tokens samples one token
    (tokens += 1) and finishes once it has max_tokens outputs.

The profiler checks the derivation against the engine's own scheduler output, iteration by iteration.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

MIN_FORWARD = 16
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
DECODE_STEPS = 16


class ScenarioKind(enum.Enum):
    SWEEP = "sweep"
    CHUNKED = "chunked"
    DECODE = "decode"


@dataclass(frozen=True)
class Piece:
    """One request's share of one iteration."""

    request: int  # index into the scenario's prompts
    has: int  # l_has: tokens whose KV the request already holds
    new: int  # l_in: tokens computed in this iteration
    decode: bool  # the request's prompt was complete before this iteration


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: ScenarioKind
    budget: int  # tokens per iteration (the engine's max_num_scheduled_tokens while it runs)
    prompt_lens: tuple[int, ...]
    max_tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ValueError(f"Scenario.budget must be >= 1, got {self.budget}")
        if not self.prompt_lens or min(self.prompt_lens) < 1:
            raise ValueError(f"Scenario.prompt_lens must be non-empty and positive, got {self.prompt_lens}")
        if len(self.max_tokens) != len(self.prompt_lens) or min(self.max_tokens) < 1:
            raise ValueError(f"Scenario.max_tokens must be one positive count per prompt, got {self.max_tokens}")


Step = tuple[Piece, ...]


def simulate_fcfs(prompt_lens: Sequence[int], max_tokens: Sequence[int], budget: int, max_num_seqs: int) -> list[Step]:
    """Every iteration's pieces, in vLLM v1's FCFS order, for prompts added together to an idle engine."""
    return list(iter_fcfs(prompt_lens, max_tokens, budget, max_num_seqs))


def iter_fcfs(prompt_lens: Sequence[int], max_tokens: Sequence[int], budget: int, max_num_seqs: int) -> Iterator[Step]:
    """``simulate_fcfs`` one iteration at a time (stop early for open-ended ``max_tokens``)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    computed = [0] * len(prompt_lens)
    outputs = [0] * len(prompt_lens)
    waiting = list(range(len(prompt_lens)))
    running: list[int] = []
    while waiting or running:
        left, pieces = budget, []
        for r in running:
            n = min(prompt_lens[r] + outputs[r] - computed[r], left)
            if n > 0:
                pieces.append(Piece(r, computed[r], n, computed[r] >= prompt_lens[r]))
                left -= n
        while waiting and left > 0 and len(running) < max_num_seqs:
            r = waiting.pop(0)
            n = min(prompt_lens[r], left)
            pieces.append(Piece(r, 0, n, False))
            running.append(r)
            left -= n
        if not pieces:
            raise ValueError("simulate_fcfs: no progress (budget too small for the running requests)")
        for p in pieces:
            computed[p.request] += p.new
            if computed[p.request] == prompt_lens[p.request] + outputs[p.request]:
                outputs[p.request] += 1
        running = [r for r in running if outputs[r] < max_tokens[r]]
        yield tuple(pieces)


def forward_sizes(max_forward: int) -> list[int]:
    """Powers of two and their midpoints from 16 to ``max_forward`` (included even when it is neither)."""
    if max_forward < MIN_FORWARD:
        raise ValueError(f"max_forward must be >= {MIN_FORWARD}, got {max_forward}")
    sizes: list[int] = []
    s = MIN_FORWARD
    while s <= max_forward:
        sizes += [x for x in (s, s + s // 2) if x <= max_forward]
        s *= 2
    if sizes[-1] != max_forward:
        sizes.append(max_forward)
    return sizes


def sweep_scenarios(max_forward: int) -> list[Scenario]:
    return [Scenario(f"sweep-{s}", ScenarioKind.SWEEP, max_forward, (s,), (1,)) for s in forward_sizes(max_forward)]


def chunked_scenarios(max_budget: int, max_prompt: int) -> list[Scenario]:
    """pack / stagger / long prompt sets under chunk budgets 64, 128, … ≤ ``max_budget``."""
    out: list[Scenario] = []
    c = 64
    while c <= max_budget:
        for k in (2, 4, 8):
            if MIN_FORWARD <= c // k <= max_prompt:
                out.append(Scenario(f"pack{k}-c{c}", ScenarioKind.CHUNKED, c, (c // k,) * k, (1,) * k))
        if 3 * c // 2 <= max_prompt:
            out.append(Scenario(f"stagger-c{c}", ScenarioKind.CHUNKED, c, (3 * c // 2,) * 4, (1,) * 4))
        long = min(max_prompt, 16 * c)
        if long > c:
            out.append(Scenario(f"long-c{c}", ScenarioKind.CHUNKED, c, (long,), (1,)))
        c *= 2
    return out


def decode_scenario(batch: int, context: int, budget: int, max_num_seqs: int, steps: int = DECODE_STEPS) -> Scenario:
    """B prompts of L tokens whose max_tokens make all B decode together for ``steps`` iterations, then finish."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    lens = (context,) * batch
    never = (1 << 30,) * batch
    first_token: dict[int, int] = {}  # request -> iteration whose piece completed its prompt
    for i, step in enumerate(iter_fcfs(lens, never, budget, max_num_seqs)):
        for p in step:
            if not p.decode and p.has + p.new == context:
                first_token[p.request] = i
        if len(first_token) == batch:
            break
    last = max(first_token.values())
    max_tokens = tuple(last - first_token[r] + steps + 1 for r in range(batch))
    return Scenario(f"decode-b{batch}-l{context}", ScenarioKind.DECODE, budget, lens, max_tokens)


def decode_scenarios(
    max_model_len: int, budget: int, max_num_seqs: int, kv_capacity_tokens: int, steps: int = DECODE_STEPS
) -> list[Scenario]:
    """B in 1, 2, 4, … 32 at contexts max_model_len/32, /8, /2, keeping what fits the KV cache and max_num_seqs."""
    contexts = sorted({max(MIN_FORWARD, max_model_len // d) for d in (32, 8, 2)})
    out: list[Scenario] = []
    for context in contexts:
        for batch in DECODE_BATCHES:
            if batch > max_num_seqs:
                continue
            sc = decode_scenario(batch, context, budget, max_num_seqs, steps)
            tokens = sum(p + m for p, m in zip(sc.prompt_lens, sc.max_tokens, strict=True))
            if context + max(sc.max_tokens) <= max_model_len and tokens <= 0.9 * kv_capacity_tokens:
                out.append(sc)
    return out


def pure_decode(step: Step, batch: int) -> bool:
    """An iteration in which every one of the scenario's ``batch`` requests decodes one token."""
    return len(step) == batch and all(p.decode and p.new == 1 for p in step)


def held_out(names: Sequence[str], every: int = 4) -> set[str]:
    """Every ``every``-th scenario of each kind from the second on, never a kind's last (interpolation, not
    extrapolation: the fit still sees each kind's extremes)."""
    if every < 2:
        raise ValueError(f"every must be >= 2, got {every}")
    test: set[str] = set()
    by_kind: dict[str, list[str]] = {}
    for n in names:
        by_kind.setdefault(n.split("-")[0].rstrip("0123456789"), []).append(n)
    for group in by_kind.values():
        test.update(n for i, n in enumerate(group[:-1]) if i % every == 1)
    return test
