"""How many (prompt, response length) pairs the salvaged ShareGPT gives, and how they split.

    python benchmarks/predictor_data_stats.py

Builds the pairs file if it is missing (about a minute), then writes
``benchmarks/results/length_predictor_data.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from tetriserve.common.sharegpt import iter_conversations
    from tetriserve.control_plane.model_builder import build_tiny_model, default_tiny_model_dir
    from tetriserve.length_predictor.commands import DataOptions, load_pairs
    from tetriserve.length_predictor.data import by_split, label_stats

    opts = DataOptions(target_tokenizer=str(build_tiny_model(default_tiny_model_dir())))
    pairs = load_pairs(opts, progress=False)
    salvaged = sum(1 for _ in iter_conversations())
    conversations = len({p.conv for p in pairs})
    splits = by_split(pairs)
    first = by_split(pairs[:36000])
    lines = [
        "# Length predictor data: ShareGPT pairs",
        "",
        "Command: `python benchmarks/predictor_data_stats.py`  ",
        "Every human→gpt turn of the salvaged ShareGPT records; label = the gpt turn's length in the tiny-llama "
        "tokenizer; split by conversation hash.",
        "",
        f"- complete conversations salvaged from the truncated file: {salvaged:,}",
        f"- conversations with at least one pair: {conversations:,}",
        f"- pairs: {len(pairs):,}",
        f"- all pairs by split: {', '.join(f'{k} {len(v):,}' for k, v in sorted(splits.items()))}",
        f"- first 36,000 pairs (what the committed heads use) by split: "
        f"{', '.join(f'{k} {len(v):,}' for k, v in sorted(first.items()))}",
        f"- label stats, all pairs (tokens): {label_stats(pairs)}",
    ]
    text = "\n".join(lines) + "\n"
    (ROOT / "benchmarks" / "results" / "length_predictor_data.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
