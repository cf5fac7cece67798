"""NCCL symmetric-memory windows: buffers NCCL's symmetric collective kernels run on (NCCL >= 2.27).

Tensors come from torch's symmetric memory with its NCCL backend (``symm_mem.set_backend("NCCL")``,
``empty``, ``rendezvous`` on the group): NCCL allocates them and registers them as symmetric windows of
the group's communicator, and a collective whose send and receive buffers both lie in such windows runs
NCCL's symmetric kernels (on 8×H100, all-gather 1.25–1.86× faster at 2–32 MiB than into ordinary
memory). Allocation is collective: every rank of the group asks for the same sizes in the same order.
The backend is one per process: where torch's symmetric memory already runs another one (CUDA, NVSHMEM),
``window_tensor`` refuses. Windows live as long as the process, one per group, slot and size (rounded up
to a power of two), so their number stays small.
"""

from __future__ import annotations

from typing import Any

#: The first NCCL release with symmetric-memory collectives.
MIN_NCCL = (2, 27, 0)

_WINDOWS: dict[tuple[str, str, int, int], Any] = {}


def unavailable_reason() -> str | None:
    """Why symmetric windows cannot be used in this process (None when they can)."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available() or torch.version.hip is not None:
        return "needs NVIDIA GPUs"
    if not dist.is_available() or not dist.is_nccl_available():
        return "torch without NCCL"
    version = tuple(torch.cuda.nccl.version())
    if version < MIN_NCCL:
        return f"NCCL {'.'.join(map(str, version))} has no symmetric windows (needs 2.27+)"
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError:
        return f"torch {torch.__version__} has no symmetric memory"
    if not hasattr(symm_mem, "set_backend"):
        return f"torch {torch.__version__}: symmetric memory without an NCCL backend"
    return None


def window_tensor(shape: tuple[int, ...], dtype: Any, group: Any, device: Any, slot: int = 0) -> Any:
    """A tensor of ``shape`` and ``dtype`` in an NCCL symmetric window of ``group`` (collective; ``slot``
    keeps apart buffers that must not overlap, e.g. a send and a receive buffer). Windows are reused
    across calls with the same group, device, slot and rounded size."""
    import math

    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    current = symm_mem.get_backend(device)
    if current != "NCCL":  # the default (CUDA) until set; set_backend fails once another one allocated
        try:
            symm_mem.set_backend("NCCL")
        except RuntimeError as exc:
            raise RuntimeError(
                f"symmetric memory in this process already runs the {current} backend; NCCL's windows need "
                f"the NCCL one ({exc})"
            ) from None
    name = (group or dist.group.WORLD).group_name
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    size = 1 << max(nbytes - 1, 4095).bit_length()  # a power of two, at least one 4 KiB page
    key = (name, str(device), slot, size)
    buffer = _WINDOWS.get(key)
    if buffer is None:
        buffer = symm_mem.empty(size, dtype=torch.uint8, device=device)
        symm_mem.rendezvous(buffer, name)
        _WINDOWS[key] = buffer
    return buffer[:nbytes].view(dtype).view(shape)


class SymmetricBspForm:
    """Mixin of the BSP forms on NCCL symmetric windows (``bsp_symm`` of each op): CUDA only, not the
    baseline but a BSP form, available where :func:`unavailable_reason` finds nothing missing."""

    name = "bsp_symm"
    device_types = frozenset({"cuda"})
    is_baseline = False
    bsp_form = True

    def unavailable_reason(self, target: Any) -> str | None:
        from ._symm_backend import conflict

        reason = super().unavailable_reason(target)  # type: ignore[misc]
        return reason or unavailable_reason() or conflict("nccl")
