"""What the KV connector is told to do with a request's KV (TetriInfer §3.3.4), as a typed instruction.

    prefill engine   KVInstruction(PARK, key)                  park the prompt's KV under ``key`` in this endpoint
    decode engine    KVInstruction(RECV, key, num_tokens=L)    the KV of the first L tokens arrives under ``key``

vLLM carries it from ``SamplingParams.extra_args["kv_transfer_params"]`` to
``Request.kv_transfer_params``, a dict: the instruction rides in it under
``PARAMS_KEY`` (engines are in the worker's process, so the object itself).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

KV_PARAMS_KEY = "kv_transfer_params"  # vLLM's extra_args key
PARAMS_KEY = "tetriserve"  # ours, inside vLLM's kv_transfer_params
INSTRUCTION_VERSION = 1


class KVMode(enum.StrEnum):
    PARK = "park"
    RECV = "recv"


@dataclass(frozen=True)
class KVInstruction:
    mode: KVMode
    key: str
    num_tokens: int = 0  # RECV: how many tokens' KV arrives (PARK: the prompt's, known to the engine)
    version: int = INSTRUCTION_VERSION

    def params(self) -> dict[str, object]:
        """vLLM's ``kv_transfer_params`` carrying this instruction."""
        return {PARAMS_KEY: self}


def instruction_of(kv_transfer_params: Mapping[str, object] | None) -> KVInstruction | None:
    value = (kv_transfer_params or {}).get(PARAMS_KEY)
    return value if isinstance(value, KVInstruction) else None
