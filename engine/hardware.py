"""What engines run on: a short name for the accelerator (the key of a cost profile, common.cost_profile), and
whether its CPU multiplies bfloat16 in hardware."""

from __future__ import annotations

import os
from pathlib import Path


def detect_hardware() -> str:
    """``torch.cuda.get_device_name(0)`` on a GPU, else the CPU model and core count."""
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    model = "cpu"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model} x{os.cpu_count() or 1}-cores"


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AMX tiles or AVX512-BF16), as torch sees it."""
    import torch

    return any(
        getattr(torch.cpu, probe, lambda: False)() for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )
