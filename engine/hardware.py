"""A short name for the accelerator engines run on: the key of a cost profile (common.cost_profile)."""

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
