"""Probe, prepared 2026-11-29 and not yet run on a GPU: the split-K probe of
``../2026-11-29_gemm_core_tp4_h200/splitk_probe.py`` with a second unit order, ``K_MAJOR`` (``u = s *
tiles + t``: a wave's units are the same K slice of many tiles, so concurrent programs share A and B slices
in L2 as whole tiles in lockstep do; the first order, ``u = t * S + s``, puts a tile's slices side by side,
so a wave reads every slice at once). Checked under Triton's interpreter (both orders, both weight
layouts, against ``a @ b``). The rows are the split-K probe's own (its ``key_row``: each key's forms side
by side with cuBLAS) at its sub-wave keys and two of its tiles, the K-major forms named ``S-<splits>``.
Run after ``source bench/device.sh``: ``python3 -P bench/results/2026-11-29_streamk_h200/
splitk_kmajor_probe.py`` (writes ``$OUT/splitk_kmajor_probe.json``); the stream-K README says why (lost
L2 reuse, likely the cost of the dealt runs).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl
from autotaxer.kernels.common.gemm import num_sms, store_tile
from autotaxer.kernels.common.tiles import grouped_tile
from autotaxer.kernels.common.tma import Scratch, b_descriptor, scratch_allocator, tma_k_range

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-11-29_gemm_core_tp4_h200")
)
import splitk_probe as base  # noqa: E402  (its keys, tiles, checks and side-by-side timing)

#: Splits of both orders: ``-S`` is ``S`` in K-major order.
SPLITS = [1, 2, 3, 4, 6, -2, -3, -4, -6]
#: The split-K probe's keys below two waves of 128x128 tiles, and its two best tiles there.
KEYS = [(1024, 2560, 8192, "nk"), (256, 2560, 8192, "nk"), (256, 14336, 8192, "nk"), (1024, 2048, 8192, "kn")]
TILES = [(128, 256, 64, 8, 4), (128, 128, 64, 4, 5)]


@triton.jit
def splitk_kernel(a_ptr, b_ptr, c_ptr, part_ptr, cnt_ptr, M, N, K, sam, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, S: tl.constexpr,
                  GROUP_M: tl.constexpr, B_ROW_MAJOR: tl.constexpr, K_MAJOR: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    per = tl.cdiv(tl.cdiv(K, BK), S)
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [sam, 1], [BM, BK])
    b_desc = b_descriptor(b_ptr, K, N, sbk, sbn, BK, BN, B_ROW_MAJOR)
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    for u in range(pid, npm * npn * S, grid):
        if K_MAJOR:  # a wave's units share K slices: u = s * tiles + t
            t = u % (npm * npn)
            s = u // (npm * npn)
        else:
            t = u // S
            s = u % S
        pid_m, pid_n = grouped_tile(t, npm, npn, GROUP_M)
        k_lo = s * per * BK
        k_hi = tl.minimum(k_lo + per * BK, K)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc = tma_k_range(acc, a_desc, pid_m * BM, b_desc, 0, pid_n * BN, k_lo, k_hi, BK, B_ROW_MAJOR)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        if S == 1:
            store_tile(c_ptr, acc, offs_m, offs_n, M, N, scm, scn)
        else:
            tl.store(part_ptr + tl.cast(t * S + s, tl.int64) * (BM * BN) + offs, acc)
            tl.debug_barrier()
            old = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
            if old % S == S - 1:  # the tile's last unit: sum the others' partials (past L1)
                for j in range(S):
                    if j != s:
                        slot = part_ptr + tl.cast(t * S + j, tl.int64) * (BM * BN)
                        acc += tl.load(slot + offs, cache_modifier=".cg")
                store_tile(c_ptr, acc, offs_m, offs_n, M, N, scm, scn)


def make(a, b, out, bm, bn, bk, warps, stages, splits, group_m=8):
    """A call of the probe kernel on ``a @ b -> out`` at these tiles and ``abs(splits)`` units a tile
    (``splits < 0``: K-major order)."""
    m, k = a.shape
    n = b.shape[1]
    s = abs(splits)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    part = torch.empty(tiles * s * bm * bn if s > 1 else 1, dtype=torch.float32, device=a.device)
    cnt = torch.zeros(tiles, dtype=torch.int32, device=a.device)
    grid = min(num_sms(a.device), tiles * s)
    scratch = Scratch()

    def run():
        with scratch_allocator(scratch):
            splitk_kernel[(grid,)](
                a, b, out, part, cnt, m, n, k, a.stride(0), b.stride(0), b.stride(1), out.stride(0),
                out.stride(1), BM=bm, BN=bn, BK=bk, S=s, GROUP_M=group_m, B_ROW_MAJOR=b.stride(1) == 1,
                K_MAJOR=splits < 0, num_warps=warps, num_stages=stages,
            )  # fmt: skip

    return run


def main() -> None:
    base.make, base.SPLITS, base.TILES = make, SPLITS, TILES
    rows = [base.key_row(*key) for key in KEYS]
    path = os.path.join(os.environ.get("OUT", "."), "splitk_kmajor_probe.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
