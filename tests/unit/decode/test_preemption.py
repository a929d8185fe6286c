"""Preemption victim order (CacheOpt §2.4, §3.4) and swap vs recompute by the sweet spot (§3.5)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from tests.unit.decode.sim import simulate, view
from tetriserve.common.length import LengthEstimate
from tetriserve.decode_worker.admission import make_admission_policy
from tetriserve.decode_worker.preemption import ORDER_NAMES, PreemptionCosts, PreemptionStrategy, make_preemption_order
from tetriserve.decode_worker.preemption.order import tbt_bucket
from tetriserve.decode_worker.preemption.strategy import (
    RecomputeLatency,
    SwapLatency,
    fit_recompute,
    fit_swap,
    sweet_spot,
)
from tetriserve.decode_worker.views import DecodeReqView


def r(rid: str, context: int, remaining: int, arrival: float, slo: float | None = None, **kw: object) -> DecodeReqView:
    est = LengthEstimate(remaining, remaining, remaining + 1, -1, 1.0, "oracle")
    return DecodeReqView(rid, context, 10_000, arrival_time=arrival, estimate=est, tbt_slo_s=slo, **kw)  # type: ignore[arg-type]


BATCH = (
    r("old-long-small", context=100, remaining=900, arrival=1.0),
    r("new-short-big", context=2000, remaining=10, arrival=3.0),
    r("mid", context=600, remaining=300, arrival=2.0),
)


def first(name: str, batch: tuple[DecodeReqView, ...] = BATCH) -> str:
    return make_preemption_order(name).victims(batch)[0].request_id


def test_each_order_picks_its_victim() -> None:
    assert first("vllm") == "new-short-big"  # the latest arrival
    assert first("srtf") == "old-long-small"  # the longest predicted remaining time
    assert first("lkvo") == "old-long-small"  # the smallest KV
    assert [v.request_id for v in make_preemption_order("lkvo").victims(BATCH)] == [
        "old-long-small",
        "mid",
        "new-short-big",
    ]


def test_cacheopt_order_loosest_slo_then_longest_remaining_then_smallest_kv() -> None:
    tight = r("tight", context=100, remaining=5000, arrival=0.0, slo=0.1)
    loose = r("loose", context=5000, remaining=10, arrival=0.0, slo=1.0)
    assert first("cacheopt", (tight, loose)) == "loose"  # SLO first, whatever the lengths
    # same SLO bucket (0.2–0.5 s): the longer remaining time goes first, bucketed by 128 tokens
    a = r("a", context=900, remaining=300, arrival=0.0, slo=0.3)
    b = r("b", context=100, remaining=200, arrival=0.0, slo=0.4)
    assert first("cacheopt", (b, a)) == "a"
    # same remaining bucket (256–383): the smaller KV goes first
    c = r("c", context=900, remaining=300, arrival=0.0, slo=0.3)
    d = r("d", context=100, remaining=270, arrival=0.0, slo=0.25)
    assert first("cacheopt", (c, d)) == "d"
    # no SLO is the loosest of all
    assert first("cacheopt", (loose, r("free", context=1, remaining=1, arrival=0.0))) == "free"
    assert tbt_bucket(0.05) < tbt_bucket(0.3) < tbt_bucket(1.0) < tbt_bucket(5.0) < tbt_bucket(None)


@pytest.mark.parametrize("name", ORDER_NAMES)
def test_a_victim_mid_transfer_is_preempted_last(name: str) -> None:
    """Freeing the blocks of a request whose KV is in flight would lose that KV."""
    best = make_preemption_order(name).victims(BATCH)[0]
    moving = tuple(v if v is not best else DecodeReqView(**{**v.__dict__, "transferring": True}) for v in BATCH)
    order = make_preemption_order(name).victims(moving)
    assert order[-1].request_id == best.request_id and not any(v.transferring for v in order[:-1])
    only = make_preemption_order(name).victims((moving[BATCH.index(best)],))
    assert len(only) == 1  # a batch of one mid-transfer request still lists it: the engine decides


def test_unknown_order_is_refused() -> None:
    with pytest.raises(ValueError, match=r"decode\.preemption.order: unknown order 'lifo'"):
        make_preemption_order("lifo")


def test_srtf_and_lkvo_preempt_less_than_vllms_order_under_pressure() -> None:
    """CacheOpt Observation 3 on the KV model: FCFS-latest-first preempts at least as often."""
    rng = random.Random(3)
    reqs = []
    for i in range(40):
        truth = rng.choice([30, 80, 200, 400])
        reqs.append(view(f"r{i}", rng.randrange(16, 200), truth, truth, arrival=float(i)))
    greedy = make_admission_policy("greedy")
    counts = {n: simulate(reqs, 80, 16, greedy, make_preemption_order(n)).preemptions for n in ORDER_NAMES}
    assert counts["vllm"] > 0
    assert counts["srtf"] <= counts["vllm"]


# -- swap vs recompute ---------------------------------------------------------------------------------
REC = RecomputeLatency(alpha=1e-7, beta=2.0, kappa=1e-5, eps=1e-3)
SWP = SwapLatency(gamma=1e-4, delta=5e-3)


def test_sweet_spot_is_where_the_fitted_curves_cross() -> None:
    s = sweet_spot(REC, SWP, max_len=100_000)
    assert s is not None
    # analytic: 1e-7 s² + 1e-5 s + 1e-3 = 1e-4 s + 5e-3  →  s² − 900 s − 40000 = 0
    crossing = (900 + math.sqrt(900**2 + 4 * 40000)) / 2
    assert s == math.ceil(crossing)
    assert SWP(s) <= REC(s) and SWP(s - 1) > REC(s - 1)
    assert sweet_spot(REC, SWP, max_len=500) is None  # never worth swapping up to 500 tokens


def test_fits_recover_the_curves_from_noisy_samples() -> None:
    rng = random.Random(0)
    lengths = [64, 128, 256, 512, 1024, 2048, 4096, 8192]
    rec = fit_recompute(lengths, [REC(s) * (1 + rng.uniform(-0.02, 0.02)) for s in lengths])
    swp = fit_swap(lengths, [SWP(s) * (1 + rng.uniform(-0.02, 0.02)) for s in lengths])
    for s in lengths:
        assert rec(s) == pytest.approx(REC(s), rel=0.08)
        assert swp(s) == pytest.approx(SWP(s), rel=0.08)
    fitted = sweet_spot(rec, swp, 100_000)
    assert fitted is not None and abs(fitted - 941) < 0.1 * 941
    with pytest.raises(ValueError, match="at least 4"):
        fit_recompute([1, 2], [1.0, 2.0])


def test_strategy_by_mode_and_sweet_spot(tmp_path: Path) -> None:
    costs = PreemptionCosts(REC, SWP, sweet_spot(REC, SWP, 100_000), "test")
    path = tmp_path / "p.json"
    costs.save(path)
    assert PreemptionCosts.load(path) == costs
    auto = PreemptionStrategy("auto", PreemptionCosts.load(path))
    assert auto.choose(100) == "recompute" and auto.choose(5000) == "swap"
    assert PreemptionStrategy("recompute").choose(10**6) == "recompute"
    assert PreemptionStrategy("swap").choose(1) == "swap"
    never = PreemptionStrategy("auto", PreemptionCosts(REC, SWP, None))
    assert never.choose(10**6) == "recompute"
    with pytest.raises(ValueError, match="needs a swap/recompute profile"):
        PreemptionStrategy("auto")
    path.write_text("{}")
    with pytest.raises(ValueError, match="preemption cost profile"):
        PreemptionCosts.load(path)
