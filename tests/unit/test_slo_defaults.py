"""Server-side SLO defaults by class of request, overridden per request field by field (common/slo_config.py)."""

from __future__ import annotations

import pytest

from tetriserve.common.config import ClusterConfig
from tetriserve.common.request import SLO
from tetriserve.common.slo_config import SloConfig


def test_a_request_takes_its_class_then_the_defaults_and_its_own_fields_win() -> None:
    cfg = SloConfig.model_validate(
        {
            "ttft_ms": 9000,
            "tbt_ms": 200,
            "classes": [{"max_prompt_tokens": 512, "ttft_ms": 500}, {"max_prompt_tokens": 4096, "ttft_ms": 3000}],
        }
    )
    assert cfg.for_request(100, SLO()) == SLO(ttft_ms=500)  # the first class: its tbt is unset
    assert cfg.for_request(512, SLO(tbt_ms=50)) == SLO(ttft_ms=500, tbt_ms=50)
    assert cfg.for_request(513, SLO()) == SLO(ttft_ms=3000)
    assert cfg.for_request(5000, SLO()) == SLO(ttft_ms=9000, tbt_ms=200)  # in no class: the section's own
    assert cfg.for_request(5000, SLO(ttft_ms=1, jct_ms=7)) == SLO(ttft_ms=1, tbt_ms=200, jct_ms=7)
    assert SloConfig().for_request(10, SLO()) == SLO()  # no defaults: what the request asked


def test_the_section_is_read_from_the_config_and_checked() -> None:
    cfg = ClusterConfig.load(overrides={"slo.classes": [{"max_prompt_tokens": 64, "tbt_ms": 80}]})
    assert cfg.slo.for_request(10, SLO()) == SLO(tbt_ms=80)
    with pytest.raises(ValueError, match="greater than 0"):
        ClusterConfig.load(overrides={"slo.ttft_ms": 0})
