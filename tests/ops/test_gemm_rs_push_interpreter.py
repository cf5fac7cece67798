"""``gemm_rs``'s fused ``push`` kernel under Triton's interpreter: 2, 4 and 8 ranks emulated in one process
(``autotaxer.tools.emulated_ranks``: one heap buffer per rank, ``heap_bases`` their addresses), every rank's
GEMM-and-push step before any rank's reduce step. Several calls on one set of flags with fresh inputs and
NaN-poisoned outputs, no reset: a wrong parity slot or a stale epoch gives a wrong result. Against fp32."""

from __future__ import annotations

import json
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    import torch

    from autotaxer.kernels.gemm_rs.push import RsConfig
    from autotaxer.ops.gemm_rs._emulated import check_gemm_rs_push

    cfg = RsConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_programs=3)
    for ws, sd, m, n, k, layout, dtype, core in json.loads(sys.argv[1]):
        dtype = {"fp32": torch.float32, "fp16": torch.float16}[dtype]  # (no bf16 dot in the interpreter)
        print(check_gemm_rs_push(ws, sd, m, n, k, cfg, layout=layout, dtype=dtype, tma=core == "tma"))
    """
)


@pytest.mark.emulated
@pytest.mark.parametrize("world_size", [2, 4, 8], ids=lambda ws: f"gemm_rs-ws{ws}")
@pytest.mark.parametrize("scatter_dim", [0, 1], ids=lambda sd: f"sd{sd}")
def test_push_matches_fp32_on_emulated_ranks(world_size: int, scatter_dim: int, interpreter_worker) -> None:
    # slices that are not a whole number of 16-wide tiles (Mo or No = 24 / 12 / 6 + ...), K not a multiple
    # of BLOCK_K per rank, both weight layouts, fp32 and fp16; at 8 ranks slices of 12 (every tile
    # straddles two owners; the interpreter's time grows with the tiles every rank makes)
    mo = 12 if world_size > 4 else 24
    m, n = (mo * world_size, 40) if scatter_dim == 0 else (40, mo * world_size)
    k = 24 * world_size
    checks = [(world_size, scatter_dim, m, n, k, "kn", "fp32", "plain")]
    if world_size <= 4:  # 8 ranks: the protocol at scale; the layouts and cores are covered at 2 and 4
        checks.append((world_size, scatter_dim, m, n, k + 8 * world_size, "nk", "fp16", "plain"))
        # push_tma's core: TMA loads of A and B (both layouts), edges zero-filled, tiles past a slice unused
        checks.append((world_size, scatter_dim, m, n, k, "nk" if scatter_dim else "kn", "fp32", "tma"))
    # checks: (world_size, scatter_dim, M, N, K, layout, dtype, core), run in the interpreter process
    out = interpreter_worker.run(_SCRIPT, argv=(json.dumps(checks),), timeout=900)
    assert out.count("OK") == len(checks), out
