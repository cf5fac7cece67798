"""The ``ce_gemm`` variant: its consumer kernel under Triton's interpreter (the copy-engine transport is
emulated by writing the peers' chunks into the inbox and raising their flags, as the side stream would),
its uniform chunking, and its search space, seeds and opt-in status on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from autotaxer.kernels.ag_gemm_ce_gemm import uniform_chunks

from autotaxer._problem import ProblemKey, Target
from autotaxer.ops import get_op
from autotaxer.tuner.study import SearchSpace

H200 = Target("nvidia-h200", "sm_90", 132)

_CHECK = textwrap.dedent(
    """
    import types

    import torch

    from autotaxer.kernels._ag_fused import FusedConfig
    from autotaxer.kernels.ag_gemm_ce import MAX_CHUNKS, Plan
    from autotaxer.kernels.ag_gemm_ce_gemm import KERNEL, launch_args, uniform_chunks


    def check(ws, gd, m, n, k, chunks, epoch, dtype=torch.float32, seed=0):
        torch.manual_seed(seed)
        ms, ks = (m // ws, k) if gd == 0 else (m, k // ws)
        cfg = FusedConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2,
                          comm_sms=1, row_chunks=1, k_chunks=1)
        shards = [torch.randn(ms, ks).to(dtype) for _ in range(ws)]
        b = torch.randn(k, n).to(dtype)
        ref = torch.cat([s.float() for s in shards], dim=gd) @ b.float()
        rows = uniform_chunks(ms, chunks)
        for r in range(ws):
            # the copy engine's work, done here: every peer's shard in its inbox slot, every chunk flagged
            inbox = torch.full((ws * ms * ks,), float("nan"), dtype=dtype)
            data = torch.zeros(ws * MAX_CHUNKS, dtype=torch.int32)
            for p in range(ws):
                if p != r:
                    inbox[p * ms * ks : (p + 1) * ms * ks] = shards[p].flatten()
                    data[p * MAX_CHUNKS : p * MAX_CHUNKS + len(rows)] = epoch
            channel = types.SimpleNamespace(world_size=ws, rank=r, backend="memop", data=data)
            peers = tuple(p for p in range(ws) if p != r)
            plan = Plan(gather_dim=gd, rows=ms, k_shard=ks, elem=shards[r].element_size(), chunk_rows=rows,
                        peers=peers, gather_first=False, fp32_accumulate=False, inbox_ptr=0,
                        remote_inbox=(), remote_data=(), remote_done=())
            out = torch.full((m, n), float("nan"), dtype=dtype)
            eptr = torch.tensor([epoch], dtype=torch.int32)
            grid, args, options = launch_args(channel, plan, inbox, shards[r], b, out, eptr, cfg, num_sms=3)
            KERNEL[(grid,)](*args, **options)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < (1e-5 if dtype == torch.float32 else 2e-3), (ws, gd, m, r, err)
        print("OK", ws, gd, m, chunks)
    """
)


def _run(body: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK + textwrap.dedent(body)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.slow
def test_consumer_kernel_reads_peers_chunks_from_the_inbox_in_both_layouts() -> None:
    # gd=0: 12-row shards in 5-row chunks (last one 2 rows) straddle 16-row tiles; K=40 is not a multiple
    # of BLOCK_K. gd=1: Ks=20 columns, N=40 not a multiple of BLOCK_N. Epoch 7: flags hold any value.
    out = _run(
        """
        check(2, 0, 24, 40, 40, chunks=3, epoch=7)
        check(3, 1, 20, 40, 60, chunks=4, epoch=1, dtype=torch.float16)
        """
    )
    assert out.count("OK") == 2


def test_uniform_chunks_cover_the_rows_with_equal_widths() -> None:
    assert uniform_chunks(12, 3) == ((0, 4), (4, 4), (8, 4))
    assert uniform_chunks(10, 4) == ((0, 3), (3, 3), (6, 3), (9, 1))
    assert uniform_chunks(9, 4) == ((0, 3), (3, 3), (6, 3))  # fewer chunks when the widths round up
    with pytest.raises(ValueError, match="chunks"):
        uniform_chunks(4, 5)


def test_ce_gemm_is_opt_in_and_its_seeds_are_in_its_space() -> None:
    op = get_op("ag_gemm")
    variant = op.variants["ce_gemm"]
    assert variant.experimental
    key = ProblemKey.make(
        "ag_gemm", "nvidia-h200", 2, "bf16", {"M": 256, "N": 8192, "K": 8192}, {"gather_dim": 1}
    )
    space = variant.search_space(key, H200)
    seeds = variant.seed_configs(key, H200)
    assert seeds and all(set(s) == set(space) and all(s[p] in space[p] for p in space) for s in seeds)
    # never in a default tuning or benchmark run, only when named
    if variant.unavailable_reason(H200) is None:
        assert "ce_gemm" not in SearchSpace.build(op, key, H200, None).names
        assert "ce_gemm" in SearchSpace.build(op, key, H200, ("bsp", "ce_gemm")).names
    assert "NVIDIA" in variant.unavailable_reason(Target("amd-mi300x", "gfx942", 304))
    good = dict(seeds[0], signal="triton")  # the portable back end: valid without cuda-python here
    assert variant.check(key, H200, good) is None
    assert "chunks" in variant.check(key, H200, dict(good, chunks=99))
    assert "block_m" in variant.check(key, H200, dict(good, block_m=96))  # push's tile checks apply
