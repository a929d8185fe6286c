"""The report of ``transport_throughput.py``: each backend beside its ceiling, over rounds, against the bar.

The bar: from 16 MiB on, every backend moves at least 0.85 of the raw path it rides (``TARGET``).

GB/s is the median over the rounds of each round's median; a ratio is the median of the per-round ratios (a
backend and its ceiling measured seconds apart within a round), every round's listed after it.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench_results import provenance

PAIRS = (("shm", "copy_reused"), ("tcp", "socket"), ("ucx", "raw_ucx"), ("nccl", "raw_gloo"))  # backend, ceiling
TARGET = 0.85  # the bar: this share of the ceiling from TARGET_FROM_MIB up
TARGET_FROM_MIB = 16


def _rounds(data: dict[str, Any]) -> list[dict[str, dict[int, float]]]:
    """Each round's median GB/s per path and size (a result without ``rounds`` is one round)."""
    runs = data["rounds"] if "rounds" in data else [data["gbps"]]
    return [{name: {int(k): statistics.median(v) for k, v in by_size.items()} for name, by_size in run.items()}
            for run in runs]  # fmt: skip


def _cell(rounds: list[dict[str, dict[int, float]]], name: str, size: int) -> float:
    return statistics.median(r[name][size] for r in rounds)


def _ratios(rounds: list[dict[str, dict[int, float]]], name: str, ceiling: str, size: int) -> list[float]:
    return [r[name][size] / r[ceiling][size] for r in rounds]


def _ratio_cell(ratios: list[float]) -> str:
    """The median of the per-round ratios, each round's after it when there are several."""
    text = f"{statistics.median(ratios):.2f}"
    return text if len(ratios) == 1 else f"{text} ({', '.join(f'{x:.2f}' for x in ratios)})"


def report(data: dict[str, Any]) -> str:
    sizes = data["sizes_mib"]
    rounds = _rounds(data)
    n = len(rounds)
    paths = set(rounds[0])
    lines = [
        "# KV transport throughput beside the raw path",
        "",
        *provenance(data),
        "One buffer per transfer from one process to another on this machine; GB/s from `send` until "
        "the receiving process's `recv` had it, median of the repeats after one warm-up per size; each backend "
        "beside the raw path it rides, measured in the same run.",
    ]
    if n > 1:
        lines[-1] += (
            f" {n} rounds; in each, every backend and its ceiling, the ceilings measured first in every other round "
            "(so that the machine's drift falls on both). GB/s: the median over the rounds of each round's median; "
            "a ratio: the median of the per-round ratios, each round's in brackets."
        )
    if "shm" in paths:
        lines += [
            "",
            "shm and tcp. Ceilings: a torch tensor copy of the same size on one thread, as in a worker process "
            "(into a reused buffer, as the shm backend copies into a slab it reuses; and into a buffer allocated "
            "for it), and a plain loopback socket between two processes.",
            "",
            "| MiB | shm | torch copy, reused buffer | shm / that | torch copy, fresh buffer | shm / that | tcp | "
            "loopback socket | tcp / that |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for s in sizes:
            shm, fresh, reused = (_cell(rounds, k, s) for k in ("shm", "copy_fresh", "copy_reused"))
            tcp, sock = _cell(rounds, "tcp", s), _cell(rounds, "socket", s)
            lines.append(
                f"| {s} | {shm:.2f} | {reused:.2f} | {_ratio_cell(_ratios(rounds, 'shm', 'copy_reused', s))} | "
                f"{fresh:.2f} | {_ratio_cell(_ratios(rounds, 'shm', 'copy_fresh', s))} | {tcp:.2f} | {sock:.2f} | "
                f"{_ratio_cell(_ratios(rounds, 'tcp', 'socket', s))} |"
            )
    if "shm_pull" in paths:
        lines += [
            "",
            "shm's one-sided pull (`transport/shm_pull.py`): the publisher's buffer already lies in a slab (the "
            "packer gathers the KV straight into it); the reader asks for the key, maps the slab (its descriptor "
            "comes along the first time) and lands views of it, so no byte is copied between the processes. GB/s: "
            "the size over the time from asking until the reader's `recv` has it, beside the push above (`shm`: "
            "the sender copies into a slab and lends it) and the copy that push makes.",
            "",
            "| MiB | shm pull | shm push | pull / push | torch copy, reused buffer | pull / that |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for s in sizes:
            pull, push, reused = (_cell(rounds, k, s) for k in ("shm_pull", "shm", "copy_reused"))
            lines.append(
                f"| {s} | {pull:.2f} | {push:.2f} | {_ratio_cell(_ratios(rounds, 'shm_pull', 'shm', s))} | "
                f"{reused:.2f} | {_ratio_cell(_ratios(rounds, 'shm_pull', 'copy_reused', s))} |"
            )
    for name, raw, label, what in (
        ("ucx", "raw_ucx", "raw ucxx", "raw `ucxx` tag send/recv between two processes, a one-byte ack back"),
        ("nccl", "raw_gloo", "raw gloo", "raw `torch.distributed` send/recv on a two-rank gloo group (no CUDA "
         "here, so `nccl` runs on gloo), a one-byte tensor back as the ack"),
    ):  # fmt: skip
        if name not in paths:
            continue
        lines += ["", f"{name}. Ceiling: {what}.", "", f"| MiB | {name} | {label} | {name} / that |",
                  "| ---: | ---: | ---: | ---: |"]  # fmt: skip
        for s in sizes:
            got, ceiling = _cell(rounds, name, s), _cell(rounds, raw, s)
            lines.append(f"| {s} | {got:.2f} | {ceiling:.2f} | {_ratio_cell(_ratios(rounds, name, raw, s))} |")
    lines += ["", *_target_lines(rounds, sizes, paths)]
    if "loadavg_1min" in data:
        before, after = data["loadavg_1min"]
        lines += ["", f"One-minute load average {before:.1f} as the run started, {after:.1f} as it ended."]
    return "\n".join(lines) + "\n"


def _target_lines(rounds: list[dict[str, dict[int, float]]], sizes: list[int], paths: set[str]) -> list[str]:
    """Each backend against the bar (≥ TARGET of its ceiling from TARGET_FROM_MIB), on the median ratio."""
    lines = [
        f"Against the bar (≥ {TARGET:.2f} of the ceiling from {TARGET_FROM_MIB} MiB, on the median of the per-round "
        "ratios; shm's push held to the reused-buffer copy):",
        "",
        "| backend | ceiling | " + " | ".join(f"{s} MiB" for s in sizes if s >= TARGET_FROM_MIB) + " | met |",
        "| --- | --- | " + " | ".join("---:" for s in sizes if s >= TARGET_FROM_MIB) + " | --- |",
    ]
    for name, ceiling in PAIRS:
        if name not in paths or ceiling not in paths:
            continue
        meds = [statistics.median(_ratios(rounds, name, ceiling, s)) for s in sizes if s >= TARGET_FROM_MIB]
        met = "-" if not meds else "yes" if min(meds) >= TARGET else "no"
        lines.append(f"| {name} | {ceiling} | " + " | ".join(f"{m:.2f}" for m in meds) + f" | {met} |")
    return lines
