"""Two ranks of ``push_ws`` on one GPU, for tests and benchmarks of its protocol without a second GPU.

The symmetric heap is emulated as the interpreter tests do it: one byte buffer per rank holding the
inbox and the flags at the same offsets, and ``heap_bases`` = the two buffers' addresses, so ``push``'s
producers of rank 1 translate their stores and flag releases into rank 0's buffer exactly as they would
into a peer's mapping. Rank 0's consumer runs on this stream while rank 1's producers run on a side
stream (optionally after a delay, so the consumer provably waits for them). Only rank 0's output is
computed (with ``comm_sms=0``, where each rank's kernel moves its own shard, both ranks' kernels run at
once on half of the SMs each, and both outputs are computed); each call can draw fresh shards, so the
parity slots and epochs of successive calls are exercised too. ``transport="forward"`` (``push_ws_fwd``):
each rank's forward warp stores the boxes its local tiles load into the other's inbox, through the same
translation.
"""

from __future__ import annotations

import math
from typing import Any

_ALIGN = 256


class EmulatedPushPair:
    """Ranks 0 and 1 of a two-rank ``push_ws`` problem (``M x N x K``, ``gather_dim``) on the current GPU."""

    def __init__(self, m: int, n: int, k: int, gather_dim: int, dtype: Any, config: Any, num_sms: int,
                 col_b: bool = False, seed: int = 0, transport: str = "sms") -> None:  # fmt: skip
        import torch

        from autotaxer.kernels.ag_gemm.experimental.push_ws import PushWsCall
        from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, flags_count, geometry, inbox_shape, shard_dims

        dev = torch.device("cuda")
        self.gen = torch.Generator(device=dev).manual_seed(seed)
        self.gather_dim, self.dtype = gather_dim, dtype
        ms, ks = shard_dims(m, k, 2, gather_dim)
        self.shards = [torch.empty(ms, ks, device=dev, dtype=dtype) for _ in range(2)]
        if col_b:
            self.b = torch.randn(n, k, device=dev, dtype=dtype, generator=self.gen).t()
        else:
            self.b = torch.randn(k, n, device=dev, dtype=dtype, generator=self.gen)
        self.outs = [torch.empty(m, n, device=dev, dtype=dtype) for _ in range(2)]
        shape = inbox_shape(ms, ks, 2)
        elems = math.prod(shape)
        inbox_bytes = -(-elems * dtype.itemsize // _ALIGN) * _ALIGN
        n_flags = flags_count(geometry(config, ms, ks), 2)
        self.heaps = [torch.zeros(inbox_bytes + 4 * n_flags, device=dev, dtype=torch.uint8) for _ in range(2)]
        self.inboxes = [h[:inbox_bytes].view(dtype)[:elems].view(shape) for h in self.heaps]
        self.flags = [h[inbox_bytes:].view(torch.int32) for h in self.heaps]
        heap_bases = torch.tensor([h.data_ptr() for h in self.heaps], device=dev, dtype=torch.int64)
        self.syncs = [torch.zeros(SYNC_WORDS, device=dev, dtype=torch.int64) for _ in range(2)]
        #: ``comm_sms=0``: each rank's kernel moves its own shard, so both run at once on half the SMs each
        self.in_kernel = config.comm_sms == 0
        if self.in_kernel:
            num_sms //= 2
        self.calls = [
            PushWsCall(
                a_shard=self.shards[r], b=self.b, out=self.outs[r], inbox=self.inboxes[r],
                flags=self.flags[r], sync=self.syncs[r], heap_bases=heap_bases, rank=r, world_size=2,
                gather_dim=gather_dim, config=config, num_sms=num_sms, transport=transport,
            )
            for r in range(2)
        ]  # fmt: skip
        self.side = torch.cuda.Stream()
        self.new_shards()
        for r, c in enumerate(self.calls):  # both ranks' kernels loaded before either runs
            c.compile(self.shards[r], self.b, self.outs[r])

    @property
    def out(self) -> Any:
        """Rank 0's output."""
        return self.outs[0]

    def new_shards(self) -> None:
        """Fresh random shards (never zeros) for the next call."""
        for s in self.shards:
            s.copy_(torch_randn_like(s, self.gen))

    def reference(self) -> Any:
        """``cat(shards, gather_dim) @ b`` in fp32."""
        import torch

        return torch.cat(self.shards, dim=self.gather_dim).float() @ self.b.float()

    def poison(self) -> None:
        """NaN into the outputs and inboxes: anything read before it landed, or never written, shows."""
        for t in (*self.outs, *self.inboxes):
            t.fill_(float("nan"))

    def call(self, delay_cycles: int = 0, overlap: bool = True) -> None:
        """One call: both ranks count arrivals; rank 1's producers on the side stream (after
        ``delay_cycles`` of GPU sleep) and rank 0's consumer here, beside them (``overlap``) or after; with
        ``comm_sms=0`` rank 1's whole kernel on the side stream, always beside rank 0's."""
        import torch

        for c in self.calls:
            c.count_arrivals()
        main = torch.cuda.current_stream()
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            if delay_cycles:
                torch.cuda._sleep(delay_cycles)
            if self.in_kernel:  # rank 1's whole call: it pushes to rank 0 and waits for rank 0's rows
                self.calls[1].consumer(self.shards[1], self.b, self.outs[1])
            else:
                self.calls[1].producers(self.shards[1], self.b, self.outs[1])
        if not overlap and not self.in_kernel:
            main.wait_stream(self.side)
        self.calls[0].consumer(self.shards[0], self.b, self.outs[0])
        main.wait_stream(self.side)


def torch_randn_like(t: Any, gen: Any) -> Any:
    """``randn`` of ``t``'s shape, dtype and device from ``gen``."""
    import torch

    return torch.randn(t.shape, device=t.device, dtype=t.dtype, generator=gen)
