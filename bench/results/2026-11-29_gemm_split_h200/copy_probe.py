"""A contiguous bf16 copy on the copy engine (``dst.copy_(src)``: ``cudaMemcpyAsync``) against a
grid-stride Triton copy, at the sizes ``ce_local_rest`` copies from its scratch into ``out`` (one GPU)."""

from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    step = tl.num_programs(0) * BLOCK
    for start in range(tl.program_id(0) * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def timed(fn, reps: int = 20, rounds: int = 15) -> float:
    """µs a call: ``reps`` calls in one CUDA graph, the median of ``rounds`` replays."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def probe(rows: int, n: int) -> None:
    """One size: the copy engine's copy and the Triton copy at four grids, printed."""
    src = torch.randn(rows, n, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    engine = timed(lambda: dst.copy_(src))

    def kernel(grid: int, block: int):
        return lambda: _copy[(grid,)](src, dst, src.numel(), BLOCK=block, num_warps=8)

    sm = {(g, b): timed(kernel(g, b)) for g, b in ((132, 4096), (264, 4096), (528, 4096), (528, 8192))}
    assert torch.equal(dst, src)
    mib = src.numel() * 2 / 2**20
    best = min(sm, key=sm.get)
    rate = 2 * src.numel() * 2 / engine / 1e6
    print(f"{rows}x{n} {mib:.1f} MiB: copy engine {engine:.1f} us ({rate:.2f} TB/s r+w), "
          f"SM best {sm[best]:.1f} us {best}  all {sm}")  # fmt: skip


def main() -> None:
    for rows, n in ((768, 2560), (768, 14336), (896, 14336), (1536, 14336), (3072, 14336)):
        probe(rows, n)


if __name__ == "__main__":
    main()
