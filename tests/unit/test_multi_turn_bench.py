"""The pure parts of ``benchmarks/multi_turn.py``: a record's exchanges, the turns built from them, the draw, and
what is read of ``/metrics``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import multi_turn as mt


def test_a_record_s_exchanges_alternate_from_its_first_human_turn() -> None:
    rec = {"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "a"},
                             {"from": "gpt", "value": "b"}, {"from": "human", "value": "c"},
                             {"from": "gpt", "value": "d"}, {"from": "human", "value": "e"},
                             {"from": "human", "value": "f"}]}  # fmt: skip
    assert mt.exchanges(rec) == [("a", "b"), ("c", "d")]  # the last human has no answer; "e", "f" break the turns
    assert mt.exchanges({"conversations": [{"from": "human", "value": " "}, {"from": "gpt", "value": "x"}]}) == []
    assert mt.exchanges({}) == []


def test_each_turn_s_prompt_extends_the_previous_turn_s_exactly() -> None:
    pairs = [([1, 2], [3, 4, 5]), ([6], [7, 8]), ([9], [10])]
    turns = mt.build_turns(pairs, [0], max_turns=5, max_tokens=2)
    assert [t.prompt for t in turns] == [(0, 1, 2), (0, 1, 2, 3, 4, 5, 6), (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)]
    assert [t.max_tokens for t in turns] == [2, 2, 1]  # the answer's length, capped
    assert len(mt.build_turns(pairs, [0], max_turns=2, max_tokens=2)) == 2
    long = [([1] * 1000, [2] * 1000), ([3] * 100, [4] * 10)]
    assert len(mt.build_turns(long, [], 5, 128)) == 1  # the second would pass the context


def test_the_draw_is_seeded_and_keeps_conversations_of_two_turns() -> None:
    one = (mt.Turn((1,), 1),)
    two = (mt.Turn((1,), 1), mt.Turn((1, 2), 1))
    pool = [one, *[two] * 5]
    a, b = mt.draw(pool, 3, 2.0, 1.0, seed=0), mt.draw(pool, 3, 2.0, 1.0, seed=0)
    assert a == b and all(len(c.turns) == 2 and len(c.think_s) == 2 for c in a)
    assert [c.start_s for c in a] == sorted(c.start_s for c in a)
    with pytest.raises(ValueError, match="5 usable"):
        mt.draw(pool, 6, 2.0, 1.0, seed=0)


def test_what_is_read_of_metrics() -> None:
    ours = "\n".join([
        'tetriserve:engine_prompt_tokens_total{worker="prefill-0",role="prefill",source="computed"} 100',
        'tetriserve:engine_prompt_tokens_total{worker="prefill-1",role="prefill",source="cached"} 60',
        'tetriserve:engine_prompt_tokens_total{worker="prefill-1",role="prefill",source="external"} 7',
        'tetriserve:kv_transfer_bytes_total{worker="prefill-0",role="prefill",direction="sent"} 2048',
        'tetriserve:kv_transfer_bytes_total{worker="decode-0",role="decode",direction="received"} 2048',
        "tetriserve:prefix_placements_total 3",
        "# HELP tetriserve:prefix_placements_total ...",
    ])  # fmt: skip
    c = mt.counters(ours)
    assert c == {"prompt_computed": 100, "prompt_cached": 60, "kv_bytes_sent": 2048, "prefix_placements": 3}
    assert mt.hit_rate(c) == 60 / 160
    vllm = (
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 500\nvllm:prefix_cache_hits_total{engine="0"} 200'
    )
    v = mt.counters(vllm)
    assert (v["prompt_computed"], v["prompt_cached"]) == (300, 200)
    assert mt.delta({"prompt_cached": 50}, v)["prompt_cached"] == 150
    assert math.isnan(mt.hit_rate({}))


def test_per_turn_and_the_report(tmp_path: Path) -> None:
    outs: list[dict[str, Any]] = [
        {"conversation": 0, "turn": 1, "prompt_tokens": 5, "tokens": 2, "ttft_s": 0.1, "error": None},
        {"conversation": 0, "turn": 2, "prompt_tokens": 9, "tokens": 2, "ttft_s": 0.05, "error": None},
        {"conversation": 1, "turn": 1, "prompt_tokens": 5, "tokens": 0, "ttft_s": None, "error": "HTTP 429"},
    ]
    pt = mt.per_turn(outs)
    assert pt[1] == {"sent": 2.0, "failed": 1.0, "ttft_p50_ms": 100.0} and pt[2]["ttft_p50_ms"] == 50.0
    args = {"conversations": 2, "turns": 6, "seed": 0, "think_s": 1.0, "rate": 0.5, "max_tokens": 128,
            "out": str(tmp_path / "mt")}  # fmt: skip
    data = {
        "args": args,
        "systems": {"prefix": {"outcomes": outs, "per_turn": pt, "counters": {"prompt_computed": 10.0}}},
    }
    text = mt.report(data)
    assert "| prefix | 3 | 1 | 100 | 50 | 10 | 0 | 0% | - | - |" in text and "![median TTFT per turn](mt.png)" in text
    mt.plot(data, tmp_path / "mt.png")
    assert (tmp_path / "mt.png").read_bytes()[:4] == b"\x89PNG"
