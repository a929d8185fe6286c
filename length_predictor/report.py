"""The ``predictor eval`` report: one markdown file and its PNGs.

length_predictor.md                       accuracy vs paper and baselines, calibration, provisioning
length_predictor_confusion_g<g>.png       row-normalised confusion matrix per granularity
length_predictor_calibration.png          reliability diagram of the bucket classifier (all granularities)
length_predictor_provisioning.png         under/over-provisioning rate vs Hoeffding confidence (CacheOpt Fig. 17h)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import numpy as np

from tetriserve.length_predictor import evaluate as ev
from tetriserve.length_predictor.artifact import Artifact, ArtifactMeta
from tetriserve.length_predictor.data import Pair
from tetriserve.length_predictor.train import predict_arrays

PAPER_ACCURACY = {100: 0.589, 200: 0.749, 400: 0.850}  # TetriInfer §5.2.2, OPT-125M on 75K ShareGPT prompts
CONFIDENCES = (0.8, 0.9, 0.95)
NAME = "length_predictor"


class EvalSummary(TypedDict, total=False):
    """What the report says of the data: the artifact's JSON, the split sizes, the test labels' stats."""

    meta: ArtifactMeta
    splits: dict[str, int]
    test_stats: dict[str, float]


@dataclass
class EvalResult:
    granularity: int
    num_buckets: int
    n_test: int
    accuracy: float
    within_one: float
    majority: float
    prompt_len_only: float
    confusion: np.ndarray
    calibration: ev.Calibration
    provisioning: dict[str, dict[str, float]]
    direction_accuracy: float
    mae: float


def evaluate_one(
    art: Artifact, train: list[Pair], test: list[Pair], test_x: np.ndarray, test_y: np.ndarray
) -> EvalResult:
    spec = art.spec
    true = np.asarray([spec.bucket_of(int(v)) for v in test_y])
    train_b = np.asarray([spec.bucket_of(p.response_len) for p in train])
    pred = predict_arrays(art.heads, test_x)
    prompt_lens = np.asarray([p.prompt_len for p in test])
    baseline_pl = ev.prompt_length_baseline(np.asarray([p.prompt_len for p in train]), train_b, prompt_lens)
    return EvalResult(
        granularity=spec.granularity,
        num_buckets=spec.num_buckets,
        n_test=len(test),
        accuracy=ev.accuracy(pred["bucket"], true),
        within_one=ev.within_one(pred["bucket"], true),
        majority=ev.accuracy(ev.majority_baseline(train_b, len(true)), true),
        prompt_len_only=ev.accuracy(baseline_pl, true),
        confusion=ev.confusion(true, pred["bucket"], spec.num_buckets),
        calibration=ev.calibration(pred["prob"], pred["bucket"] == true),
        provisioning=ev.provisioning_table(
            test_y, pred["length"], pred["under"], pred["bucket"], art.widths, spec.granularity, CONFIDENCES
        ),
        direction_accuracy=float((pred["under"] == (test_y > pred["length"])).mean()),
        mae=float(np.abs(test_y - pred["length"]).mean()),
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _accuracy_table(results: list[EvalResult]) -> list[str]:
    lines = [
        "| granularity | buckets | ours (MiniLM + heads) | within ±1 bucket | majority bucket | prompt-length-only "
        "| TetriInfer (OPT-125M, 75K) | ECE |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        paper = PAPER_ACCURACY.get(r.granularity)
        lines.append(
            f"| {r.granularity} | {r.num_buckets} | **{_pct(r.accuracy)}** | {_pct(r.within_one)} | {_pct(r.majority)} "
            f"| {_pct(r.prompt_len_only)} | {_pct(paper) if paper else '-'} | {r.calibration['ece']:.3f} |"
        )
    return lines


def _provisioning_table(r: EvalResult) -> list[str]:
    lines = [
        f"Granularity {r.granularity} (regressor MAE {r.mae:.0f} tokens, "
        f"direction accuracy {_pct(r.direction_accuracy)}):",
        "",
        "| estimate | under-provisioned | over-provisioned | mean deviation | mean under dev. | mean over dev. |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, p in r.provisioning.items():
        lines.append(
            f"| {name} | {_pct(p['under_rate'])} | {_pct(p['over_rate'])} | {p['mean_deviation']:.0f} "
            f"| {p['mean_under_deviation']:.0f} | {p['mean_over_deviation']:.0f} |"
        )
    return lines


def _plots(results: list[EvalResult], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for r in results:
        rows = r.confusion.sum(1, keepdims=True)
        norm = np.divide(r.confusion, np.maximum(rows, 1))
        fig, ax = plt.subplots(figsize=(6.4, 5.6))
        im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
        ax.set(
            xlabel="predicted bucket",
            ylabel="true bucket",
            title=f"g={r.granularity}: accuracy {_pct(r.accuracy)} (n={r.n_test}), rows normalised",
        )
        fig.colorbar(im, ax=ax)
        name = f"{NAME}_confusion_g{r.granularity}.png"
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    fig, ax = plt.subplots(figsize=(5.6, 5.0))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    for r in results:
        c = r.calibration
        pts = [
            (x, y)
            for x, y, n in zip(c["confidence"], c["accuracy"], c["count"], strict=True)
            if n and not math.isnan(x)
        ]
        ax.plot(*zip(*pts, strict=True), "o-", label=f"g={r.granularity} (ECE {c['ece']:.3f})")
    ax.set(xlabel="top-bucket probability", ylabel="accuracy", title="bucket classifier calibration (test)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{NAME}_calibration.png", dpi=110)
    plt.close(fig)
    names.append(f"{NAME}_calibration.png")
    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.8), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        keys = list(r.provisioning)
        x = np.arange(len(keys))
        ax.bar(x - 0.2, [r.provisioning[k]["under_rate"] for k in keys], 0.4, label="under-provisioned")
        ax.bar(x + 0.2, [r.provisioning[k]["over_rate"] for k in keys], 0.4, label="over-provisioned")
        ax.set_xticks(
            x,
            [
                k.replace("Hoeffding padding, ", "±t by direction, ")
                .replace("Hoeffding, always added, ", "+t, ")
                .replace(" (", "\n(")
                for k in keys
            ],
            rotation=60,
            ha="right",
            fontsize=7,
        )
        ax.set(title=f"g={r.granularity}", ylim=(0, 1))
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{NAME}_provisioning.png", dpi=110)
    plt.close(fig)
    names.append(f"{NAME}_provisioning.png")
    return names


def write_report(results: list[EvalResult], summary: EvalSummary, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    pngs = _plots(results, out)
    meta = summary.get("meta", {})
    enc = meta.get("encoder", {})
    lines = [
        "# Length predictor: held-out evaluation",
        "",
        "Written by `tetriserve predictor eval`. Test split only: never seen in training or width fitting.",
        "",
        f"- Labels: {meta.get('labels', {}).get('source', '?')} "
        f"(target tokenizer `{meta.get('labels', {}).get('target_tokenizer', '?')}`).",
        f"- Pairs: first {meta.get('data', {}).get('limit') or 'all'} of `{meta.get('data', {}).get('pairs_file')}`; "
        f"splits by conversation: {json.dumps(summary.get('splits', {}))}.",
        f"- Test label stats (tokens): {json.dumps(summary.get('test_stats', {}))}.",
        f"- Encoder: {enc.get('name')} (frozen, mean-pooled, {enc.get('max_length')}"
        " tokens cut from the left) + prompt length; heads trained with HF Trainer "
        f"({meta.get('train', {}).get('mode', '?')} mode).",
        "",
        "## Bucket accuracy",
        "",
        *_accuracy_table(results),
        "",
        "## Provisioning of the padded estimate (CacheOpt Fig. 17h)",
        "",
        "Under-provisioned: actual > estimate (the request outgrows its KV reservation). Over-provisioned: "
        "actual < estimate. Deviation |estimate - actual| in tokens.",
        "",
    ]
    for r in results:
        lines += [*_provisioning_table(r), ""]
    lines += [f"![{p}]({p})" for p in pngs]
    path = out / f"{NAME}.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / f"{NAME}.json").write_text(
        json.dumps(
            [
                {k: v for k, v in r.__dict__.items() if k != "confusion"} | {"confusion": r.confusion.tolist()}
                for r in results
            ],
            indent=1,
        )
        + "\n",
        encoding="utf-8",
    )
    return path
