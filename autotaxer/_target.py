"""Describe the machine: normalized GPU model, arch, SM count, and software versions."""

from __future__ import annotations

import os
import platform
import re
from importlib import metadata

from ._problem import Target

CPU_MODEL = "cpu"


def normalize_gpu_name(name: str) -> str:
    """Slug of a device name: ``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")
    if not slug:
        raise ValueError(f"gpu name: cannot normalize {name!r}")
    return slug


def cpu_target() -> Target:
    """The CPU pseudo-target used by ``--device cpu`` (never served to GPUs)."""
    return Target(
        gpu_model=CPU_MODEL,
        arch=platform.machine() or "unknown",
        num_sms=os.cpu_count() or 1,
        device_type="cpu",
    )


def cuda_target(device_index: int = 0) -> Target:
    """The target of a visible CUDA/ROCm device."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    gcn = getattr(props, "gcnArchName", "") or ""
    if torch.version.hip is not None:
        arch = gcn.split(":")[0] or "gfx"
        name = props.name or "amd-gpu"
        if not name.lower().startswith("amd"):
            name = f"amd {name}"
    else:
        arch = f"sm_{props.major}{props.minor}"
        name = props.name
    return Target(
        gpu_model=normalize_gpu_name(name),
        arch=arch,
        num_sms=int(props.multi_processor_count),
        device_type="cuda",
    )


def visible_gpus() -> int:
    """GPUs torch can use in this process (0 without CUDA/ROCm)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def memory_per_rank(target: Target, world_size: int) -> int:
    """Bytes of memory one rank may use: the GPU's (one GPU per rank), or on CPU the machine's physical
    memory shared by the ranks."""
    if target.device_type == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total // max(world_size, 1)


def detect_target(device: str = "auto", world_size: int = 1) -> Target:
    """Pick the target for ``device`` in ``auto|cuda|cpu``; ``auto`` needs ``world_size`` visible GPUs."""
    if device == "cpu":
        return cpu_target()
    visible = visible_gpus()
    if device == "cuda":
        if visible < world_size:
            raise RuntimeError(
                f"--device cuda: world size {world_size} needs {world_size} GPUs, {visible} visible"
            )
        return cuda_target(0)
    if device != "auto":
        raise ValueError(f"device: expected auto, cuda or cpu, got {device!r}")
    return cuda_target(0) if visible >= max(world_size, 1) else cpu_target()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def software_versions() -> dict[str, str | None]:
    """Versions that a tuned record depends on (stored with every record)."""
    import torch

    from . import __version__

    driver = None
    if torch.cuda.is_available():
        driver = torch.version.cuda or torch.version.hip
    return {
        "autotaxer": __version__,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "iris": _version("tokenspeed-iris"),
        "cuda_or_hip": driver,
        "python": platform.python_version(),
    }


def sm_version(arch: str) -> int:
    """``90`` for ``sm_90``; 0 when ``arch`` is not an NVIDIA compute capability."""
    digits = arch[3:] if arch.startswith("sm_") else ""
    return int(digits) if digits.isdigit() else 0


def tma_unavailable(name: str, target: Target) -> str | None:
    """Why variant ``name``'s TMA loads cannot run on ``target`` (None on NVIDIA sm_90 or later)."""
    if target.is_amd or sm_version(target.arch) < 90:
        return f"{name}: TMA loads need an NVIDIA GPU of sm_90 or later (this is {target.arch})"
    return None
