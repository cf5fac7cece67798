"""``gemm_rs``'s fused kernel on ranks emulated in one process (their heap: :mod:`.._emulated_heap`; run
by :mod:`autotaxer.tools.emulated_ranks`): its protocol checked call by call (:func:`check_gemm_rs_push`),
and rank 0's waits on peers that never signal."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._problem import ProblemKey
from .._emulated_heap import emulated_error, emulated_tolerance, inbox_heap
from .._forms import EmulatedForm

if TYPE_CHECKING:
    import torch

    from autotaxer.kernels.gemm_rs.push import RsConfig


def check_gemm_rs_push(
    world_size: int,
    scatter_dim: int,
    m: int,
    n: int,
    k: int,
    config: RsConfig,
    *,
    dtype: torch.dtype | None = None,
    layout: str = "kn",
    tma: bool = False,
    calls: int = 3,
    device: torch.device | str = "cpu",
    num_sms: int = 4,
    seed: int = 0,
) -> str:
    """``calls`` calls of ``gemm_rs``'s fused push kernel on
    ``world_size`` emulated ranks (``k`` is the full K; each rank holds ``k / world_size`` of it), every
    rank's GEMM-and-push step before any rank's reduce step; ``layout`` ``nk``: B is nn.Linear's
    transposed weight. Returns ``"OK ..."``."""
    import torch

    from autotaxer.kernels.gemm_rs.push import (
        SYNC_WORDS,
        flags_count,
        gemm_rs_push,
        grid_of,
        inbox_shape,
        out_dims,
        tma_ready,
    )  # fmt: skip

    dtype = dtype or torch.float32
    ws, sd, ks = world_size, scatter_dim, k // world_size
    gen = torch.Generator(device="cpu").manual_seed(seed)
    mo, no = out_dims(m, n, ws, sd)
    box, n_flags = inbox_shape(mo, no, ws), flags_count(m, n, ws, sd, config)
    heap, inbox, flags = inbox_heap(ws, box, dtype, n_flags, device)
    syncs = [torch.zeros(SYNC_WORDS, dtype=torch.int64, device=device) for _ in range(ws)]
    grid = grid_of(config, num_sms)
    for call in range(1, calls + 1):
        a = [torch.randn(m, ks, generator=gen).to(device, dtype) for _ in range(ws)]
        if layout == "kn":
            b = [torch.randn(ks, n, generator=gen).to(device, dtype) for _ in range(ws)]
        else:
            b = [torch.randn(n, ks, generator=gen).to(device, dtype).t() for _ in range(ws)]
        full = sum(x.float() @ y.float() for x, y in zip(a, b, strict=True))
        outs = [torch.full((mo, no), float("nan"), dtype=dtype, device=device) for _ in range(ws)]
        if tma:
            reason = tma_ready(a[0], b[0])
            assert reason is None, f"gemm_rs push_tma: the TMA core would not run ({reason})"
        for phase in ("push", "reduce"):
            for r in range(ws):
                gemm_rs_push(a=a[r], b=b[r], out=outs[r], inbox=inbox[r], flags=flags[r], sync=syncs[r],
                             heap_bases=heap.bases, rank=r, world_size=ws, scatter_dim=sd, config=config,
                             num_sms=num_sms, phase=phase, tma=tma)  # fmt: skip
        for r in range(ws):
            ref = full[r * mo : (r + 1) * mo] if sd == 0 else full[:, r * no : (r + 1) * no]
            err = emulated_error(outs[r], ref)
            where = f"gemm_rs ws{ws} sd{sd} call {call} rank {r}"
            assert err < emulated_tolerance(dtype), f"{where}: relative error {err:.2e}"
            arrivals = syncs[r].item()
            assert arrivals == call * grid, f"rank {r} call {call}: {arrivals} arrivals, {call * grid} due"
            tiles = n_flags // (2 * ws)
            raised = flags[r].view(2, ws, tiles)[call % 2].eq(call).all().item()
            assert raised, f"rank {r} call {call}: a source's tile flag does not hold the epoch"
    core = "tma" if tma else "plain"
    return f"OK gemm_rs ws{ws} sd{sd} {m}x{n}x{k} {layout} {core} {str(dtype).removeprefix('torch.')}"


def _never_signal_push(kind: str, ctx: Any, randn: Any, dtype: Any) -> Any:
    """Rank 0's call of the fused push kernel; returns its watch slot."""
    import torch

    from autotaxer.kernels.gemm_rs.push import SYNC_WORDS, RsConfig, flags_count, gemm_rs_push, inbox_shape

    dev, ws, target = ctx.device, ctx.world_size, ctx.target
    m, n, ks = 16 * ws, 24, 16
    config = RsConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_programs=3)
    key = ProblemKey.make("gemm_rs", target.gpu_model, ws, "fp32", {"M": m, "N": n, "K": ks * ws},
                          {"scatter_dim": 0})  # fmt: skip
    box, n_flags = inbox_shape(m // ws, n, ws), flags_count(m, n, ws, 0, config)
    heap, inbox, flags = inbox_heap(ws, box, dtype, n_flags, dev)
    slot = ctx.watch_slot(key, "push")
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int64, device=dev)
    gemm_rs_push(a=randn(m, ks), b=randn(ks, n), out=torch.empty(m // ws, n, dtype=dtype, device=dev),
                 inbox=inbox[0], flags=flags[0], sync=sync, heap_bases=heap.bases, rank=0, world_size=ws,
                 scatter_dim=0, config=config, num_sms=4, watch=slot.tensor)  # fmt: skip
    return slot


FORM = EmulatedForm(checks={"push": check_gemm_rs_push}, never_signal={"gemm_rs": _never_signal_push})
