"""``ag_gemm``'s kernels on ranks emulated in one process (their heap: :mod:`.._emulated_heap`; run by
:mod:`autotaxer.tools.emulated_ranks`): the fused kernel's protocol checked call by call
(:func:`check_ag_gemm`), and rank 0's waits on peers that never signal (the fused kernel by push or
pull, and the copy-engine schedules' flag wait)."""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey
from .._emulated_heap import emulated_error, emulated_tolerance, inbox_heap
from .._forms import EmulatedForm


def grid_and_tiles(m: int, n: int, config: Any, num_sms: int) -> tuple[int, int]:
    """The fused ``ag_gemm`` launch's grid and its GEMM's tile count, as the launcher computes them."""
    tiles = -(-m // config.block_m) * -(-n // config.block_n)
    return config.comm_sms + min(num_sms - config.comm_sms, tiles), tiles


def check_ag_gemm(
    kind: str,
    world_size: int,
    gather_dim: int,
    m: int,
    n: int,
    k: int,
    config: Any,
    *,
    calls: int = 3,
    dtype: Any = None,
    device: Any = "cpu",
    seed: int = 0,
    first_epoch: int = 1,
    b_t: bool = False,
    tma: bool = True,
    num_sms: int = 4,
) -> str:
    """``calls`` calls of ``kind`` (``pull``, ``push`` or ``push_tma``) on ``world_size`` emulated ranks,
    one set of flags, fresh inputs and NaN-poisoned outputs each call; returns ``"OK ..."``.

    ``first_epoch`` > 1: the sync words start as that many calls had left them. ``b_t``: B is a
    transposed row-major ``(N, K)`` tensor (nn.Linear's layout). ``tma``: for ``push_tma``, whether the
    TMA core is expected to run (else push's kernel as its fallback)."""
    import torch

    from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, flags_count, geometry, inbox_shape, shard_dims
    from autotaxer.kernels.ag_gemm.pull import ag_gemm_pull
    from autotaxer.kernels.ag_gemm.push import ag_gemm_push
    from autotaxer.kernels.ag_gemm.push_tma import ag_gemm_push_tma, tma_ready

    launch = {"pull": ag_gemm_pull, "push": ag_gemm_push, "push_tma": ag_gemm_push_tma}[kind]
    dtype = dtype or torch.float32
    ws, gd = world_size, gather_dim
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ms, ks = shard_dims(m, k, ws, gd)
    geo = geometry(config, ms, ks)
    box, n_flags = inbox_shape(ms, ks, ws), flags_count(geo, ws)
    heap, inbox, flags = inbox_heap(ws, box, dtype, n_flags, device)
    syncs = [torch.zeros(SYNC_WORDS, dtype=torch.int64, device=device) for _ in range(ws)]
    grid, tiles = grid_and_tiles(m, n, config, num_sms)
    per_call = tiles + config.comm_sms if config.comm_sms else 0  # the tile queue's draws per call
    for s in syncs:
        s[0], s[1] = (first_epoch - 1) * grid, ((first_epoch - 1) * per_call) % 2**32
    for epoch in range(first_epoch, first_epoch + calls):
        shards = [torch.randn(ms, ks, generator=gen).to(device, dtype) for _ in range(ws)]
        b = torch.randn(k, n, generator=gen).to(device, dtype)
        if b_t:
            b = b.t().contiguous().t()
        outs = [torch.full((m, n), float("nan"), dtype=dtype, device=device) for _ in range(ws)]
        ref = torch.cat([s.float() for s in shards], dim=gd) @ b.float()
        if kind == "push_tma":
            ready = tma_ready(shards[0], b, inbox[0], gd, config) is None
            assert ready == tma, f"push_tma: TMA core expected {tma}, tma_ready says {ready}"
        for phase in ("stage", "fetch", "consumers"):  # pull's fetch waits on every rank's staging
            for r in range(ws):
                launch(a_shard=shards[r], b=b, out=outs[r], flags=flags[r], sync=syncs[r],
                       heap_bases=heap.bases, rank=r, world_size=ws, gather_dim=gd, config=config,
                       num_sms=num_sms, phase=phase, inbox=inbox[r])  # fmt: skip
        for r in range(ws):
            err = emulated_error(outs[r], ref)
            where = f"{kind} ws{ws} gd{gd} call {epoch} rank {r}"
            assert err < emulated_tolerance(dtype), f"{where}: relative error {err:.2e}"
            # every program arrived once per call; the queue advanced by tiles + dedicated producers
            arrivals, drawn = syncs[r].tolist()
            assert arrivals == epoch * grid, f"rank {r} call {epoch}: {arrivals} arrivals, {epoch * grid} due"
            assert drawn % 2**32 == (epoch * per_call) % 2**32, f"rank {r} call {epoch}: queue at {drawn}"
            # this call's parity slot holds its epoch in every flag a peer raises (pull: its own too)
            slot = flags[r].view(2, ws, geo.count)[epoch % 2]
            raised = slot.flatten().tolist().count(epoch)
            due = (ws if kind == "pull" else ws - 1) * geo.count
            assert raised == due, f"rank {r} call {epoch}: {raised} flags hold the epoch, {due} due"
            for src in range(ws):  # every peer's shard landed bit for bit (pull: the own one staged)
                if src != r or kind == "pull":
                    landed = torch.equal(inbox[r][epoch % 2, src], shards[src])
                    assert landed, f"{kind} call {epoch}: rank {src}'s shard differs in rank {r}'s inbox"
    return f"OK {kind} ws{ws} gd{gd} {m}x{n}x{k} {str(dtype).removeprefix('torch.')}"


def _never_signal_fused(kind: str, ctx: Any, randn: Any, dtype: Any) -> Any:
    """Rank 0's call of the fused kernel (``push`` or ``pull``); returns its watch slot."""
    import torch

    from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, FusedConfig, flags_count, geometry, inbox_shape
    from autotaxer.kernels.ag_gemm.fused import launch as fused_launch

    dev, ws, target = ctx.device, ctx.world_size, ctx.target
    m, n, k = 12 * ws, 40, 40
    config = FusedConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2,
                         comm_sms=1, row_chunks=2, k_chunks=2)  # fmt: skip
    key = ProblemKey.make(
        "ag_gemm", target.gpu_model, ws, "fp32", {"M": m, "N": n, "K": k}, {"gather_dim": 0}
    )
    ms = m // ws
    box, n_flags = inbox_shape(ms, k, ws), flags_count(geometry(config, ms, k), ws)
    heap, inbox, flags = inbox_heap(ws, box, dtype, n_flags, dev)
    slot = ctx.watch_slot(key, kind)
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int64, device=dev)
    out = torch.empty(m, n, dtype=dtype, device=dev)
    fused_launch(kind, a_shard=randn(ms, k), b=randn(k, n), out=out, inbox=inbox[0], flags=flags[0],
                 sync=sync, heap_bases=heap.bases, rank=0, world_size=ws, gather_dim=0, config=config,
                 num_sms=4, watch=slot.tensor)  # fmt: skip
    return slot


def _never_signal_flag_wait(kind: str, ctx: Any, randn: Any, dtype: Any) -> Any:
    """The copy-engine schedules' flag wait on a peer's flag; returns its watch slot."""
    import torch

    from autotaxer.kernels.common import signal as sig

    dev, ws, target = ctx.device, ctx.world_size, ctx.target
    key = ProblemKey.make("ag_gemm", target.gpu_model, ws, "fp32", {"M": 2 * ws, "N": 8, "K": 8},
                          {"gather_dim": 0})  # fmt: skip
    slot = ctx.watch_slot(key, "copy_engine")
    flag, epoch = (
        torch.zeros(4, dtype=torch.int32, device=dev),
        torch.ones(1, dtype=torch.int32, device=dev),
    )
    sig.wait(flag[1:2], epoch, watch=slot.tensor, peer=1, index=1)
    return slot


FORM = EmulatedForm(
    checks={"fused": check_ag_gemm},
    never_signal={
        "push": _never_signal_fused,
        "pull": _never_signal_fused,
        "signal": _never_signal_flag_wait,
    },
)
