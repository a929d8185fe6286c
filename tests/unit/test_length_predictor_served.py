"""The served predictors: trained (real MiniLM, random or committed heads), oracle, the batcher, the factory."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path

import pytest
import torch

from tests.fakes import tokenizer_dir, wait_until
from tetriserve.common.config import ClusterConfig
from tetriserve.common.length import LengthEstimate, PredictInput
from tetriserve.common.prefill_config import PrefillConfig
from tetriserve.length_predictor import artifact as art_io
from tetriserve.length_predictor.baseline import BucketQuantilePredictor
from tetriserve.length_predictor.batcher import CoalescingBatcher
from tetriserve.length_predictor.buckets import BucketSpec
from tetriserve.length_predictor.encoder import FEATURE_DIM, resolve_dtype
from tetriserve.length_predictor.factory import build_predictor
from tetriserve.length_predictor.heads import HeadsConfig, LengthHeads
from tetriserve.length_predictor.oracle import OraclePredictor
from tetriserve.length_predictor.padding import BucketWidths
from tetriserve.length_predictor.paths import default_artifact
from tetriserve.length_predictor.process import ProcessPredictor
from tetriserve.length_predictor.served import TrainedPredictor, plan_batches


def random_artifact(path: Path, granularity: int = 200) -> Path:
    torch.manual_seed(0)
    spec = BucketSpec(granularity)
    heads = LengthHeads(HeadsConfig(FEATURE_DIM, spec.num_buckets, hidden=16, reg_hidden=8))
    widths = BucketWidths((50.0,) * spec.num_buckets, (40.0,) * spec.num_buckets)
    meta = {"encoder": {"name": "test", "max_length": 64}}
    return art_io.save(art_io.Artifact(heads.eval(), spec, widths, meta=meta), path / f"heads-g{granularity}.json")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_artifact(tmp_path_factory.mktemp("art"))


@pytest.fixture(scope="module")
def predictor(artifact: Path) -> TrainedPredictor:
    p = TrainedPredictor(artifact, tokenizer_dir(), max_batch=4, pad_cutoff=16, encoder_dtype="float32")
    p.load()
    return p


def check(e: LengthEstimate, item: PredictInput) -> None:
    assert 0 <= e.lower <= e.estimate <= e.upper <= item.max_tokens + 1
    assert 0.0 <= e.confidence <= 1.0


def mixed_batch() -> list[PredictInput]:
    long_ids = tuple(range(4, 400)) * 15  # ~6000 ids: decoded tail only, then cut to 64 MiniLM tokens
    return [
        PredictInput(0, 128, ()),  # empty prompt
        PredictInput(3, 64, (5, 6, 7)),
        PredictInput(len(long_ids), 2048, long_ids),  # over-long: runs alone
        PredictInput(20, 0, tuple(range(10, 30))),  # max_tokens 0
        PredictInput(500, 256, ()),  # lengths only, no ids
        PredictInput(12, 4096, tuple(range(50, 62))),
    ]


def test_trained_predictor_answers_a_mixed_batch(predictor: TrainedPredictor) -> None:
    batch = mixed_batch()
    out = predictor.predict(batch)
    assert len(out) == len(batch)
    for e, item in zip(out, batch, strict=True):
        check(e, item)
        assert e.source == "trained-g200" and 0 <= e.bucket < 11
    assert predictor.predict([]) == []
    assert [e.estimate for e in predictor.predict(batch[:2])] == [e.estimate for e in out[:2]]  # batch-independent


def test_trained_predictor_pickles_without_models(predictor: TrainedPredictor) -> None:
    blob = pickle.dumps(predictor)
    assert len(blob) < 20_000  # paths and parameters only
    clone = pickle.loads(blob)
    assert clone._loaded is None
    assert clone.name == predictor.name and len(clone.predict(mixed_batch()[:2])) == 2


def test_concurrent_calls_all_answered(predictor: TrainedPredictor) -> None:
    batch = mixed_batch()
    results: dict[int, list[LengthEstimate]] = {}

    def call(i: int) -> None:
        results[i] = predictor.predict([batch[i % len(batch)]])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == list(range(12)) and all(len(r) == 1 for r in results.values())


def test_broken_encoder_falls_back_to_the_baseline(artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tetriserve.length_predictor import encoder

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("encoder weights missing")

    monkeypatch.setattr(encoder.Encoder, "load", boom)
    p = TrainedPredictor(artifact, None)
    out = p.predict(mixed_batch())
    assert [e.source for e in out] == ["bucket-quantile"] * 6


def test_the_instant_estimate_is_the_fallbacks_and_loads_no_model(artifact: Path) -> None:
    p = TrainedPredictor(artifact, None)
    p.observe(12, 40)
    item = PredictInput(12, 256, tuple(range(10, 22)))
    assert p.instant(item) == p.fallback.predict([item])[0]
    assert p._loaded is None  # no encoder was loaded for it


def test_missing_artifact_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TrainedPredictor(tmp_path / "nope.json")


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "want"),
    [(True, False, torch.bfloat16), (False, True, torch.bfloat16), (False, False, torch.float32)],
)
def test_auto_dtype_is_bfloat16_where_the_cpu_multiplies_it_in_hardware(
    monkeypatch: pytest.MonkeyPatch, amx: bool, avx512_bf16: bool, want: torch.dtype
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    assert resolve_dtype("auto") is want
    assert resolve_dtype("float32") is torch.float32  # an explicit dtype is taken as it is
    with pytest.raises(ValueError):
        resolve_dtype("int8")


def test_plan_batches_runs_long_prompts_alone() -> None:
    assert plan_batches([5, 300, 10, 200, 0], pad_cutoff=128, max_batch=2) == [[4, 0], [2], [1], [3]]
    assert plan_batches([], 128, 8) == []
    with pytest.raises(ValueError):
        plan_batches([1], 0, 8)


def test_committed_artifact_loads_and_predicts() -> None:
    path = default_artifact()
    if not path.is_file():
        pytest.skip("no committed heads yet")
    art = art_io.load(path)
    assert art.spec.granularity == 200 and len(art.widths.under) == art.spec.num_buckets
    meta = json.loads(path.read_text())
    assert "dir" not in meta["encoder"]  # never a fine-tuned encoder: its weights are not committed


# ---- the batcher -------------------------------------------------------------------------------------


def test_batcher_coalesces_waiting_calls() -> None:
    gate = threading.Event()
    seen: list[list[int]] = []

    def fn(items: list[int]) -> list[int]:
        seen.append(list(items))
        if len(seen) == 1:
            gate.wait(10)
        return [x * 10 for x in items]

    batcher: CoalescingBatcher[int, int] = CoalescingBatcher(fn, max_items=8)
    out: dict[str, list[int]] = {}
    first = threading.Thread(target=lambda: out.update(a=batcher([1])))
    first.start()
    wait_until(lambda: len(seen) == 1, what="leader inside fn")
    others = [
        threading.Thread(target=lambda k=k, v=v: out.update({k: batcher(v)})) for k, v in (("b", [2, 3]), ("c", [4]))
    ]
    for t in others:
        t.start()
    wait_until(lambda: len(batcher._pending) == 2, what="followers queued")
    gate.set()
    for t in (first, *others):
        t.join(10)
    assert out == {"a": [10], "b": [20, 30], "c": [40]}
    assert seen == [[1], [2, 3, 4]] and batcher.calls == 2


def test_batcher_raises_in_every_caller() -> None:
    def fn(items: list[int]) -> list[int]:
        raise RuntimeError("model broke")

    with pytest.raises(RuntimeError, match="model broke"):
        CoalescingBatcher(fn)([1, 2])


# ---- oracle ------------------------------------------------------------------------------------------


def test_oracle_reads_true_lengths_and_falls_back(tmp_path: Path) -> None:
    oracle = OraclePredictor.from_pairs([((1, 2, 3), 250), ((9,), 5000)], granularity=200)
    known, capped, unknown = oracle.predict(
        [PredictInput(3, 1000, (1, 2, 3)), PredictInput(1, 300, (9,)), PredictInput(2, 100, (4, 4))]
    )
    assert (known.lower, known.estimate, known.upper, known.bucket, known.confidence) == (250, 250, 251, 1, 1.0)
    assert (capped.estimate, capped.upper) == (300, 301)
    assert unknown.source == "bucket-quantile" and (oracle.hits, oracle.misses) == (2, 1)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir())
    workload = tmp_path / "w.jsonl"
    workload.write_text(
        json.dumps({"prompt": "hello world", "response_len": 42})
        + "\n"
        + json.dumps({"prompt_token_ids": [7, 8], "response_len": 3})
        + "\n"
    )
    oracle = OraclePredictor.from_jsonl(workload, tokenizer_dir())
    ids = tuple(tok.encode("hello world", add_special_tokens=True))
    assert [e.estimate for e in oracle.predict([PredictInput(len(ids), 100, ids), PredictInput(2, 100, (7, 8))])] == [
        42,
        3,
    ]
    assert pickle.loads(pickle.dumps(oracle)).lengths == oracle.lengths


# ---- selection (what the launcher calls) ---------------------------------------------------------------


def test_factory_selection(artifact: Path, tmp_path: Path) -> None:
    assert isinstance(build_predictor(PrefillConfig(predictor="baseline"), None), BucketQuantilePredictor)
    missing = str(tmp_path / "missing.json")
    assert isinstance(build_predictor(PrefillConfig(predictor_artifact=missing), None), BucketQuantilePredictor)
    with pytest.raises(FileNotFoundError):
        build_predictor(PrefillConfig(predictor="trained", predictor_artifact=missing), None)
    chosen = build_predictor(PrefillConfig(predictor_artifact=str(artifact), predictor_alpha=0.8), tokenizer_dir())
    assert isinstance(chosen, ProcessPredictor) and chosen.niceness == PrefillConfig().predictor_niceness
    trained = chosen.inner
    assert isinstance(trained, TrainedPredictor) and trained.padding_override is not None
    assert trained.padding_override.alpha == 0.8 and trained.encoder_dtype == "auto"
    config = PrefillConfig(predictor_artifact=str(artifact), predictor_process=False, predictor_dtype="float32")
    in_thread = build_predictor(config, None)
    assert isinstance(in_thread, TrainedPredictor) and in_thread.encoder_dtype == "float32"
    workload = tmp_path / "oracle.jsonl"
    workload.write_text(json.dumps({"prompt_token_ids": [1], "response_len": 9}) + "\n")
    oracle = build_predictor(PrefillConfig(predictor="oracle", predictor_workload=str(workload)), None)
    assert isinstance(oracle, OraclePredictor) and oracle.predict([PredictInput(1, 50, (1,))])[0].estimate == 9


def test_config_requires_a_workload_for_the_oracle() -> None:
    with pytest.raises(ValueError, match="predictor_workload"):
        PrefillConfig(predictor="oracle")
    cfg = ClusterConfig.load(overrides={"prefill.predictor": "baseline"})
    assert cfg.prefill.predictor == "baseline" and ClusterConfig().prefill.predictor == "auto"
