"""NCCL symmetric-memory windows: buffers NCCL's symmetric collective kernels run on (NCCL >= 2.27).

A buffer from NCCL's allocator (``ncclMemAlloc``, through the process group's ``mem_allocator``) is
registered on the group's communicator with ``ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)``;
a collective whose send and receive buffers both lie in such windows then runs NCCL's symmetric kernels
(on 8×H100, all-gather 1.25–1.86× faster at 2–32 MiB than into ordinary memory). Registration is
collective: every rank of the group registers the same sizes in the same order. Windows live as long as
the process (NCCL needs them registered while any collective may use them), one per group and size
(rounded up to a power of two), so the number of windows stays small.
"""

from __future__ import annotations

import ctypes
from typing import Any

#: ``ncclCommWindowRegister``'s flag for windows that symmetric collectives may use.
NCCL_WIN_COLL_SYMMETRIC = 0x01
#: The first NCCL release with symmetric-memory collectives.
MIN_NCCL = (2, 27, 0)

_WINDOWS: dict[tuple[int, str, int], Any] = {}


def unavailable_reason() -> str | None:
    """Why symmetric windows cannot be used in this process (None when they can)."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return "no torch"
    if not torch.cuda.is_available() or torch.version.hip is not None:
        return "needs NVIDIA GPUs"
    if not dist.is_available() or not dist.is_nccl_available():
        return "torch without NCCL"
    version = torch.cuda.nccl.version()
    if tuple(version) < MIN_NCCL:
        return f"NCCL {'.'.join(map(str, version))} has no symmetric windows (needs 2.27+)"
    from torch.distributed import ProcessGroupNCCL

    for attr in ("mem_allocator", "_comm_ptr"):
        if not hasattr(ProcessGroupNCCL, attr):
            return f"torch {torch.__version__}: ProcessGroupNCCL has no {attr}"
    try:
        _library()
    except OSError as exc:
        return f"libnccl: {exc}"
    return None


def _library() -> Any:
    lib = ctypes.CDLL("libnccl.so.2")  # the copy torch loaded (matched by its soname)
    lib.ncclCommWindowRegister.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
    ]  # fmt: skip
    lib.ncclCommWindowRegister.restype = ctypes.c_int
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    return lib


class Window:
    """``nbytes`` of device memory registered as a symmetric window of ``group``'s communicator."""

    def __init__(self, nbytes: int, group: Any, device: Any) -> None:
        import torch
        import torch.distributed as dist

        backend = (group or dist.group.WORLD)._get_backend(device)
        # the communicator exists once a collective ran on it
        dist.barrier(group=group, device_ids=[device.index] if device.index is not None else None)
        self.pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(self.pool):
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
        self.handle = ctypes.c_void_p()
        lib = _library()
        status = lib.ncclCommWindowRegister(
            ctypes.c_void_p(backend._comm_ptr()), ctypes.c_void_p(self.buffer.data_ptr()), nbytes,
            ctypes.byref(self.handle), NCCL_WIN_COLL_SYMMETRIC,
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"ncclCommWindowRegister: {lib.ncclGetErrorString(status).decode()}")


def window_tensor(shape: tuple[int, ...], dtype: Any, group: Any, device: Any, slot: int = 0) -> Any:
    """A tensor of ``shape`` and ``dtype`` in a symmetric window of ``group`` (collective; ``slot`` keeps
    apart buffers that must not overlap, e.g. a send and a receive buffer). Windows are reused across
    calls with the same group, device, slot and rounded size."""
    import math

    import torch

    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    size = 1 << max(nbytes - 1, 4095).bit_length()  # a power of two, at least one 4 KiB page
    key = (id(group), str(device), slot, size)
    window = _WINDOWS.get(key)
    if window is None:
        window = _WINDOWS[key] = Window(size, group, device)
    return window.buffer[:nbytes].view(dtype).view(shape)
