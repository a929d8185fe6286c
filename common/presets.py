"""One preset per paper: every policy and parameter the way that paper's evaluation sets them.

``preset: <name>`` in the config file (``--preset <name>``, the Helm value ``serve.preset``) lays the preset's settings
under the configuration: a setting given in the file or on the command line wins over the preset's. A preset names
the modes it serves in; the first is the mode it sets. Parameters that have a paper default of their own (CacheOpt's
reserve of 8 blocks and m = 2, SCLS's ζ = 0.9 and slice length 128, AccelGen's γ and P_max as iterations, SOLA's
window) are the fields' defaults already, so a preset names only what differs from the service's defaults.

- ``tetriinfer`` — TetriInfer §5 (evaluation setup): SJF with PrefillSchedBatch 16 (§3.3.1, Fig. 16), ChunkSize
  512 (§3.3.2), power-of-two dispatch (§3.3.4), reserve-dynamic as §3.4 writes it (the shortest predicted finish
  only), every prompt prefilled on a prefill worker (no offload to decode workers), and a worker idle for a minute
  flips (§3.5). Its results come from emulated links of 200 Gb/s (RoCE) to 300 GB/s (NVLink); the preset shapes the
  KV transfer to the slowest, 200 Gb/s (``transport.emulate``), over whichever backend is configured.
- ``accelgen`` — AccelGen §4, §6.1: the remaining-time prompt order (§4.3), SLO-guaranteed dynamic chunking
  (§4.2) with multi-resource selection (§4.4), decode admission by TBT slack and Algorithm 1's preemption order
  (§4.3, §4.4), on one engine (colocated).
- ``sola`` — SOLA §4, §5: the state monitor and the TTFT/TPOT switch with n_i / k_i (``prefill.chunking: sola``),
  the predicted-TTFT order and the predicted-TPOT admission, on one engine (colocated).
- ``scls`` — SCLS §4, §5.1: Algorithm 1's DP batching with the serving-time and memory estimators, slices of 128
  iterations, max-min dispatch (§4.5), on one engine per worker (colocated); disaggregated, slices move requests
  between decode workers (§4.5's rebalancing).
- ``cacheopt`` — CacheOpt §3.3–§3.4, §5: SLO-aware admission and KV allocation (reserve 8 blocks, m = 2, B = 8),
  the preemption order of §3.4, on one engine (colocated). §3.5's swap-or-recompute choice needs a measured
  profile (``decode.preemption.mode: auto`` with ``decode.preemption.profile``); without one victims recompute.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

PresetName = Literal["tetriinfer", "accelgen", "sola", "scls", "cacheopt"]


@dataclass(frozen=True)
class Preset:
    name: str
    paper: str
    sections: str  # where its settings come from
    summary: str  # one line: what it turns on
    modes: tuple[str, ...]  # the modes it serves in; the first is the one it sets
    settings: Mapping[str, object]  # dotted keys, as ``--set``/overrides take them


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "tetriinfer",
            "TetriInfer",
            "§3.2–§3.5, §5",
            "least-loaded placement, SJF, PrefillSchedBatch 16, ChunkSize 512, power-of-two dispatch, "
            "reserve-dynamic (§3.4), no prompt offload, idle flips after 60 s, KV over an emulated 200 Gb/s link",
            ("disaggregated",),
            {
                "prefill.placement": "least-load",
                "prefill.queue_policy": "sjf",
                "prefill.sched_batch": 16,
                "prefill.chunking": "fixed",
                "prefill.chunk_size": 512,
                "prefill.dispatch_policy": "power-of-two",
                "prefill.offload_wait_s": 0,
                "prefill.offload_max_tokens": 0,
                "decode.max_local_prompts": 0,
                "decode.admission.policy": "reserve-dynamic",
                "decode.admission.horizons": "shortest",
                "flip.policy": "tetriinfer",
                "flip.interval_s": 60.0,
                "transport.emulate.gbps": 200.0,
            },
        ),
        Preset(
            "accelgen",
            "AccelGen",
            "§4.2–§4.4, §6.1",
            "Remaining-time order, dynamic chunking, multi-resource selection, TBT-slack admission, "
            "Algorithm 1 preemption",
            ("colocated", "disaggregated"),
            {
                "prefill.queue_policy": "accelgen",
                "prefill.chunking": "dynamic",
                "prefill.chunk_selection": "multi-resource",
                "decode.admission.policy": "accelgen",
                "decode.preemption.order": "accelgen",
            },
        ),
        Preset(
            "sola",
            "SOLA",
            "§4.3–§4.4, §5",
            "State monitor, TTFT/TPOT switch, n_i / k_i, predicted-TTFT order, predicted-TPOT admission",
            ("colocated", "disaggregated"),
            {
                "prefill.queue_policy": "sola",
                "prefill.chunking": "sola",
                "decode.admission.policy": "sola",
            },
        ),
        Preset(
            "scls",
            "SCLS",
            "§4.2–§4.5, §5.1",
            "DP batching with the serving-time and memory estimators (ζ 0.9), slices of 128, max-min dispatch",
            ("colocated", "disaggregated"),
            {
                "prefill.dispatch_policy": "max-min",
                "decode.admission.policy": "scls",
            },
        ),
        Preset(
            "cacheopt",
            "CacheOpt",
            "§3.3–§3.4, §5",
            "SLO-aware admission and KV allocation (reserve 8, m = 2, B = 8), CacheOpt preemption order",
            ("colocated", "disaggregated"),
            {
                "decode.admission.policy": "cacheopt",
                "decode.preemption.order": "cacheopt",
            },
        ),
    )
}


def preset_listing() -> str:
    """Every preset, a line each: name, paper and sections, modes, what it turns on."""
    width = max(len(name) for name in PRESETS)
    lines = []
    for p in PRESETS.values():
        also = f", or {' or '.join(p.modes[1:])}" if len(p.modes) > 1 else " only"
        lines.append(f"{p.name:<{width}}  {p.paper} {p.sections}; {p.modes[0]}{also}. {p.summary}.")
    return "\n".join(lines)
