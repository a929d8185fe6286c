"""The keys of the cluster config as data: every field by its dotted path, and the keys that were renamed.

The CLI makes `serve`'s flags from these fields (type, default, description), `--set` reaches any of them, and
the configuration reference is generated from them, so a key is defined once, in its pydantic model.

A key that moved keeps an entry in ``RENAMED``; a config file (or ``--set``) that still uses it is refused with
a message naming the key to write instead, rather than the bare "extra inputs are not permitted".
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# old dotted key -> the key that holds its value now
RENAMED: dict[str, str] = {
    "kv_transfer_timeout_s": "transport.timeout_s",
    "slice_lambda": "decode.slice_lambda",
    "slice_min_interval_s": "decode.slice_min_interval_s",
    "engine.reserve_decode_cores": "engine.cpu.reserve_decode_cores",
    "engine.share_decode_cores": "engine.cpu.share_decode_cores",
    "engine.decode_niceness": "engine.cpu.decode_niceness",
    "engine.prefill_niceness": "engine.cpu.prefill_niceness",
    "engine.borrow_idle_cores": "engine.cpu.borrow_idle_cores",
    "engine.borrow_min_batch": "engine.cpu.borrow_min_batch",
    "engine.borrow_min_idle_cores": "engine.cpu.borrow_min_idle_cores",
    "decode.admission_policy": "decode.admission.policy",
    "decode.cacheopt_reserve_blocks": "decode.admission.reserve_blocks",
    "decode.cacheopt_proactive_tokens": "decode.admission.proactive_iters",
    "decode.admission.proactive_tokens": "decode.admission.proactive_iters",
    "decode.cacheopt_buffer_tokens": "decode.admission.buffer_tokens",
    "decode.preemption_order": "decode.preemption.order",
    "decode.preemption_mode": "decode.preemption.mode",
    "decode.preemption_profile": "decode.preemption.profile",
}


@dataclass(frozen=True)
class ConfigKey:
    """One leaf field of the config: ``path`` is its dotted key (``engine.max_model_len``)."""

    path: str
    field: FieldInfo

    @property
    def annotation(self) -> object:
        return self.field.annotation

    @property
    def default(self) -> object:
        """The field's default (None where it is required or made by a factory)."""
        if self.field.default_factory is not None or self.field.default is PydanticUndefined:
            return None
        return self.field.default


def section_model(field: FieldInfo) -> type[BaseModel] | None:
    """The model a section field holds (``engine: EngineConfig``, ``emulate: LinkEmulation | None``), if any."""
    for candidate in (field.annotation, *typing.get_args(field.annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def holds_section(field: FieldInfo) -> bool:
    """A field whose value is a section of keys (``engine``, ``transport.emulate``), not a list of entries."""
    return isinstance(value_type(field.annotation), type) and section_model(field) is not None


def sections(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, type[BaseModel]]]:
    """``(dotted path, model)`` of ``model`` and of every model below it, depth first ("" is the top); a list's
    entries (``security.api_keys``) count as a model of their own."""
    yield prefix, model
    for name, field in model.model_fields.items():
        sub = section_model(field)
        if sub is not None:
            yield from sections(sub, f"{prefix}.{name}" if prefix else name)


def leaf_keys(model: type[BaseModel], prefix: str = "") -> Iterator[ConfigKey]:
    """Every field below ``model`` that holds a value rather than a section."""
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        sub = section_model(field)
        if sub is not None and holds_section(field):
            yield from leaf_keys(sub, path)
        else:
            yield ConfigKey(path, field)


def key_at(model: type[BaseModel], path: str) -> ConfigKey:
    """The leaf field at ``path``; ``KeyError`` (naming a renamed key's new name, or the closest keys) if none."""
    for key in leaf_keys(model):
        if key.path == path:
            return key
    raise KeyError(unknown_key_message(model, path))


def unknown_key_message(model: type[BaseModel], path: str) -> str:
    if path in RENAMED:
        return _renamed(path)
    close = difflib.get_close_matches(path, [k.path for k in leaf_keys(model)], n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown config key {path}{hint}"


def renamed_in(data: Mapping[str, object]) -> list[str]:
    """The messages for every renamed key that ``data`` (a config file's mapping) still uses."""
    found = []
    for old in RENAMED:
        node: object = data
        for part in old.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            found.append(_renamed(old))
    return found


def _renamed(old: str) -> str:
    return f"config key {old} is now {RENAMED[old]}: write that instead"


def value_type(annotation: object) -> Any:
    """The annotation without ``| None`` (``float | None`` -> ``float``). Its callers use what it gives as a
    type (an argparse ``type=``, a class to compare), which a type annotation's object is only at run time."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation
