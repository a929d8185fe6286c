"""The ``prefill`` section of the cluster config (TetriInfer §3.3): chunked prefill, the prefill queue and
PrefillSchedBatch, the decode dispatcher and the length predictor. ``common/config.py`` re-exports it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PrefillConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    chunk_size: int = Field(
        512, ge=16, description="TetriInfer ChunkSize: tokens per prefill iteration (max_num_batched_tokens)."
    )
    queue_policy: Literal["fcfs", "sjf", "ljf", "accelgen", "sola"] = Field(
        "fcfs",
        description=(
            "Prefill queue order: fcfs | sjf | ljf (TetriInfer §3.3.1), accelgen (remaining time to the SLO, "
            "AccelGen §4.3) or sola (predicted TTFT, SOLA §4.4.2; accelgen and sola need a cost profile)."
        ),
    )
    sched_batch: int = Field(
        16, ge=1, description="PrefillSchedBatch: requests moved from raw to scheduled queue at once."
    )
    chunking: Literal["fixed", "none", "dynamic", "sola"] = Field(
        "fixed",
        description=(
            "fixed: chunk_size tokens per iteration (TetriInfer §3.3.3); none: whole prompts; dynamic: "
            "S_b = S_pf·SLO_min/T̄_pf with Exclusive Request Allocation (AccelGen §4.2; needs a cost profile); "
            "sola: each iteration optimises TTFT subject to TPOT or the other way round (SOLA §4.4.1, Table 2) "
            "and sizes its prompt work by k_i (eq. 1) or n_i (eq. 2) (SOLA §4.4.3; needs a cost profile)."
        ),
    )
    sola_tile_tokens: int | None = Field(
        None,
        ge=1,
        description=(
            "SOLA §4.4.3's tile size: k_i is a multiple of it. SOLA's value is 128 on A100 GPUs; default: the tile "
            "`tetriserve profile` measured on this hardware (the largest power-of-two forward size S whose 1.5·S "
            "takes as long as 2·S), else 128."
        ),
    )
    sola_window_iters: int = Field(
        8,
        ge=1,
        description=(
            "SOLA §4.4.2's sliding window: the switch between optimising TTFT and TPOT compares p^TTFT and "
            "p^TPOT averaged over this many iterations. SOLA gives no length; 8 iterations is a few decode "
            "steps of a running batch."
        ),
    )
    chunk_selection: Literal["in-order", "multi-resource"] = Field(
        "in-order", description="Dynamic chunking's selection: in queue order, or AccelGen Alg. 2 (compute + KV)."
    )
    accelgen_group_window_iters: float = Field(
        4.0,
        ge=0,
        description=(
            "AccelGen Alg. 2's γ with chunk_selection multi-resource: the requests within γ of the first one's "
            "remaining time form one selection group. In iterations of T_max (the profiled pivot iteration time, "
            "corrected online): AccelGen §6.1's γ = 0.75 s is four iterations of at most 0.1875 s, the TBT SLO "
            "its iterations are sized to."
        ),
    )
    accelgen_long_prompt_tokens: int | None = Field(
        4096,
        ge=1,
        description=(
            "Exclusive Request Allocation with chunking dynamic (AccelGen §4.2): a prompt longer than this does "
            "not start while another is in progress. AccelGen's long prompts are those of 4K tokens and more "
            "(§1, §3.2); a token count, it needs no conversion. None: the profiled pivot S_pf."
        ),
    )
    accelgen_preempt_max_iters: float = Field(
        1.0,
        ge=0,
        description=(
            "AccelGen §4.3's P_max for the JCT SLO path of queue_policy accelgen: the longest preemption after a "
            "token generation, in iterations of T_max (a recomputed request comes back in its next iteration)."
        ),
    )
    accelgen_preempt_probability: float = Field(
        0.0,
        ge=0,
        le=1,
        description=(
            "AccelGen §4.3's P: the probability that a request is preempted after a token generation, which "
            "with P_max prices preemptions into a JCT request's remaining time. The paper gives no value; 0 "
            "leaves them out (a prefill engine runs each request to its first token)."
        ),
    )
    max_batch_tokens: int | None = Field(
        None,
        ge=16,
        description=(
            "The prefill engine's ceiling on tokens per iteration (vLLM max_num_batched_tokens); policies set the "
            "budget below it each iteration. Default: max(chunk_size, engine.max_model_len)."
        ),
    )
    cost_profile: str | None = Field(
        None,
        description=(
            "Cost profile JSON from `tetriserve profile`; default: $TETRISERVE_HOME/profiles/<model>--<hardware>.json "
            "when it exists."
        ),
    )
    cost_alpha: float = Field(0.2, gt=0, le=1, description="SOLA eq. 5 alpha: weight of the newest iteration in γ.")
    placement: Literal["prefix", "least-load"] = Field(
        "prefix",
        description=(
            "How the GlobalScheduler picks a prompt's prefill worker among those with room: prefix (the least "
            "loaded, unless another is expected to hold a longer prefix of the prompt in its cache and the compute "
            "that saves outweighs its longer queue; control_plane/prefix_placement.py) or least-load (the fewest "
            "prompts placed and not past prefill, then the fewest reported queued tokens, then running requests)."
        ),
    )
    dispatch_policy: Literal["power-of-two", "random", "round-robin", "least-loaded", "imbalance", "max-min"] = Field(
        "power-of-two",
        description=(
            "How the dispatcher chooses a decode worker: power-of-two (TetriInfer §3.3.4), random, round-robin, "
            "least-loaded, imbalance (heavy decodes always to the same workers; TetriInfer Fig. 19's worst case), "
            "max-min (least predicted remaining work, SCLS §4.5)."
        ),
    )
    offload_wait_s: float = Field(
        1.0,
        ge=0,
        description=(
            "Prompts offloaded to decode workers (conditional disaggregation): while the prompts queued on a "
            "prefill worker would take longer than this to prefill there (the queue priced at its engine's own "
            "pace), it hands the next one in line to a decode worker with room for it (decode.max_local_prompts), "
            "which computes the prompt itself and decodes on. 0: never; every prompt is prefilled on a prefill worker."
        ),
    )
    offload_max_tokens: int = Field(
        512,
        ge=0,
        description=(
            "Short prompts offloaded to decode workers (conditional disaggregation): a prompt of at most this many "
            "tokens (a migrated request's output included) goes at once to a decode worker with room for it "
            "(decode.max_local_prompts), which computes it in its next step instead of waiting for the prefill "
            "engine and the KV handoff; with no room it queues here. Default: one chunk of the default chunk_size. "
            "0: only a backlog offloads (offload_wait_s)."
        ),
    )
    heavy_threshold_tokens: int = Field(
        128, ge=1, description="A request predicted to generate at least this many tokens is a heavy decode."
    )
    predictor: Literal["auto", "trained", "baseline", "oracle"] = Field(
        "auto",
        description=(
            "Output-length predictor: trained (MiniLM + committed heads), baseline (prompt-length quantiles), "
            "oracle (true lengths from predictor_workload), auto (trained when its artifact exists, else baseline)."
        ),
    )
    predictor_wait_ms: float = Field(
        0,
        ge=0,
        description=(
            "How long a request whose first token is out may wait for its length prediction while the predictor "
            "is computing it. Past that it is handed to a decode worker with the predictor's instant estimate (the "
            "baseline's) and the prediction follows it there when done; one not yet started is dropped. "
            "0: the handoff never waits (the worker's stats count predictions on time, late and refined)."
        ),
    )
    predictor_queue_wait_ms: float = Field(
        0,
        ge=0,
        description=(
            "How long a request may wait for its length prediction before it queues for its prefill (on a prefill "
            "or a colocated worker), so that the queue's order (AccelGen's remaining time to a JCT SLO) starts from "
            "the prediction rather than the instant estimate; past that it queues on the instant estimate and the "
            "prediction replaces it when done. The wait adds to the request's TTFT "
            "(benchmarks/results/predictor_queue_wait.md measures how much). 0: every request queues at once."
        ),
    )
    predictor_niceness: int = Field(
        10,
        ge=0,
        le=19,
        description=(
            "Linux niceness of the length predictor (its process, or its thread with predictor_process off). "
            "Predictions run on the engines' cores; at this niceness they take what the engines leave, and a "
            "prediction not ready in time is "
            "replaced by the instant estimate (predictor_wait_ms), so a busy machine sheds predictions, not "
            "prefills or decode steps (0: equal share)."
        ),
    )
    predictor_process: bool = Field(
        True,
        description=(
            "Run the trained length predictor in a process of its own beside each worker (own interpreter lock, "
            "predictor_niceness for the whole process), so its model does not slow the engine's steps and the "
            "worker's event loop while a prompt is prefilled. False: a thread of the worker's process."
        ),
    )
    predictor_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description=(
            "The trained predictor's encoder dtype: auto is bfloat16 on a GPU or a CPU that multiplies bfloat16 "
            "in hardware (AMX, AVX512-BF16), float32 elsewhere."
        ),
    )
    predictor_artifact: str | None = Field(
        None, description="Trained heads' JSON (default: length_predictor/artifacts/heads-g200.json)."
    )
    predictor_workload: str | None = Field(
        None, description="Oracle predictor's JSONL of prompt (token ids or text) and response_len."
    )
    predictor_alpha: float | None = Field(
        None, gt=0, lt=1, description="CacheOpt eq. 4 alpha: confidence at zero load (default: the artifact's)."
    )
    predictor_beta: float | None = Field(
        None, gt=0, description="CacheOpt eq. 4 beta: confidence sensitivity to the arrival rate, s/request."
    )

    @model_validator(mode="after")
    def _check_predictor(self) -> PrefillConfig:
        if self.predictor == "oracle" and not self.predictor_workload:
            raise ValueError("prefill.predictor_workload is required when prefill.predictor is 'oracle'")
        if self.max_batch_tokens is not None and self.max_batch_tokens < self.chunk_size:
            raise ValueError("prefill.max_batch_tokens must be >= prefill.chunk_size")
        return self

    def batch_ceiling(self, max_model_len: int) -> int:
        return self.max_batch_tokens or max(self.chunk_size, max_model_len)
