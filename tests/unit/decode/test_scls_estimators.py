"""SCLS's serving-time (§4.2, eq. 1–4) and memory (§4.3, eq. 5–9) estimators on hand-computed cases."""

from __future__ import annotations

import pytest

from tetriserve.common.scls_estimators import (
    ZETA,
    MemoryEstimator,
    ServingTime,
    fit_serving_time,
    kv_bytes_per_token,
)

# round coefficients, so every expected value below is short arithmetic
EST = ServingTime(p1=0.001, p2=0.01, p3=0.002, p4=0.1, d1=0.0001, d2=0.001, d3=0.0002, d4=0.01)


def test_prefill_eq3() -> None:
    # 0.001·4·100 + 0.01·4 + 0.002·100 + 0.1 = 0.4 + 0.04 + 0.2 + 0.1
    assert EST.t_prefill(4, 100) == pytest.approx(0.74)


def test_decode_iteration_eq4() -> None:
    # 0.0001·4·101 + 0.001·4 + 0.0002·101 + 0.01 = 0.0404 + 0.004 + 0.0202 + 0.01
    assert EST.tau_decode(101, 4) == pytest.approx(0.0746)


def test_decode_phase_eq2_sums_the_iterations() -> None:
    # τ(101, 4) + τ(102, 4) + τ(103, 4) = 0.0746 + 0.0752 + 0.0758
    assert EST.t_decode(4, 100, 3) == pytest.approx(0.2256)
    assert EST.t_decode(4, 100, 0) == 0.0


def test_serving_time_eq1() -> None:
    # T_prefill(4, 100) + T_decode(4, 100, 3) = 0.74 + 0.2256
    assert EST.t_serve(4, 100, 3) == pytest.approx(0.9656)
    assert EST.t_serve(0, 100, 3) == 0.0  # no batch, no time


def test_a_slice_of_128_in_closed_form() -> None:
    # eq. 2 over l = 1..128 at N = 1, L_i = 10: (d1 + d3)·(128·10 + 128·129/2) + 128·(d2 + d4)
    #   = 0.0003·(1280 + 8256) + 128·0.011 = 2.8608 + 1.408
    assert EST.t_decode(1, 10, 128) == pytest.approx(4.2688)


def test_default_estimator_is_the_tiny_models_profile() -> None:
    # one request, a 512-token prompt: p1·512 + p2 + p3·512 + p4
    #   = 3.2e-5·512 + 5.95e-5 + 4.75e-6·512 + 2.78e-3 = 0.016384 + 0.0000595 + 0.002432 + 0.00278
    assert ServingTime().t_prefill(1, 512) == pytest.approx(0.0216555)
    # a slice of 128 for one request of 512: (d1 + d3)·(128·512 + 128·129/2) + 128·(d2 + d4)
    #   = 2.9e-7·(65536 + 8256) + 128·3.17e-3 = 0.02139968 + 0.40576
    assert ServingTime().t_decode(1, 512, 128) == pytest.approx(0.42715968)


def test_serving_time_round_trips_json() -> None:
    assert ServingTime.from_json(EST.to_json()) == EST
    with pytest.raises(ValueError, match="unknown fields"):
        ServingTime.from_json({"p5": 1.0})


def test_memory_eq5_eq9_and_n_max_eq8() -> None:
    mem = MemoryEstimator(m_ava=10_000)  # Δ = 1: memory in tokens; ζ = 0.9 (the paper's)
    assert mem.zeta == ZETA == 0.9
    assert mem.m_kv(8, 1000, 128) == 9024  # (1000 + 128)·8
    assert mem.oom(8, 1000, 128)  # 9024 > 0.9·10000 = 9000
    assert mem.fits(7, 1000, 128)  # 7896 ≤ 9000
    assert mem.n_max(1000, 128) == 7  # ⌊9000 / 1128⌋
    assert MemoryEstimator(m_ava=10_000, zeta=1.0).fits(8, 1000, 128)  # eq. 7 without ζ: 9024 ≤ 10000
    assert MemoryEstimator(m_ava=10_000, zeta=1.0).n_max(1000, 128) == 8  # ⌊10000 / 1128⌋


def test_memory_llama2_13b_on_an_a100() -> None:
    # eq. 6: M_ava = 80 GiB − 26 GiB (13B fp16 weights) − 4 GiB (engine) = 50 GiB = 53,687,091,200 bytes
    m_ava = MemoryEstimator.available(80 * 2**30, 26 * 2**30, 4 * 2**30)
    assert m_ava == 53_687_091_200
    # Δ = 2 (K and V) · 40 layers · 40 heads · 128 per head · 2 bytes (fp16) = 819,200 bytes per token
    assert kv_bytes_per_token(40, 40, 128, 2) == 819_200
    mem = MemoryEstimator(m_ava=m_ava, delta=819_200)
    # eq. 8 under eq. 9: ⌊0.9 · 53,687,091,200 / (819,200 · (1024 + 128))⌋ = ⌊48,318,382,080 / 943,718,400⌋
    #   = ⌊51.2⌋
    assert mem.n_max(1024, 128) == 51
    assert mem.fits(51, 1024, 128) and mem.oom(52, 1024, 128)


def test_memory_estimator_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError, match="Δ"):
        MemoryEstimator(m_ava=1.0, delta=0.0)
    with pytest.raises(ValueError, match="ζ"):
        MemoryEstimator(m_ava=1.0, zeta=1.5)


def test_fit_recovers_eq3_and_eq4() -> None:
    # samples of EST's own terms, worked out by hand:
    # prefill (N, L_i, s): 0.001·N·L + 0.01·N + 0.002·L + 0.1
    prefill = [
        (1, 100, 0.41),  # 0.1 + 0.01 + 0.2 + 0.1
        (2, 100, 0.52),  # 0.2 + 0.02 + 0.2 + 0.1
        (1, 200, 0.71),  # 0.2 + 0.01 + 0.4 + 0.1
        (4, 50, 0.44),  # 0.2 + 0.04 + 0.1 + 0.1
    ]
    # decode (l, N, s): 0.0001·N·l + 0.001·N + 0.0002·l + 0.01
    decode = [
        (100, 1, 0.041),  # 0.01 + 0.001 + 0.02 + 0.01
        (100, 2, 0.052),  # 0.02 + 0.002 + 0.02 + 0.01
        (200, 1, 0.071),  # 0.02 + 0.001 + 0.04 + 0.01
        (50, 4, 0.044),  # 0.02 + 0.004 + 0.01 + 0.01
    ]
    fitted = fit_serving_time(prefill, decode)
    for name, want in EST.to_json().items():
        assert getattr(fitted, name) == pytest.approx(want, abs=1e-9), name
    with pytest.raises(ValueError, match="no samples"):
        fit_serving_time([], decode)
