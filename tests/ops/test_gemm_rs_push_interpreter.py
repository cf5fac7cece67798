"""``gemm_rs``'s fused ``push`` kernel under Triton's interpreter: 2, 4 and 8 ranks emulated in one
process (one heap buffer per rank, ``heap_bases`` their addresses), every rank's GEMM-and-push step
before any rank's reduce step. Several calls on one set of flags with fresh inputs and NaN-poisoned
outputs, no reset: a wrong parity slot or a stale epoch gives a wrong result. Against fp32."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import sys
    import torch

    from autotaxer.kernels.gemm_rs.push import (
        SYNC_WORDS, RsConfig, flags_count, gemm_rs_push, inbox_shape, out_dims, tma_ready,
    )

    ws, sd, m, n, k, layout = int(sys.argv[1]), int(sys.argv[2]), *map(int, sys.argv[3:6]), sys.argv[6]
    dtype = {"fp32": torch.float32, "fp16": torch.float16}[sys.argv[7]]  # (no bf16 dot in the interpreter)
    tma = sys.argv[8] == "tma"
    cfg = RsConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_programs=3)
    ks = k // ws
    mo, no = out_dims(m, n, ws, sd)
    nbytes = 1 << 20
    heaps = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(ws)]
    bases = torch.tensor([h.data_ptr() for h in heaps], dtype=torch.int64)
    esize = torch.empty((), dtype=dtype).element_size()
    n_in = 2 * ws * mo * no * esize
    inboxes = [h[:n_in].view(dtype).view(inbox_shape(mo, no, ws)) for h in heaps]
    off = (n_in + 255) // 256 * 256
    nf = flags_count(m, n, ws, sd, cfg)
    flags = [h[off : off + 4 * nf].view(torch.int32) for h in heaps]
    syncs = [torch.zeros(SYNC_WORDS, dtype=torch.int64) for _ in range(ws)]
    for call in range(1, 4):
        torch.manual_seed(call)
        a = [torch.randn(m, ks).to(dtype) for _ in range(ws)]
        if layout == "kn":
            b = [torch.randn(ks, n).to(dtype) for _ in range(ws)]
        else:  # nn.Linear's weight.t(): B column-major
            b = [torch.randn(n, ks).to(dtype).t() for _ in range(ws)]
        full = sum(x.float() @ y.float() for x, y in zip(a, b))
        outs = [torch.full((mo, no), float("nan"), dtype=dtype) for _ in range(ws)]
        assert not tma or tma_ready(a[0], b[0]) is None  # the TMA core runs, not the fallback
        for phase in ("push", "reduce"):
            for r in range(ws):
                gemm_rs_push(a=a[r], b=b[r], out=outs[r], inbox=inboxes[r], flags=flags[r], sync=syncs[r],
                             heap_bases=bases, rank=r, world_size=ws, scatter_dim=sd, config=cfg, num_sms=4,
                             phase=phase, tma=tma)
        for r in range(ws):
            ref = full[r * mo:(r + 1) * mo] if sd == 0 else full[:, r * no:(r + 1) * no]
            err = ((outs[r].float() - ref).norm() / ref.norm()).item()
            assert err < (1e-5 if dtype == torch.float32 else 1e-2), (call, r, err)
            assert syncs[r].item() == call * 3, syncs[r]
            tiles = nf // (2 * ws)
            # this call's parity slot: every source's flag of every tile of this rank holds the epoch
            assert flags[r].view(2, ws, tiles)[call % 2].eq(call).all(), (call, r)
    print("OK", ws, sd, m, n, k, layout, sys.argv[8])
    """
)


def _run(*args) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *map(str, args)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.emulated
@pytest.mark.parametrize("world_size", [2, 4, 8], ids=lambda ws: f"gemm_rs-ws{ws}")
@pytest.mark.parametrize("scatter_dim", [0, 1], ids=lambda sd: f"sd{sd}")
def test_push_matches_fp32_on_emulated_ranks(world_size: int, scatter_dim: int) -> None:
    # slices that are not a whole number of 16-wide tiles (Mo or No = 24 / 12 / 6 + ...), K not a multiple
    # of BLOCK_K per rank, both weight layouts, fp32 and fp16
    m, n = (24 * world_size, 40) if scatter_dim == 0 else (40, 24 * world_size)
    k = 24 * world_size
    out = _run(world_size, scatter_dim, m, n, k, "kn", "fp32", "plain")
    if world_size > 4:  # 8 ranks: the protocol at scale; the layouts and cores are covered at 2 and 4
        assert out.count("OK") == 1
        return
    out += _run(world_size, scatter_dim, m, n, k + 8 * world_size, "nk", "fp16", "plain")
    # push_tma's core: TMA loads of A and B (both layouts), edges zero-filled, tiles past a slice unused
    out += _run(world_size, scatter_dim, m, n, k, "nk" if scatter_dim else "kn", "fp32", "tma")
    assert out.count("OK") == 3
