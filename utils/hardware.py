"""What the machine computes natively: read once where a setting depends on it (training's and the embedder's
bfloat16 autocast)."""

from __future__ import annotations

from pathlib import Path


def bf16_supported(device: str) -> bool:
    """Whether bfloat16 autocast runs natively on `device`: a CUDA device that supports it (cuda, cuda:N), or a CPU
    with AMX or AVX512-BF16. Elsewhere it is emulated, slower than float32."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags
