"""How many (prompt, response length) pairs the salvaged ShareGPT gives, and how they split.

    python benchmarks/diagnostics/predictor_data_stats.py

Builds the pairs file if it is missing (about a minute), then writes ``length_predictor_data.md`` (under
``benchmarks/_work/diagnostics``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_setup  # noqa: F401  (sys.path; reports go to benchmarks/_work/diagnostics)
from bench_results import RESULTS, ROOT

sys.path.insert(0, str(ROOT))


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    from tetriserve.cli.model_builder import build_tiny_model, default_tiny_model_dir
    from tetriserve.common.sharegpt import iter_conversations
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
        "Command: `python benchmarks/diagnostics/predictor_data_stats.py`  ",
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
    (RESULTS / "length_predictor_data.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
