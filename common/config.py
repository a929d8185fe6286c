"""Cluster configuration: a pydantic model read from YAML and overridden by CLI flags.

Each section lives in a module of its own (``admission_config.py``, ``prefill_config.py``, ...); every field
carries a description that the CLI turns into ``--help`` text.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tetriserve.common.admission_config import AdmissionConfig
from tetriserve.common.config_keys import renamed_in
from tetriserve.common.flip_config import FlipConfig, ScaleConfig
from tetriserve.common.load import DEFAULT_REPORT_TOLERANCE
from tetriserve.common.prefill_config import PrefillConfig
from tetriserve.common.presets import PRESETS, PresetName
from tetriserve.common.security_config import SecurityConfig
from tetriserve.common.slo_config import READING_TBT_MS, SloConfig
from tetriserve.common.tracing_config import TracingConfig
from tetriserve.common.transport_config import TransportConfig

EngineDtype = Literal["auto", "float32", "bfloat16", "float16"]


class CpuConfig(BaseModel):
    """How CPU engines share the machine's cores under ``engine.cpu_placement: auto``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reserve_decode_cores: bool = Field(
        True,
        description=(
            "CPU, `tetriserve serve` with a Ray cluster of its own: the decode engines get the lowest "
            "num_decode x threads_per_engine cores to themselves, and the prefill engines and every other "
            "thread of the service (front door, Ray, predictor) the remaining cores, as plain vLLM binds "
            "its model worker to a core; only where at least one core is left for the rest. With it a decode "
            "engine on its own cores runs at niceness 0 and borrows none (decode_niceness and "
            "borrow_idle_cores do not apply to it). Sized at start: a decode worker added later by a flip or "
            "scaling finds the reserved cores taken and shares every core, as without the reservation."
        ),
    )
    share_decode_cores: Literal["none", "rest", "all"] = Field(
        "none",
        description=(
            "With reserve_decode_cores, who else may run on a decode engine's own cores while it leaves them "
            "idle: none, rest (every thread of the service but the prefill engines) or all (the prefill engines "
            "too). Sharing, the decode engine runs there at niceness -20, so the others take its cores only "
            "between its steps (needs CAP_SYS_NICE; without it nothing is shared). On 2 cores rest buys throughput "
            "and TTFT in a burst and costs TTFT at a steady rate (benchmarks/diagnostics/engine_steps.py "
            "--scenario saturation, and rate, --repeats 2 --variant none= --variant rest='--share-decode-cores "
            "rest'); none by default."
        ),
    )
    decode_niceness: int = Field(
        5,
        ge=0,
        le=19,
        description=(
            "Linux niceness of each decode engine's stepping thread where it shares cores (no "
            "reserve_decode_cores). Above 0 the decode engine, which always has work, yields to prefill engines "
            "and the front door, so prompts start sooner (lower TTFT) while running streams' steps wait (higher "
            "TPOT). 0: an equal share."
        ),
    )
    prefill_niceness: int = Field(
        -10,
        ge=-20,
        le=19,
        description=(
            "Linux niceness of each prefill engine's stepping thread (and only it). Below 0 a prompt's step goes "
            "before the front door, Ray, the length predictor and the workers' event loops on the cores they "
            "share (lower TTFT). Below 0 needs CAP_SYS_NICE (root, or the capability added to the pod): "
            "without it the thread stays at 0 and the worker logs a warning. 0: an equal share."
        ),
    )
    borrow_idle_cores: bool = Field(
        True,
        description=(
            "CPU engines: a decode engine whose batch has at least borrow_min_batch running requests steps with "
            "its own threads plus the cores that idle engines on the same machine leave (a prefill engine "
            "between prompts), while the rest of the machine leaves them idle, and gives them back at its next "
            "step once they start stepping. Pays at large batches (a burst's decode); a small step has too little "
            "work to split: at a batch of one a second thread buys nothing, at 4 to 64 it cuts the step "
            "(benchmarks/diagnostics/engine_executor.py --executors uni --threads 1 2 --batches 1 4 16 64 --tokens "
            "128 --repeats 3). False: every engine keeps threads_per_engine."
        ),
    )
    borrow_min_batch: int = Field(
        4,
        ge=1,
        description="Smallest running batch for which a decode engine borrows idle cores (borrow_idle_cores).",
    )
    borrow_min_idle_cores: float = Field(
        0.5,
        ge=0,
        description=(
            "A decode engine borrows idle cores only while the rest of the machine (the front door, Ray, the "
            "length predictor: processes that post nothing on the core board) has left at least this many cores "
            "idle beyond the engine's own threads, over the last 200 ms (borrow_idle_cores)."
        ),
    )


