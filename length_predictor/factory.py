"""Which predictor a prefill worker gets (``prefill.predictor``), decided once by the launcher.

    auto     ─▶ trained, when the artifact JSON + safetensors exist and the encoder package imports;
                else baseline (logged, with the reason)
    trained  ─▶ TrainedPredictor; a missing artifact or encoder package is a configuration error;
                in a process of its own beside each worker (``process.py``) unless ``predictor_process`` is off
    baseline ─▶ BucketQuantilePredictor (prompt-length quantiles, learns online)
    oracle   ─▶ OraclePredictor over ``predictor_workload``, baseline for prompts it does not know

The target model's directory doubles as the tokenizer the trained predictor decodes
prompt ids with. Every predictor returned is picklable (Ray ships it to the worker).
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from tetriserve.common.length import LengthPredictor
from tetriserve.common.prefill_config import PrefillConfig
from tetriserve.length_predictor.artifact import weights_path
from tetriserve.length_predictor.baseline import BucketQuantilePredictor
from tetriserve.length_predictor.encoder import ENCODER_PACKAGE
from tetriserve.length_predictor.padding import PaddingParams
from tetriserve.length_predictor.paths import default_artifact

logger = logging.getLogger(__name__)


def artifact_for(config: PrefillConfig) -> Path:
    return Path(config.predictor_artifact).expanduser() if config.predictor_artifact else default_artifact()


def trained_unavailable(artifact: Path) -> str | None:
    """Why the trained predictor cannot run here, or None when it can."""
    if not artifact.is_file() or not weights_path(artifact).is_file():
        return f"no trained heads at {artifact} (run `tetriserve predictor train` and `export`)"
    if importlib.util.find_spec(ENCODER_PACKAGE.replace("-", "_")) is None:
        return f"the encoder package {ENCODER_PACKAGE} is not installed"
    return None


def _padding(config: PrefillConfig) -> PaddingParams | None:
    if config.predictor_alpha is None and config.predictor_beta is None:
        return None
    defaults = PaddingParams()
    return PaddingParams(
        alpha=config.predictor_alpha if config.predictor_alpha is not None else defaults.alpha,
        beta=config.predictor_beta if config.predictor_beta is not None else defaults.beta,
    )


def build_predictor(config: PrefillConfig, model_path: str | None) -> LengthPredictor:
    """The predictor ``config.predictor`` asks for; ``model_path`` is the target model (its tokenizer)."""
    kind = config.predictor
    if kind == "baseline":
        return BucketQuantilePredictor()
    if kind == "oracle":
        from tetriserve.length_predictor.oracle import OraclePredictor

        if not config.predictor_workload:
            raise ValueError("prefill.predictor_workload is required when prefill.predictor is 'oracle'")
        return OraclePredictor.from_jsonl(config.predictor_workload, model_path)
    artifact = artifact_for(config)
    reason = trained_unavailable(artifact)
    if reason is not None:
        if kind == "trained":
            raise FileNotFoundError(f"prefill.predictor=trained: {reason}")
        logger.warning("length predictor: baseline, because %s", reason)
        return BucketQuantilePredictor()
    from tetriserve.length_predictor.served import TrainedPredictor

    predictor = TrainedPredictor(artifact, model_path, padding=_padding(config), encoder_dtype=config.predictor_dtype)
    logger.info("length predictor: %s from %s", predictor.name, artifact)
    if config.predictor_process:
        from tetriserve.length_predictor.process import ProcessPredictor

        return ProcessPredictor(predictor, config.predictor_niceness)
    return predictor
