"""The symmetric heap of ranks emulated in one process: what the ops' emulated checks (``_emulated.py``
of an op's folder, :class:`._forms.EmulatedForm`) lay their kernels' buffers out in, one byte buffer per
rank, each rank's views at the same offsets as its peers' (as Iris's heap). Run by
:mod:`autotaxer.tools.emulated_ranks`."""

from __future__ import annotations

from typing import Any

#: Alignment of every buffer carved from an emulated heap (bytes).
ALIGN = 256


class EmulatedHeap:
    """``world_size`` byte buffers on ``device``; :meth:`alloc` carves one view per rank at one offset."""

    def __init__(self, world_size: int, nbytes: int, device: Any = "cpu") -> None:
        import torch

        self.bufs = [torch.zeros(nbytes, dtype=torch.uint8, device=device) for _ in range(world_size)]
        self.off = 0
        self.bases = torch.tensor([b.data_ptr() for b in self.bufs], dtype=torch.int64, device=device)

    def alloc(self, shape: tuple[int, ...], dtype: Any) -> list[Any]:
        """One ``shape`` view of ``dtype`` per rank, at the same offset of every rank's buffer."""
        import torch

        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        o, self.off = self.off, -(-(self.off + n) // ALIGN) * ALIGN
        if self.off > self.bufs[0].numel():
            raise ValueError(f"heap: {self.off} bytes needed, {self.bufs[0].numel()} emulated")
        return [b[o : o + n].view(dtype).view(shape) for b in self.bufs]


def aligned_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    import torch

    return -(-torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() // ALIGN) * ALIGN


def inbox_heap(world_size: int, box: tuple[int, ...], dtype: Any, n_flags: int, device: Any) -> tuple:
    """A heap of just one inbox of shape ``box`` (``dtype``) and ``n_flags`` int32 flags per rank, as the
    fused kernels' workspaces lay them out: ``(heap, inboxes, flags)``, one view per rank of each."""
    import torch

    nbytes = aligned_bytes(box, dtype) + aligned_bytes((n_flags,), torch.int32)
    heap = EmulatedHeap(world_size, nbytes, device)
    return heap, heap.alloc(box, dtype), heap.alloc((n_flags,), torch.int32)


def emulated_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in fp32 (``inf`` where it is NaN: NaN never passes)."""
    err = ((out.float() - ref).norm() / ref.norm()).item()
    return float("inf") if err != err else err  # NaN never passes


def emulated_tolerance(dtype: Any) -> float:
    """The largest relative error an emulated check of ``dtype`` accepts."""
    import torch

    return {torch.float32: 1e-5, torch.float16: 2e-3}.get(dtype, 1e-2)