# engine.cpu_placement: shared — every thread on every core at an equal share, nothing reserved or borrowed
SHARED_CPU = CpuConfig.model_validate(
    {
        "reserve_decode_cores": False,
        "share_decode_cores": "none",
        "decode_niceness": 0,
        "prefill_niceness": 0,
        "borrow_idle_cores": False,
    }
)


class EngineConfig(BaseModel):
    """Settings shared by every vLLM engine of the cluster."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(
        None, description="Hugging Face model directory; None builds/uses the tiny random-weight model."
    )
    served_model_name: str | None = Field(
        None, description="Name clients pass as `model`; default: the directory name."
    )
    dtype: EngineDtype = Field(
        "auto",
        description=(
            "Weights/activations dtype. auto: vLLM's choice, except float32 on a CPU without bfloat16 matrix "
            "instructions (AMX, AVX512-BF16), where bfloat16 is emulated and slow."
        ),
    )
    max_model_len: int = Field(2048, ge=16, description="Context length (prompt + output tokens).")
    block_size: int = Field(
        32, ge=1, description="KV cache block size in tokens (vLLM CPU attention needs a multiple of 32)."
    )
    kv_cache_gb: float = Field(1.0, gt=0, description="KV cache memory per engine in GiB (CPU engines).")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="Fraction of GPU memory per engine (CUDA).")
    max_num_seqs: int = Field(
        128, ge=1, description="Most sequences an engine runs in one step (vLLM's OpenAI server default on CPU)."
    )
    threads_per_engine: int = Field(1, ge=1, description="OMP/torch threads per engine (CPU).")
    cpu_placement: Literal["auto", "shared"] = Field(
        "auto",
        description=(
            "Where CPU engines' threads run and at what priority. auto: the engine.cpu settings (decode engines on "
            "cores of their own where the machine has one to spare, prefill engines ahead of the rest, decode "
            "engines borrowing idle cores at large batches; each falls back by itself where it does not apply). "
            "shared: every thread on every core at an equal share, as plain vLLM runs (engine.cpu is ignored)."
        ),
    )
    cpu: CpuConfig = Field(
        default_factory=CpuConfig,
        description="The CPU placement's settings under cpu_placement auto.",
    )
    stream_interval_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description=(
            "Hand an engine's new tokens to its worker at most this often, in ms, the tokens of the steps "
            "between coalesced (a finish, an error or an abort goes at once). Fewer wake-ups of the worker's "
            "event loop beside the stepping engine; tokens reach the client in small bursts (vLLM's "
            "`stream_interval` counts tokens instead). 0: after every step."
        ),
    )
    seed: int = Field(0, description="Engine seed.")
    enforce_eager: bool = Field(
        False, description="Skip torch.compile / CUDA graphs: faster start, slower steps (vLLM's default is False)."
    )

    @model_validator(mode="after")
    def _cpu_settings_apply(self) -> EngineConfig:
        if self.cpu_placement == "shared" and self.cpu.model_fields_set:
            given = ", ".join(f"engine.cpu.{k}" for k in sorted(self.cpu.model_fields_set))
            raise ValueError(f"{given}: engine.cpu applies under cpu_placement auto, not shared")
        return self

    def placement(self) -> CpuConfig:
        """The CPU placement in force: ``cpu`` under auto, ``SHARED_CPU`` under shared."""
        return self.cpu if self.cpu_placement == "auto" else SHARED_CPU


ADMISSION_PARAMS: dict[str, tuple[str, ...]] = {
    "greedy": (),
    "reserve-static": ("length_end",),
    "reserve-dynamic": ("length_end", "horizons"),
    "cacheopt": ("reserve_blocks", "proactive_iters", "buffer_tokens", "basic_tokens"),
    "sola": (),
    "accelgen": ("default_tbt_ms",),
    "scls": ("zeta", "cost_profile"),
}


def apply_dotted(data: dict[str, object], changes: Mapping[str, object], below: str = "") -> None:
    """Set each of ``changes``, dotted keys (``engine.max_model_len``), in ``data``: the config's mapping, or with
    ``below="decode"`` the decode section's (``admission.policy``); a None value is no change. A switch of the
    decode admission policy among them leaves behind the parameters set for the policy before it: those the new
    policy does not take are dropped, unless the switch sets them too (and so has them refused if foreign)."""
    prefix = f"{below}." if below else ""
    for dotted, value in changes.items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"{prefix}{dotted}: {prefix}{part} is not a section")
            node = child
        node[leaf] = value
    section = "decode.admission".removeprefix(prefix)
    if changes.get(f"{section}.policy") is None:
        return
    admission: object = data
    for part in section.split("."):
        admission = admission.get(part) if isinstance(admission, dict) else None
    if isinstance(admission, dict):
        own = {"policy", *ADMISSION_PARAMS.get(str(admission.get("policy")), ()), *_below(changes, section)}
        for key in [k for k in admission if k not in own]:
            del admission[key]


def under_preset(data: dict[str, object]) -> dict[str, object]:
    """``data`` (a config's mapping naming a ``preset``) laid over the preset's settings: what ``data`` sets wins.
    A ``decode.admission`` section that names its own policy replaces the preset's whole (the preset's
    parameters belong to the preset's policy). A mode the preset does not serve in is refused."""
    name = data["preset"]
    preset = PRESETS.get(str(name))
    if preset is None:
        raise ValueError(f"preset: unknown {name!r}; known: {', '.join(PRESETS)}")
    mode = data.get("mode", preset.modes[0])
    if mode not in preset.modes:
        raise ValueError(f"preset {preset.name} serves in {' or '.join(preset.modes)} mode, not {mode}")
    base: dict[str, object] = {"mode": preset.modes[0]}
    apply_dotted(base, preset.settings)
    decode = data.get("decode")
    if isinstance(decode, dict) and isinstance(decode.get("admission"), dict) and "policy" in decode["admission"]:
        base_decode = base.get("decode")
        if isinstance(base_decode, dict):
            base_decode.pop("admission", None)
    return _merged(base, data)


def _merged(base: dict[str, object], over: Mapping[str, object]) -> dict[str, object]:
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        out[key] = _merged(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return out


def _below(changes: Mapping[str, object], section: str) -> set[str]:
    return {k.removeprefix(f"{section}.") for k in changes if k.startswith(f"{section}.")}


class DecodeAdmission(BaseModel):
    """The decode admission policy and its parameters: each parameter belongs to the policies its description
    names; one given a value other than its default under another policy is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Literal["greedy", "reserve-static", "reserve-dynamic", "cacheopt", "sola", "accelgen", "scls"] = Field(
        "greedy",
        description=(
            "Decode admission: greedy (vLLM's own), reserve-static (each request reserves its predicted KV), "
            "reserve-dynamic (admit only if KV stays free until the batch's jobs finish, by prediction; "
            "TetriInfer §3.4), cacheopt (padded reservation with reuse, TBT-slack order, critical requests on their "
            "basic demand, amortised grants, proactive grants and a global reserve; CacheOpt §3.3), sola "
            "(predicted-TPOT order, peak-memory check; SOLA §4.4.2, §5.1), accelgen (tightest TBT slack first, "
            "vLLM's fit test; AccelGen §4.3), scls (the waiting requests batched by serving time, the longest batch "
            "first, each admitted while its next slice of decode.slice_iters tokens fits ζ of the KV pool; SCLS "
            "§4.2–§4.4, Algorithm 1)."
        ),
    )
    length_end: Literal["lower", "estimate", "upper"] = Field(
        "lower",
        description=(
            "reserve-static, reserve-dynamic: which end of a request's predicted length range its remaining "
            "tokens are read from (TetriInfer §3.4 uses the lower end)."
        ),
    )
    horizons: Literal["all", "shortest"] = Field(
        "all",
        description=(
            "reserve-dynamic: the moments the batch's KV is checked at: all (every predicted finish in the batch "
            "and the new request's own, so exact predictions never preempt) or shortest (the shortest remaining "
            "job's only, TetriInfer §3.4 taken literally)."
        ),
    )
    reserve_blocks: int = Field(
        8,
        ge=0,
        description=(
            "cacheopt: KV blocks kept out of admission grants, the global reservation (CacheOpt §3.3.3; §5: 8 "
            "blocks, here of engine.block_size tokens)."
        ),
    )
    proactive_iters: int = Field(
        2,
        ge=0,
        description=(
            "cacheopt: m, the iterations granted ahead of need to a request that outlived its estimate, one token "
            "each (CacheOpt §3.3.3; §5: m = 2)."
        ),
    )
    buffer_tokens: int = Field(8, ge=0, description="cacheopt: slack tokens per request (the paper's b).")
    basic_tokens: int = Field(
        8,
        ge=0,
        description=(
            "cacheopt: B, the tokens beyond its context a critical request starts on, its basic demand s_p + B "
            "(CacheOpt §3.3.2; §5: B = 8 tokens)."
        ),
    )
    default_tbt_ms: float = Field(
        READING_TBT_MS,
        gt=0,
        description=(
            "accelgen: the TBT SLO, ms, of a request that has none of its own nor from the slo section: "
            "AccelGen §4.3's 0.1875 s a token, the normal reading speed (a reader's pace: no hardware conversion)."
        ),
    )
    zeta: float = Field(
        0.9,
        gt=0,
        le=1,
        description=(
            "scls: ζ of SCLS eq. 9, the share of the KV pool a batch's slice may fill with the running batch's "
            "(the paper's 0.9, §5.1)."
        ),
    )
    cost_profile: str | None = Field(
        None,
        description=(
            "scls: cost profile JSON whose `scls` section holds the serving-time estimator's fitted p1–p4 and "
            "d1–d4 (SCLS eq. 3, eq. 4; `tetriserve profile` writes it). Default: this model's profile on this "
            "hardware ($TETRISERVE_HOME/profiles/<model>--<hardware>.json) when it has that section, else the "
            "tiny model's values on the 2-core CPU machine."
        ),
    )

    @model_validator(mode="after")
    def _params_of_the_policy(self) -> DecodeAdmission:
        own = {"policy", *ADMISSION_PARAMS[self.policy]}
        defaults = DecodeAdmission.model_fields
        foreign = sorted(n for n in self.model_fields_set - own if getattr(self, n) != defaults[n].default)
        if foreign:
            owners = {name: [p for p, names in ADMISSION_PARAMS.items() if name in names] for name in foreign}
            said = "; ".join(f"decode.admission.{n}: a parameter of {' and '.join(owners[n])}" for n in foreign)
            raise ValueError(f"{said}; the admission policy is {self.policy}")
        return self

    def policy_kwargs(self) -> dict[str, object]:
        """Constructor parameters of the configured policy (``length_end`` is their ``end``)."""
        return {"end" if n == "length_end" else n: getattr(self, n) for n in ADMISSION_PARAMS[self.policy]}


class DecodePreemption(BaseModel):
    """``decode.preemption``: which running request gives up its KV first, and how."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    order: Literal["vllm", "srtf", "lkvo", "cacheopt", "accelgen"] = Field(
        "vllm",
        description=(
            "Which running request is preempted first when KV runs out (CacheOpt §3.4): vllm (latest arrival), "
            "srtf (longest predicted remaining), lkvo (smallest KV), cacheopt (loosest TBT SLO, then longest "
            "remaining, then smallest KV, bucketed), accelgen (largest remaining time to the TBT SLO, so loosest "
            "TBT SLO first; AccelGen §4.4 Alg. 1)."
        ),
    )
    mode: Literal["recompute", "swap", "auto"] = Field(
        "recompute",
        description=(
            "How a victim gives up its KV (CacheOpt §3.5): recompute (vLLM's), swap (to a host buffer through "
            "the KV connector and back), auto (swap from the profiled sweet-spot length on)."
        ),
    )
    profile: str | None = Field(
        None,
        description="Swap/recompute latency profile JSON for mode auto (benchmarks/decode_policies.py writes one).",
    )


SCLS_SLICE_ITERS = 128  # SCLS §5.1: the slice length S


class DecodeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    admission: DecodeAdmission = Field(
        default_factory=DecodeAdmission,
        description="Which waiting requests a decode worker admits, and the chosen policy's parameters.",
    )
    preemption: DecodePreemption = Field(
        default_factory=DecodePreemption,
        description="Which running request gives up its KV first when KV runs out, and how.",
    )

    max_local_prompts: int = Field(
        2,
        ge=0,
        description=(
            "Prompts offloaded by prefill workers, backlogged (prefill.offload_wait_s) or short "
            "(prefill.offload_max_tokens), that this decode worker "
            "computes at once, each until its first token; 0 takes none."
        ),
    )
    slice_iters: int = Field(
        0,
        ge=0,
        description=(
            "SCLS slices (§4, §7): every S decode iterations a request reaches a slice boundary, where the "
            "cluster monitor's max-min rebalancing may move it, KV and all, to a less-loaded decode worker. "
            "0 turns slicing off on this worker (its requests stay). Unset, it is 0, or the paper's 128 (§5.1) "
            "under decode.admission.policy scls, whose batches are priced and fitted for a slice of S."
        ),
    )
    slice_lambda: float = Field(
        0.5, gt=0, le=1, description="SCLS eq. 12 λ: slice rebalancing rounds come every max(λ·least load, Γ) s."
    )
    slice_min_interval_iters: int = Field(
        128,
        ge=0,
        description=(
            "SCLS eq. 12 Γ, the least time between those rounds, in decode iterations: Γ is this many steps at "
            "the decode workers' median step time (their load reports'). The paper's Γ, 6 s on Hugging Face "
            "workers and 3 s on DeepSpeed ones, set by their inference speed (§5.1), is about one slice of its "
            "128 iterations on those engines (Fig. 11); 0: Γ is slice_min_interval_s."
        ),
    )
    slice_min_interval_s: float = Field(
        1.0,
        gt=0,
        description=(
            "SCLS eq. 12 Γ in seconds while no decode worker reports a step time (or slice_min_interval_iters is 0)."
        ),
    )

    @model_validator(mode="after")
    def _scls_slice_length(self) -> DecodeConfig:
        # SCLS §5.1: S = 128 where the scls admission policy runs and no slice length is given; left unset, so
        # a later switch to another policy finds slice_iters at its own default again
        if self.admission.policy == "scls" and "slice_iters" not in self.model_fields_set:
            object.__setattr__(self, "slice_iters", SCLS_SLICE_ITERS)
        return self


# decode keys the cluster monitor reads, not the workers: SCLS's rebalancing period (eq. 12 λ, Γ), set at start
# only; `tetriserve policy` neither shows nor sets them
DECODE_MONITOR_KEYS = ("slice_lambda", "slice_min_interval_iters", "slice_min_interval_s")

DEFAULT_MAX_REQUEST_BODY_MB = 32.0


class ClusterConfig(BaseModel):
    """Everything `tetriserve serve` needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: PresetName | None = Field(
        None,
        description=(
            "A paper's configuration (docs/policies/presets.md): tetriinfer, accelgen, sola, scls or cacheopt sets "
            "every policy and parameter the way that paper's evaluation does, and the mode it serves in; a setting "
            "given in the config file or on the command line wins over the preset's. `tetriserve serve --preset` "
            "with no name lists them."
        ),
    )
    mode: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description=(
            "disaggregated: prefill workers compute prompts and hand their KV to decode workers (TetriInfer). "
            "colocated: num_prefill + num_decode workers, each one engine that runs both phases, chunked prefill "
            "mixed into decode batches (the single-engine papers' setting: SOLA, AccelGen, SCLS, CacheOpt); the "
            "prefill section's queue order, chunking and predictor and the decode section's admission and "
            "preemption all apply to each of them. Roles do not flip in this mode (flip.policy must be off)."
        ),
    )
    num_prefill: int = Field(1, ge=1, description="Number of prefill workers.")
    num_decode: int = Field(1, ge=1, description="Number of decode workers.")
    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="The model, its dtype and context, and each engine's KV cache, threads and cores.",
    )
    prefill: PrefillConfig = Field(
        default_factory=PrefillConfig,
        description="The prefill workers' queue order, gate, chunking, dispatch and length predictor.",
    )
    decode: DecodeConfig = Field(
        default_factory=DecodeConfig,
        description="The decode workers' admission, preemption, SCLS slices and prompts computed locally.",
    )
    host: str = Field("127.0.0.1", description="Address the front doors bind to.")
    grpc_port: int = Field(50051, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    http_port: int = Field(8000, ge=0, le=65535, description="OpenAI-compatible HTTP port (0 picks a free one).")
    http_keepalive_s: float = Field(
        75.0,
        gt=0,
        description=(
            "Seconds an idle HTTP keep-alive connection stays open. Longer than clients' own pool timeouts (aiohttp "
            "and vLLM's benchmark client: 60 s), so the client closes an idle connection first and never sends a "
            "request down one the server is closing at that moment."
        ),
    )
    flip: FlipConfig = Field(
        default_factory=FlipConfig,
        description="When workers change role by themselves (flip policies) and what bounds flips and scaling.",
    )
    scale: ScaleConfig = Field(
        default_factory=ScaleConfig,
        description="How far the slo flip policy may add workers.",
    )
    slo: SloConfig = Field(
        default_factory=SloConfig,
        description="Latency objectives for the requests that name none, by class of request (prompt length).",
    )
    admission: AdmissionConfig = Field(
        default_factory=AdmissionConfig,
        description="Backpressure at each front door: what is admitted and what is refused with 429.",
    )
    security: SecurityConfig = Field(
        default_factory=SecurityConfig,
        description="API keys, per-key quotas and TLS of both front doors; the Ray dashboard's bind address.",
    )
    tracing: TracingConfig = Field(
        default_factory=TracingConfig,
        description="OpenTelemetry spans of each request across front door, placement, prefill, transfer, decode.",
    )
    request_trace: str | None = Field(
        None,
        description=(
            "A file each front door appends one JSON line to per request it served or refused: its arrival, "
            "prompt and output sizes, sampling, priority and SLOs, then its outcome, each delta's time, the workers "
            "that produced its tokens and its predicted length (observability/request_trace.py); a run's workload "
            "and outcomes, to study or replay. None: off."
        ),
    )
    drain_grace_s: float = Field(
        30.0,
        ge=0,
        description=(
            "On SIGTERM (or Ctrl-C) the front doors stop admitting (/ready answers 503, new requests 503 / "
            "UNAVAILABLE) and let admitted requests finish for up to this long before the service exits; a second "
            "signal cuts the wait short."
        ),
    )
    max_request_body_mb: float = Field(
        DEFAULT_MAX_REQUEST_BODY_MB,
        gt=0,
        description=(
            "Largest request body the front doors take, in MiB: HTTP answers a larger one with 413, gRPC with "
            "RESOURCE_EXHAUSTED (its message size limit)."
        ),
    )
    ray_address: str | None = Field(None, description="Ray cluster to join; None starts a local one.")
    namespace: str = Field("tetriserve", description="Ray namespace of the named actors.")
    report_interval_ms: int = Field(
        100,
        ge=10,
        description="How often a worker looks at its load and the monitor at the loads: a change goes out then.",
    )
    report_tolerance: float = Field(
        DEFAULT_REPORT_TOLERANCE,
        ge=0,
        lt=1,
        description=(
            "Deadband of load reports: a load quantity (queued and running requests, free KV blocks, tokens "
            "left, seconds of queued work) that moved by less than this share of its value since the last "
            "report is no change and goes out with the next heartbeat; 0 reports every move."
        ),
    )
    heartbeat_interval_ms: int = Field(
        1000,
        ge=10,
        description=(
            "An unchanged load is still reported, and the loads still broadcast, this often (the heartbeat). A "
            "worker is stale after three heartbeats (or 30 report periods, whichever is longer) without one."
        ),
    )
    transport: TransportConfig = Field(
        default_factory=TransportConfig,
        description="Which backend moves KV between workers (a bare backend name is accepted: `transport: shm`).",
    )
    kv_load_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute",
        description=(
            "What a decode engine does when a request's KV transfer fails or misses its deadline: recompute the "
            "prompt there (costs latency, not the request), or fail that attempt (the front door then migrates it)."
        ),
    )
    migration_limit: int = Field(
        3,
        ge=0,
        description=(
            "How many times one request may be re-placed or migrated after a worker failure before its stream ends "
            "with an 'unavailable' error."
        ),
    )
    supervise: bool = Field(True, description="Re-create workers, the GlobalScheduler and the monitor when they die.")
    dead_after_s: float = Field(
        10.0,
        gt=0,
        description=(
            "A worker whose heartbeats (load reports) stop for this long by the monitor's clock, or whose engine has "
            "work and has not stepped for this long, is killed and re-created."
        ),
    )
    stream_idle_timeout_s: float = Field(
        15.0,
        gt=0,
        description=(
            "A request that neither produces a token nor is listed by a live worker's heartbeat for this long is "
            "taken as lost and migrated (the stream's inactivity deadline)."
        ),
    )
    placement_timeout_s: float = Field(
        60.0,
        gt=0,
        description=(
            "How long a request waits for a serving worker (a prefill worker to be placed on; after its prefill, a "
            "decode worker to be handed to) while they are all down or restarting, before it ends 'unavailable'."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> ClusterConfig:
        if self.mode == "colocated" and self.flip.policy != "off":
            raise ValueError("flip.policy: a colocated worker has no other role to flip to; set it to off")
        if self.prefill.chunk_size < self.engine.block_size:
            raise ValueError("prefill.chunk_size must be >= engine.block_size")
        if self.heartbeat_interval_ms < self.report_interval_ms:
            raise ValueError("heartbeat_interval_ms must be >= report_interval_ms")
        if 3 * self.heartbeat_interval_ms >= 1000 * self.dead_after_s:
            raise ValueError("heartbeat_interval_ms must be under a third of dead_after_s (a live worker is not stale)")
        if self.transport.lease_s < self.placement_timeout_s + self.transport.timeout_s:
            raise ValueError(
                "transport.lease_s must be at least placement_timeout_s + transport.timeout_s: parked KV waits "
                "that long for a decode worker and its transfer"
            )
        return self

    @property
    def num_colocated(self) -> int:
        """Workers of the colocated mode: as many engines as the disaggregated mode's on the same cores."""
        return self.num_prefill + self.num_decode if self.mode == "colocated" else 0

    @property
    def prefix_block_size(self) -> int:
        """The block size prompts are hashed in for prefix placement (``control_plane/prefix_placement.py``): the
        engines' KV block size with ``prefill.placement: prefix``, else 0 (no hashes are sent)."""
        return self.engine.block_size if self.prefill.placement == "prefix" else 0

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Mapping[str, object] | None = None) -> ClusterConfig:
        """Read YAML (if given) and apply dotted overrides such as ``{"engine.max_model_len": 2048}``."""
        data: dict[str, object] = {}
        if path is not None:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
            if not isinstance(loaded, dict):
                raise ValueError(f"{path}: top level must be a mapping")
            data = loaded
        apply_dotted(data, overrides or {})
        renamed = renamed_in(data)
        if renamed:
            raise ValueError(f"{path or 'config'}: " + "; ".join(renamed))
        if data.get("preset") is not None:
            data = under_preset(data)
        return cls.model_validate(data)
