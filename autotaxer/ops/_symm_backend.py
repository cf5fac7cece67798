"""The one backend torch's symmetric memory runs in this process, and which variants need which.

torch's fused ops (``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``: the
``torch_fused`` variants, and PyTorch's async TP) allocate through its ``CUDA`` backend; NCCL's
symmetric windows (the ``bsp_symm`` forms) through its ``NCCL`` backend. A process runs one: measured on
2xH200 with torch 2.11, torch's fused ops fail once NCCL's backend is set ("NCCLSymmetricMemoryAllocator::
alloc must not be called with a group_name"), and NCCL's windows fail once torch's ops have allocated
("Backend can not be changed after use"). So autotaxer chooses before either allocates:
``$AUTOTAXER_SYMM_MEM`` (``cuda``, the default: torch's fused ops and async TP work; ``nccl``: NCCL's
symmetric BSP forms), set by ``RuntimeConfig(symm_mem=...)`` and ``autotaxer tune --symm-mem``. The
variants that need the other backend are unavailable in the process, with this reason.
"""

from __future__ import annotations

import os

ENV = "AUTOTAXER_SYMM_MEM"
CHOICES: tuple[str, ...] = ("cuda", "nccl")
DEFAULT = "cuda"


def selected() -> str:
    """The backend chosen for this process (``$AUTOTAXER_SYMM_MEM``, default ``cuda``)."""
    value = os.environ.get(ENV, "").strip().lower() or DEFAULT
    if value not in CHOICES:
        raise ValueError(f"{ENV}: expected one of {', '.join(CHOICES)}, got {value!r}")
    return value


def select(backend: str) -> None:
    """Choose ``backend`` for this process and the processes it starts."""
    if backend not in CHOICES:
        raise ValueError(f"symm_mem: expected one of {', '.join(CHOICES)}, got {backend!r}")
    os.environ[ENV] = backend


def conflict(needs: str) -> str | None:
    """Why a variant that needs the ``needs`` backend cannot run in this process, or None."""
    chosen = selected()
    if chosen == needs:
        return None
    return (
        f"symmetric memory runs the {chosen} backend in this process ({ENV}={chosen}); this variant needs "
        f"{needs} (one backend a process: RuntimeConfig(symm_mem={needs!r}) or tune --symm-mem {needs})"
    )
