"""Builds the tiny random-weight Llama that tests, demos and CPU benchmarks serve.

    ShareGPT (first N conversations) ──▶ byte-level BPE (tokenizers) ──┐
    seed ──▶ LlamaForCausalLM(random init, float32) ───────────────────┤
                                                                       ▼
    <out_dir>.tmp-* : config.json, generation_config.json, model.safetensors,
                      tokenizer.json, tokenizer_config.json, chat template,
                      tetriserve_tiny.json (marker, written last)
                  ──rename──▶ <out_dir>

* The result is an ordinary Hugging Face directory: ``AutoTokenizer`` /
  ``AutoModelForCausalLM`` and vLLM load it like any downloaded model.
* Byte-level pre-tokenizer and decoder: every UTF-8 string round-trips.
* Special tokens ``<s> </s> <unk> <pad>`` take ids 0..3; ``config.json`` and
  ``generation_config.json`` carry the same ids. The model's vocabulary is the
  trained tokenizer's actual size (at most ``vocab_size``), so no id decodes to nothing.
* Idempotent: a directory whose marker matches the requested build is reused.
  A file lock serialises concurrent builders and the build happens in a
  temporary sibling directory that is renamed into place, so readers never see
  a half-written model.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from filelock import FileLock

from tetriserve.common.sharegpt import find_sharegpt_file, iter_conversations

if TYPE_CHECKING:
    import torch
    from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

JSON = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None

MARKER_FILE = "tetriserve_tiny.json"
MARKER_FORMAT = 1
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")
BOS, EOS, UNK, PAD = SPECIAL_TOKENS
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class BuildSummary(TypedDict):
    """What a build made: the model's parameter count, its vocabulary and how long the build took."""

    params: int
    vocab: int
    build_seconds: float


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that determines the built files; the marker stores it verbatim."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int
    seed: int
    tokenizer_train_conversations: int

    def __post_init__(self) -> None:
        minimum_vocab = 256 + len(SPECIAL_TOKENS)
        if self.vocab_size < minimum_vocab:
            raise ValueError(f"vocab_size must be >= {minimum_vocab} (256 bytes + specials), got {self.vocab_size}")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be divisible by num_kv_heads={self.num_kv_heads}")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError(f"head dim hidden_size/num_heads={self.hidden_size // self.num_heads} must be even (RoPE)")
        if self.max_position_embeddings < 16:
            raise ValueError(f"max_position_embeddings must be >= 16, got {self.max_position_embeddings}")
        if self.tokenizer_train_conversations < 1:
            raise ValueError(f"tokenizer_train_conversations must be >= 1, got {self.tokenizer_train_conversations}")


def default_tiny_model_dir() -> Path:
    """``$TETRISERVE_HOME/models/tiny-llama``; ``TETRISERVE_HOME`` defaults to ``~/.cache/tetriserve``."""
    home = os.environ.get("TETRISERVE_HOME") or "~/.cache/tetriserve"
    return Path(home).expanduser() / "models" / "tiny-llama"


def build_tiny_model(
    out_dir: Path,
    *,
    vocab_size: int = 4096,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 768,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    tokenizer_train_conversations: int = 3000,
    force: bool = False,
    sharegpt_path: Path | None = None,
) -> Path:
    """Build (or reuse) the tiny model in ``out_dir`` and return ``out_dir``.

    ``sharegpt_path`` overrides the tokenizer corpus (default: :func:`find_sharegpt_file`).
    A non-empty ``out_dir`` without our marker is never overwritten unless ``force``.
    """
    spec = TinyModelSpec(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
        tokenizer_train_conversations=tokenizer_train_conversations,
    )
    out_dir = Path(out_dir).expanduser().resolve()
    corpus = Path(sharegpt_path) if sharegpt_path is not None else find_sharegpt_file()
    marker = _marker(spec, corpus)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir.parent / f".{out_dir.name}.lock")):
        if not force and _marker_matches(out_dir, marker):
            logger.info("tiny model already built at %s (marker matches); reusing", out_dir)
            return out_dir
        if not force and out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MARKER_FILE).exists():
            raise ValueError(f"out_dir={out_dir} is a non-empty directory not built by tetriserve; pass force=True")
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp makes it 0700; the result is an ordinary shared cache dir
            summary = _build_into(tmp, spec, corpus, marker)
            _swap_into_place(tmp, out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    logger.info(
        "built tiny model: %s params, vocab %s, %s layers, hidden %s, in %ss -> %s",
        f"{summary['params']:,}",
        summary["vocab"],
        spec.num_layers,
        spec.hidden_size,
        summary["build_seconds"],
        out_dir,
    )
    return out_dir


def _marker(spec: TinyModelSpec, corpus: Path) -> dict[str, JSON]:
    return {
        "format": MARKER_FORMAT,
        "spec": asdict(spec),
        "corpus": {"name": corpus.name, "bytes": corpus.stat().st_size},
    }


def _marker_matches(out_dir: Path, marker: dict[str, JSON]) -> bool:
    try:
        found = json.loads((out_dir / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(found.get("build") == marker) and (out_dir / "config.json").is_file()


def _swap_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``, moving any previous build aside first."""
    old: Path | None = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        old.rmdir()
        out_dir.rename(old)
    tmp.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build_into(target: Path, spec: TinyModelSpec, corpus: Path, marker: dict[str, JSON]) -> BuildSummary:
    """Write every file of the model into ``target``; the marker last. Returns the build summary."""
    start = time.perf_counter()
    logger.info(
        "[1/3] training byte-level BPE (vocab<=%s) on %s conversations of %s",
        spec.vocab_size,
        spec.tokenizer_train_conversations,
        corpus,
    )
    tokenizer = _train_tokenizer(spec, corpus)
    vocab = tokenizer.get_vocab_size()
    if vocab < spec.vocab_size:
        logger.info(
            "tokenizer learned %s tokens (< requested %s); model vocab follows the tokenizer", vocab, spec.vocab_size
        )
    _save_tokenizer(tokenizer, spec, target)
    logger.info("[2/3] initialising LlamaForCausalLM (seed=%s)", spec.seed)
    n_params = _save_model(spec, vocab, target)
    logger.info("[3/3] writing marker")
    summary: BuildSummary = {
        "params": n_params,
        "vocab": vocab,
        "build_seconds": round(time.perf_counter() - start, 2),
    }
    payload = {"build": marker, "summary": summary}
    (target / MARKER_FILE).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return summary


def _corpus_texts(corpus: Path, n_conversations: int) -> Iterator[str]:
    """Every turn's text of the first ``n_conversations`` records."""
    for i, record in enumerate(iter_conversations(corpus)):
        if i >= n_conversations:
            return
        for turn in record.get("conversations") or []:
            value = turn.get("value") if isinstance(turn, dict) else None
            if isinstance(value, str) and value:
                yield value


def _train_tokenizer(spec: TinyModelSpec, corpus: Path) -> Tokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=logger.isEnabledFor(logging.INFO),
    )
    tokenizer.train_from_iterator(_corpus_texts(corpus, spec.tokenizer_train_conversations), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def _save_tokenizer(tokenizer: Tokenizer, spec: TinyModelSpec, target: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    # its constructor is unannotated
    wrap: Callable[..., PreTrainedTokenizerFast] = PreTrainedTokenizerFast
    wrapped = wrap(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=spec.max_position_embeddings,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    wrapped.save_pretrained(str(target))


def _save_model(spec: TinyModelSpec, vocab: int, target: Path) -> int:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    ids = {name: SPECIAL_TOKENS.index(tok) for name, tok in (("bos", BOS), ("eos", EOS), ("pad", PAD))}
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=ids["bos"],
        eos_token_id=ids["eos"],
        pad_token_id=ids["pad"],
        tie_word_embeddings=False,
        dtype="float32",
    )
    # the model's and the generation config's constructors are unannotated
    new_model: Callable[[LlamaConfig], LlamaForCausalLM] = LlamaForCausalLM
    new_generation_config: Callable[..., GenerationConfig] = GenerationConfig
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG state untouched
        torch.manual_seed(spec.seed)
        model = new_model(config)
        _to_float32(model)
    model.generation_config = new_generation_config(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"]
    )
    model.save_pretrained(str(target))
    return sum(p.numel() for p in model.parameters())


def _to_float32(module: torch.nn.Module) -> None:
    """``module.to(torch.float32)``, in place (a module's ``to`` returns the module itself). Typed as torch's
    ``Module`` because transformers' ``PreTrainedModel.to`` (``functools.wraps`` over it) hides its signature."""
    import torch

    module.to(torch.float32)
