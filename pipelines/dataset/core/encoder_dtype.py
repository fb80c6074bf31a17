"""What the word encoder runs in: `--encoder-dtype auto` resolved on `--encoder-device`.

Kept apart from beam/embeddings.py (Beam's RunInference, torch): every build and update resolves the
dtype before anything else, and on a machine without a GPU driver that takes no torch import.
"""

from __future__ import annotations

import logging
import os

DTYPES = ("float32", "bfloat16")  # what the encoder runs in; `auto` resolves to one of them
CPUINFO = "/proc/cpuinfo"
# Present where an NVIDIA (CUDA) or AMD (ROCm, which torch also reports as CUDA) driver is loaded.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")

LOG = logging.getLogger("maskstream.embeddings")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty where it cannot be read)."""
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def gpu_driver_present() -> bool:
    """Whether a GPU driver is loaded: without one `torch.cuda.is_available()` is False."""
    return any(os.path.exists(path) for path in GPU_DRIVER_PATHS)


def resolve_encoder_dtype(device: str, requested: str) -> str:
    """`float32` or `bfloat16` for `--encoder-dtype` on `--encoder-device`. `auto` is bfloat16
    where the device computes it natively (CUDA: `torch.cuda.is_bf16_supported` without
    emulation; CPU: the avx512_bf16 or amx_bf16 flag), else float32. Resolved where the
    command runs: with a remote runner whose workers differ, pass the dtype explicitly."""
    if requested in DTYPES:
        return requested
    if requested != "auto":
        raise ValueError(f"--encoder-dtype must be auto or one of {DTYPES}, got {requested!r}")
    if device in ("auto", "cpu") and (device == "cpu" or not gpu_driver_present()):
        kind = "cpu"  # decided without importing torch (seconds of every command's start)
    else:
        # heavy: torch and transformers load only when a model is needed (--help stays fast)
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            kind = torch.device(device).type
        except RuntimeError as e:
            raise ValueError(f"--encoder-device {device!r}: {e}") from e
    native = False
    if kind == "cuda":
        # heavy: torch and transformers load only when a model is needed (--help stays fast)
        import torch

        if torch.cuda.is_available():  # else the encoder fails to load, with a clearer message
            with torch.cuda.device(torch.device(device)):  # is_bf16_supported asks the current device
                native = torch.cuda.is_bf16_supported(including_emulation=False)
    elif kind == "cpu":
        native = bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    if not native:
        LOG.info("--encoder-dtype auto: %s has no native bfloat16, so the encoder runs in float32 "
                 "(what bfloat16 gains where native: docs/building.md)", kind)
    return "bfloat16" if native else "float32"
