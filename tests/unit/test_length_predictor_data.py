"""Length-predictor data: pairs from ShareGPT records, the conversation split, bucket edges."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tetriserve.length_predictor.buckets import BucketSpec
from tetriserve.length_predictor.data import (
    Pair,
    by_split,
    conversation_group,
    iter_pairs,
    label_stats,
    pairs_from_record,
    read_pairs,
    split_of,
    write_pairs,
)


def words(texts: Any) -> list[int]:
    """A stand-in target tokenizer: one token per whitespace-separated word."""
    return [len(t.split()) for t in texts]


def record(conv_id: str, *turns: tuple[str, str]) -> dict[str, Any]:
    return {"id": conv_id, "conversations": [{"from": who, "value": text} for who, text in turns]}


# ---- pairs ---------------------------------------------------------------------------------------


def test_every_human_to_gpt_turn_is_a_pair_with_the_conversation_so_far() -> None:
    rec = record(
        "c1",
        ("human", "one two"),
        ("gpt", "a b c"),
        ("human", "three"),
        ("gpt", "d e f g h"),
        ("gpt", "orphan answer"),  # not preceded by a human turn: no pair
    )
    pairs = pairs_from_record(rec, words)
    assert [(p.turn, p.prompt_len, p.response_len) for p in pairs] == [(1, 2, 3), (3, 6, 5)]
    assert pairs[0].prompt == "one two"
    assert pairs[1].prompt == "one two\n\na b c\n\nthree"
    assert {p.conv for p in pairs} == {"c1"} and len({p.split for p in pairs}) == 1


def test_prompt_is_cut_from_the_left() -> None:
    rec = record("c2", ("human", "x" * 50 + "QUESTION"), ("gpt", "ok"))
    [pair] = pairs_from_record(rec, words, max_prompt_chars=10)
    assert pair.prompt == "xxQUESTION"


@pytest.mark.parametrize(
    "rec",
    [
        {"id": 3, "conversations": []},
        {"id": "x"},
        record("x", ("gpt", "hello")),
        record("x", ("human", "   "), ("gpt", "empty question")),
        record("x", ("human", "q")),
    ],
)
def test_unusable_records_give_no_pairs(rec: dict[str, Any]) -> None:
    assert pairs_from_record(rec, words) == []


def test_iter_pairs_limit_and_roundtrip(tmp_path: Path) -> None:
    records = [record(f"r{i}", ("human", "q " * i), ("gpt", "a " * (i + 1))) for i in range(1, 6)]
    src = tmp_path / "sharegpt.json"
    src.write_text(json.dumps(records))
    pairs = list(iter_pairs(words, src, limit=3))
    assert [p.response_len for p in pairs] == [2, 3, 4]
    out = tmp_path / "pairs.jsonl"
    assert write_pairs(out, pairs) == 3
    assert read_pairs(out) == pairs
    assert label_stats(pairs)["count"] == 3 and label_stats(pairs)["max"] == 4.0
    assert label_stats([]) == {"count": 0}


def test_pair_validates_fields() -> None:
    with pytest.raises(ValueError, match="split"):
        Pair("c", 1, "dev", "p", 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="response_len"):
        Pair("c", 1, "train", "p", 1, -1)


# ---- split: deterministic, by conversation, no leakage -------------------------------------------


def test_split_is_deterministic_and_roughly_80_10_10() -> None:
    ids = [f"conv{i}" for i in range(5000)]
    first = [split_of(i) for i in ids]
    assert first == [split_of(i) for i in ids]
    share = {s: first.count(s) / len(ids) for s in ("train", "val", "test")}
    assert 0.77 < share["train"] < 0.83 and 0.08 < share["val"] < 0.12 and 0.08 < share["test"] < 0.12


def test_parts_of_one_conversation_share_a_split() -> None:
    assert conversation_group("abc_12") == "abc" and conversation_group("abc") == "abc"
    for i in range(300):
        assert len({split_of(f"id{i}_{part}") for part in range(4)} | {split_of(f"id{i}")}) == 1


def test_no_conversation_in_two_splits() -> None:
    pairs = [
        p
        for i in range(400)
        for part in range(2)
        for p in pairs_from_record(
            record(f"k{i}_{part}", ("human", "q"), ("gpt", "a"), ("human", "q2"), ("gpt", "b c")), words
        )
    ]
    groups = {s: {conversation_group(p.conv) for p in ps} for s, ps in by_split(pairs).items()}
    assert all(groups.values())
    assert not (groups["train"] & groups["val"]) and not (groups["train"] & groups["test"])
    assert not (groups["val"] & groups["test"])


# ---- buckets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("g", "k"), [(100, 21), (200, 11), (400, 6)])
def test_bucket_counts_share_the_open_tail_at_2000(g: int, k: int) -> None:
    spec = BucketSpec(g)
    assert spec.num_buckets == k
    assert spec.lower(k - 1) == 2000 and spec.upper(k - 1) is None


@pytest.mark.parametrize(
    ("length", "bucket"), [(0, 0), (199, 0), (200, 1), (399, 1), (400, 2), (1999, 9), (2000, 10), (50_000, 10)]
)
def test_bucket_edges_at_200(length: int, bucket: int) -> None:
    spec = BucketSpec(200)
    assert spec.bucket_of(length) == bucket
    assert spec.lower(bucket) <= length
    upper = spec.upper(bucket)
    assert upper is None or length < upper


def test_served_range_caps_at_max_tokens() -> None:
    spec = BucketSpec(200)
    assert spec.served_range(1, 1000) == (200, 400)
    assert spec.served_range(1, 300) == (200, 301)  # max_tokens is inside, upper exclusive
    assert spec.served_range(10, 4096) == (2000, 4097)  # the open tail ends at the cap
    assert spec.served_range(3, 100) == (100, 101)  # bucket above the cap collapses onto max_tokens
    assert spec.served_range(0, 0) == (0, 1)


def test_bucket_spec_validates() -> None:
    with pytest.raises(ValueError, match="granularity"):
        BucketSpec(0)
    with pytest.raises(ValueError, match="open_from"):
        BucketSpec(200, open_from=100)
    with pytest.raises(ValueError, match="length"):
        BucketSpec(200).bucket_of(-1)
    with pytest.raises(ValueError, match="bucket"):
        BucketSpec(200).lower(11)
