"""``engine.dtype: auto`` on CPUs with and without bfloat16 matrix instructions (``engine.settings.engine_dtype``)."""

from __future__ import annotations

import pytest
import torch

from tetriserve.engine.settings import engine_dtype


def _cpu(monkeypatch: pytest.MonkeyPatch, *, cuda: bool = False, amx: bool = False, avx512_bf16: bool = False) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)


def test_auto_is_float32_on_a_cpu_that_emulates_bfloat16(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu(monkeypatch)
    assert engine_dtype("auto") == "float32"


@pytest.mark.parametrize(("amx", "avx512_bf16"), [(True, False), (False, True)])
def test_auto_stays_vllms_where_the_cpu_multiplies_bfloat16(
    monkeypatch: pytest.MonkeyPatch, amx: bool, avx512_bf16: bool
) -> None:
    _cpu(monkeypatch, amx=amx, avx512_bf16=avx512_bf16)
    assert engine_dtype("auto") == "auto"


def test_auto_stays_vllms_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu(monkeypatch, cuda=True)
    assert engine_dtype("auto") == "auto"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_an_explicit_dtype_is_taken_as_it_is(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    _cpu(monkeypatch)
    assert engine_dtype(dtype) == dtype
