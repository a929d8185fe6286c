"""`serve`'s config flags, made from the configuration models.

    --max-model-len 4096            one named flag per commonly set key: its type, choices, default and help
                                    are the field's own (``common/config.py`` and the section models)
    --set decode.slice_iters=128    any key at all, repeatable; the value is read as YAML (8, 0.5, true, a list)

Only the flag's name is written here. A flag overrides the config file; a flag not given leaves the file's
value (or the default) alone. ``--set`` of an unknown key is refused naming the closest keys, and of a renamed
key naming its new name; a string key takes the text after ``=`` as it is. Two flags read more than one value:
``--api-key`` is repeatable and takes comma lists (it replaces ``security.api_keys``; the keys file and
``$TETRISERVE_API_KEY`` are added to them), ``--preset`` without a name lists the presets, and a tracing
endpoint (``--otlp-endpoint`` or ``--set tracing.endpoint=...``) turns tracing on unless ``--no-tracing`` is
given.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable

import yaml

from tetriserve.client.credentials import API_KEY_ENV
from tetriserve.common.config import ClusterConfig
from tetriserve.common.config_keys import ConfigKey, key_at, value_type

LIST_PRESETS = object()  # ``--preset`` given without a name

# flag -> dotted config key
SERVE_FLAGS: dict[str, str] = {
    "--model": "engine.model",
    "--served-model-name": "engine.served_model_name",
    "--dtype": "engine.dtype",
    "--max-model-len": "engine.max_model_len",
    "--block-size": "engine.block_size",
    "--kv-cache-gb": "engine.kv_cache_gb",
    "--threads-per-engine": "engine.threads_per_engine",
    "--cpu-placement": "engine.cpu_placement",
    "--decode-niceness": "engine.cpu.decode_niceness",
    "--share-decode-cores": "engine.cpu.share_decode_cores",
    "--prefill-niceness": "engine.cpu.prefill_niceness",
    "--borrow-idle-cores": "engine.cpu.borrow_idle_cores",
    "--borrow-min-batch": "engine.cpu.borrow_min_batch",
    "--borrow-min-idle": "engine.cpu.borrow_min_idle_cores",
    "--reserve-decode-cores": "engine.cpu.reserve_decode_cores",
    "--stream-interval-ms": "engine.stream_interval_ms",
    "--enforce-eager": "engine.enforce_eager",
    "--preset": "preset",
    "--mode": "mode",
    "--num-prefill": "num_prefill",
    "--num-decode": "num_decode",
    "--chunk-size": "prefill.chunk_size",
    "--prefill-sched-batch": "prefill.sched_batch",
    "--offload-max-tokens": "prefill.offload_max_tokens",
    "--prefill-policy": "prefill.queue_policy",
    "--chunking": "prefill.chunking",
    "--chunk-selection": "prefill.chunk_selection",
    "--sola-tile-tokens": "prefill.sola_tile_tokens",
    "--sola-window-iters": "prefill.sola_window_iters",
    "--max-batch-tokens": "prefill.max_batch_tokens",
    "--cost-profile": "prefill.cost_profile",
    "--dispatch-policy": "prefill.dispatch_policy",
    "--predictor": "prefill.predictor",
    "--predictor-artifact": "prefill.predictor_artifact",
    "--predictor-dtype": "prefill.predictor_dtype",
    "--predictor-workload": "prefill.predictor_workload",
    "--admission-policy": "decode.admission.policy",
    "--preemption-order": "decode.preemption.order",
    "--preemption-mode": "decode.preemption.mode",
    "--preemption-profile": "decode.preemption.profile",
    "--slice-iters": "decode.slice_iters",
    "--slice-lambda": "decode.slice_lambda",
    "--slice-min-interval": "decode.slice_min_interval_s",
    "--slice-min-interval-iters": "decode.slice_min_interval_iters",
    "--host": "host",
    "--grpc-port": "grpc_port",
    "--http-port": "http_port",
    "--address": "ray_address",
    "--migration-limit": "migration_limit",
    "--transport": "transport.backend",
    "--emulate-gbps": "transport.emulate.gbps",
    "--emulate-latency-us": "transport.emulate.latency_us",
    "--kv-pipeline": "transport.pipeline",
    "--kv-pull": "transport.pull",
    "--kv-lease": "transport.lease_s",
    "--kv-sync-load-mib": "transport.sync_load_mib",
    "--kv-transfer-timeout": "transport.timeout_s",
    "--kv-load-failure-policy": "kv_load_failure_policy",
    "--flip-policy": "flip.policy",
    "--flip-interval": "flip.interval_s",
    "--flip-threshold": "flip.load_threshold",
    "--ttft-slo-ms": "flip.ttft_slo_ms",
    "--tpot-slo-ms": "flip.tpot_slo_ms",
    "--max-workers": "scale.max_workers",
    "--api-keys-file": "security.api_keys_file",
    "--key-rate": "security.rate_per_s",
    "--tls-cert": "security.tls_cert",
    "--tls-key": "security.tls_key",
    "--metrics-require-key": "security.metrics_require_key",
    "--dashboard-host": "security.dashboard_host",
    "--otlp-endpoint": "tracing.endpoint",
    "--otlp-protocol": "tracing.protocol",
    "--trace-sample-ratio": "tracing.sample_ratio",
    "--tracing": "tracing.enabled",
    "--request-trace": "request_trace",
}

# the ones a front door joining a running service takes (`tetriserve frontdoor`)
# (the dashboard is the Ray cluster's, which a joining front door does not start)
SECURITY_FLAGS = {
    flag: path
    for flag, path in SERVE_FLAGS.items()
    if path.startswith("security.") and path != "security.dashboard_host"
}


def flag_help(key: ConfigKey) -> str:
    """The field's description, then its default where it has one (``%`` escaped for argparse)."""
    text = " ".join((key.field.description or "").split())
    default = key.default
    if "default" in text.lower():  # the description says it already
        return text.replace("%", "%%")
    if default is not None and not isinstance(default, bool) and default != "":
        text += f" (default: {default})"
    elif isinstance(default, bool):
        text += f" (default: {'on' if default else 'off'})"
    return text.replace("%", "%%")


def add_flag(parser: argparse.ArgumentParser, flag: str, path: str) -> None:
    """``flag`` for the config key ``path``, typed and documented by the key's field."""
    key = key_at(ClusterConfig, path)
    typ = value_type(key.annotation)
    help_text, dest, metavar = flag_help(key), flag_dest(flag), flag[2:].upper().replace("-", "_")
    if typ is bool:
        parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    elif path == "preset":  # with no name: list the presets (``LIST_PRESETS``)
        choices = typing.get_args(typ)
        parser.add_argument(
            flag, dest=dest, nargs="?", const=LIST_PRESETS, type=_one_of(path, choices), choices=choices,
            default=None, help=help_text,
        )  # fmt: skip
    elif typing.get_origin(typ) is typing.Literal:
        choices = typing.get_args(typ)
        parser.add_argument(flag, dest=dest, type=_one_of(path, choices), choices=choices, default=None, help=help_text)
    elif typ in (int, float, str):
        parser.add_argument(flag, dest=dest, type=typ, default=None, metavar=metavar, help=help_text)
    else:
        raise TypeError(f"{flag}: config key {path} of type {typ} has no flag form; reach it with --set")


def _one_of(path: str, choices: tuple[str | int, ...]) -> Callable[[str], str | int]:
    """A flag's ``type`` that refuses a value outside ``choices`` (a ``Literal``'s values: the config's are
    strings) naming the config key it sets."""
    kind = type(choices[0])

    def convert(raw: str) -> str | int:
        try:
            value = kind(raw)
        except ValueError:
            value = raw
        if value not in choices:
            raise argparse.ArgumentTypeError(f"{path} is one of {', '.join(map(str, choices))}; got {raw!r}")
        return value

    convert.__name__ = kind.__name__
    return convert


def flag_dest(flag: str) -> str:
    return "cfg_" + flag[2:].replace("-", "_")


def add_config_flags(
    parser: argparse.ArgumentParser, flags: dict[str, str] = SERVE_FLAGS, set_any: bool = True
) -> None:
    """A flag for each of ``flags``, ``--api-key``, and (``set_any``) ``--set KEY=VALUE``."""
    for flag, path in flags.items():
        add_flag(parser, flag, path)
    parser.add_argument(
        "--api-key",
        dest="cfg_api_key",
        action="append",
        default=None,
        metavar="KEY",
        help=f"API key clients must send (repeatable, or a comma list; also ${API_KEY_ENV}); none: open doors",
    )
    if set_any:
        parser.add_argument(
            "--set",
            dest="cfg_set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="any config key, e.g. --set prefill.offload_wait_s=0.5 (repeatable; the value is read as "
            "YAML; docs/reference/configuration.md lists the keys)",
        )


def parse_set(item: str) -> tuple[str, object]:
    """``"a.b=VALUE"`` -> ``("a.b", value read as YAML)``; ``ValueError`` for a malformed item or unknown key."""
    path, sep, raw = item.partition("=")
    path = path.strip()
    if not sep or not path:
        raise ValueError(f"--set {item!r}: expected KEY=VALUE, e.g. --set engine.max_model_len=4096")
    try:
        key = key_at(ClusterConfig, path)
    except KeyError as exc:
        raise ValueError(f"--set {item!r}: {exc.args[0]}") from None
    if value_type(key.annotation) is str:  # a name, a path, an address: the text as written, not YAML's reading
        return path, raw.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ValueError(f"--set {item!r}: the value is not YAML ({exc})") from None
    return path, value


def config_overrides(args: argparse.Namespace, flags: dict[str, str] = SERVE_FLAGS) -> dict[str, object]:
    """The dotted overrides the flags given on the command line make (``--set`` last, so it wins)."""
    overrides: dict[str, object] = {}
    for flag, path in flags.items():
        value = getattr(args, flag_dest(flag), None)
        if value is not None and value is not LIST_PRESETS:
            overrides[path] = value
    if getattr(args, "cfg_api_key", None):
        overrides["security.api_keys"] = [k.strip() for arg in args.cfg_api_key for k in arg.split(",") if k.strip()]
    for item in getattr(args, "cfg_set", None) or []:
        path, value = parse_set(item)
        overrides[path] = value
    if overrides.get("tracing.endpoint") is not None:
        overrides.setdefault("tracing.enabled", True)
    return overrides
