"""The front door's incremental detokenizer: the Rust stream and the sliding window give the same text (on byte
garbage that never completes a character, the window may drop a longer tail, never more text)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.fakes import _SENTENCES, tokenizer_dir
from tetriserve.frontdoor.detokenizer import IncrementalDetokenizer

TEXT = "héllo wörld, naïve café — 日本語 🚀 ĳ and plain words too. <|im_start|>x<|im_end|>"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(tokenizer_dir())


def run(detok: IncrementalDetokenizer, ids: list[int], step: int) -> str:
    return "".join(detok.add(ids[i : i + step]) for i in range(0, len(ids), step))


def both(tokenizer: Any, prompt: list[int], ids: list[int], skip: bool, step: int) -> tuple[str, str]:
    stream = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip)
    window = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=skip, stream=False)
    assert stream.streaming and not window.streaming
    return run(stream, ids, step), run(window, ids, step)


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_stream_and_window_agree_on_text(tokenizer: Any, skip: bool, seed: int) -> None:
    rng = random.Random(seed)
    ids = tokenizer.encode(" ".join(rng.choice(_SENTENCES) for _ in range(8)) + TEXT)
    stream, window = both(tokenizer, tokenizer.encode("hello"), ids, skip, 1 + seed % 3)  # chunks of 1 to 3 tokens
    assert stream == window and window


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_on_random_tokens_the_window_is_a_prefix_of_the_stream(tokenizer: Any, skip: bool, seed: int) -> None:
    rng = random.Random(seed)
    ids = [rng.randrange(len(tokenizer)) for _ in range(400)]  # byte tokens split characters; specials included
    stream, window = both(tokenizer, tokenizer.encode(TEXT), ids, skip, 1 + seed % 3)
    assert stream.startswith(window) and len(window) > len(stream) // 2


def test_stream_reproduces_text_and_holds_an_incomplete_character(tokenizer: Any) -> None:
    ids = tokenizer.encode(TEXT)
    assert run(IncrementalDetokenizer(tokenizer, [], skip_special_tokens=False), ids, 1) == TEXT
    rocket = tokenizer.encode("🚀")
    detok = IncrementalDetokenizer(tokenizer, [])
    assert len(rocket) > 1 and detok.add(rocket[:-1]) == "" and detok.add(rocket[-1:]) == "🚀"


def test_a_failing_stream_hands_the_request_to_the_window(tokenizer: Any) -> None:
    ids = tokenizer.encode(" and plain words too. héllo")
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("hello"))

    class Broken:
        def step(self, *_: Any) -> str:
            raise RuntimeError("invalid prefix")

    first = detok.add(ids[:3])
    detok._stream = Broken()
    rest = detok.add(ids[3:])
    assert not detok.streaming and first + rest == tokenizer.decode(ids)


def test_a_tokenizer_without_a_rust_backend_uses_the_window(tokenizer: Any) -> None:
    class Slow:  # what a slow (Python) tokenizer offers: decode only
        def decode(self, ids: list[int], **kw: Any) -> str:
            return str(tokenizer.decode(ids, **kw))

    ids = tokenizer.encode(TEXT)
    detok = IncrementalDetokenizer(Slow(), [])  # type: ignore[arg-type]
    assert not detok.streaming and run(detok, ids, 2) == TEXT.replace("<|im_start|>", "").replace("<|im_end|>", "")
