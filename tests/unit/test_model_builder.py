"""Tests for cli/model_builder.py: a very small tiny model, built once per module.

Needs transformers/tokenizers/torch (they come with the engine extra) but no vLLM
and no Ray. Uses the packaged ShareGPT file when installed, else a synthetic corpus.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from tetriserve.cli.model_builder import (  # noqa: E402
    MARKER_FILE,
    SPECIAL_TOKENS,
    build_tiny_model,
    default_tiny_model_dir,
)
from tetriserve.common.sharegpt import find_sharegpt_file  # noqa: E402

SMALL: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 256,
    "tokenizer_train_conversations": 200,
}
ROUND_TRIP = 'Hello, world! 你好，世界 🤖🚀👩‍👩‍👧 naïve café\n\ttabs  and   spaces "quotes" {json: [1]} \u200b end '


def _synthetic_corpus(path: Path) -> Path:
    rng = random.Random(0)
    words = ["the", "model", "serves", "tokens", "prefill", "decode", "cache", "你好", "🤖", "request", "latency"]
    records = [
        {
            "id": f"s{i}",
            "conversations": [
                {"from": "human", "value": " ".join(rng.choices(words, k=30))},
                {"from": "gpt", "value": " ".join(rng.choices(words, k=60))},
            ],
        }
        for i in range(250)
    ]
    path.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return find_sharegpt_file()
    except FileNotFoundError:
        return _synthetic_corpus(tmp_path_factory.mktemp("corpus") / "synthetic.json")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", sharegpt_path=corpus, **SMALL)


def test_loads_with_transformers_and_ids_match(model_dir: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    gen = GenerationConfig.from_pretrained(model_dir)
    assert [tok.bos_token, tok.eos_token, tok.unk_token, tok.pad_token] == list(SPECIAL_TOKENS)
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        tok.bos_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (
        tok.bos_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    assert config.vocab_size == len(tok) <= SMALL["vocab_size"]
    assert config.architectures == ["LlamaForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.dtype == torch.float32
    ids = tok("hello there", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size)
    assert (model_dir / "model.safetensors").is_file()


def test_tokenizer_round_trips_any_utf8(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(ROUND_TRIP).input_ids
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == ROUND_TRIP
    assert tok.unk_token_id not in ids


def test_chat_template_renders_generation_prompt(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi 🙂"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<s><|system|>\nbe brief\n<|user|>\nhi 🙂\n<|assistant|>\n"
    assert not tok.apply_chat_template(messages, tokenize=False).endswith("<|assistant|>\n")


def test_marker_hit_force_rebuild_and_determinism(model_dir: Path, corpus: Path) -> None:
    weights = model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns, weights.read_bytes()
    marker = json.loads((model_dir / MARKER_FILE).read_text(encoding="utf-8"))
    assert marker["build"]["spec"]["hidden_size"] == SMALL["hidden_size"]
    assert marker["summary"]["params"] > 0

    assert build_tiny_model(model_dir, sharegpt_path=corpus, **SMALL) == model_dir
    assert weights.stat().st_mtime_ns == before[0]  # marker hit: nothing rewritten

    build_tiny_model(model_dir, sharegpt_path=corpus, force=True, **SMALL)
    assert weights.read_bytes() == before[1]  # same seed, same bytes
    assert not [p for p in model_dir.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_changed_seed_rebuilds(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "m"
    build_tiny_model(out, sharegpt_path=corpus, seed=0, **SMALL)
    first = (out / "model.safetensors").read_bytes()
    build_tiny_model(out, sharegpt_path=corpus, seed=1, **SMALL)
    assert (out / "model.safetensors").read_bytes() != first
    assert json.loads((out / MARKER_FILE).read_text(encoding="utf-8"))["build"]["spec"]["seed"] == 1


def test_refuses_foreign_directory(tmp_path: Path, corpus: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(ValueError, match="out_dir"):
        build_tiny_model(foreign, sharegpt_path=corpus, **SMALL)
    assert (foreign / "notes.txt").read_text(encoding="utf-8") == "keep me"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"vocab_size": 100}, "vocab_size"),
        ({"hidden_size": 65}, "hidden_size"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"num_layers": 0}, "num_layers"),
        ({"tokenizer_train_conversations": 0}, "tokenizer_train_conversations"),
    ],
)
def test_invalid_spec_names_the_field(tmp_path: Path, corpus: Path, override: dict[str, int], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        build_tiny_model(tmp_path / "bad", sharegpt_path=corpus, **{**SMALL, **override})
    assert not (tmp_path / "bad").exists()


def test_default_dir_honours_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETRISERVE_HOME", str(tmp_path))
    assert default_tiny_model_dir() == tmp_path / "models" / "tiny-llama"
    monkeypatch.delenv("TETRISERVE_HOME")
    assert default_tiny_model_dir() == Path("~/.cache/tetriserve/models/tiny-llama").expanduser()
