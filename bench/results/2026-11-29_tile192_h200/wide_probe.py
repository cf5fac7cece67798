"""Probe (2026-11-29, one H200): a TMA GEMM tile of BM x (BN1 + BN2) columns (two dots on one A tile,
e.g. 128 + 64 = 192, a width Triton's power-of-two blocks cannot name) against the plain one-dot tile and
cuBLAS, at keys whose output tiles of 128x256 fill part of a wave (issue 47: ``ag_gemm`` M=1024 N=2560
``nk``, 80 tiles on 132 SMs, the TMA core at 0.72x cuBLAS).

Run from the repository root after ``source bench/device.sh``:
``python3 -P bench/results/2026-11-29_tile192_h200/wide_probe.py`` (writes ``$OUT/wide_probe.json``).
A record of the run its README reports, not part of the package.
"""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl
from autotaxer.kernels.common.gemm import num_sms, store_tile
from autotaxer.kernels.common.tiles import grouped_tile
from autotaxer.kernels.common.tma import Scratch, b_descriptor, scratch_allocator

from autotaxer.tools.one_rank import interleaved

KEYS = [  # (M, N, K, B layout)
    (1024, 2560, 8192, "nk"), (1024, 2560, 8192, "kn"), (512, 2560, 8192, "nk"), (2048, 2560, 8192, "nk"),
    (1024, 1280, 8192, "nk"), (1024, 5120, 8192, "nk"), (1024, 14336, 8192, "nk"), (4096, 2560, 8192, "nk"),
]  # fmt: skip
#: (BM, BN1, BN2, BK, warps, stages); BN2 = 0: the plain one-dot tile
TILES = [
    (128, 256, 0, 64, 8, 3), (128, 256, 0, 64, 8, 4), (128, 128, 0, 64, 4, 5), (128, 128, 0, 64, 8, 4),
    (128, 128, 64, 64, 8, 3), (128, 128, 64, 64, 8, 4), (128, 128, 64, 64, 4, 4), (128, 128, 64, 64, 8, 5),
    (128, 256, 128, 64, 8, 3), (64, 128, 64, 64, 4, 4),
]  # fmt: skip


@triton.jit
def plain_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, GROUP_M: tl.constexpr, B_ROW_MAJOR: tl.constexpr):  # fmt: skip
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [sam, 1], [BM, BK])
    b_desc = b_descriptor(b_ptr, K, N, sbk, sbn, BK, BN, B_ROW_MAJOR)
    for t in range(tl.program_id(0), npm * npn, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(t, npm, npn, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            a = a_desc.load([pid_m * BM, k])
            if B_ROW_MAJOR:
                b = b_desc.load([k, pid_n * BN])
            else:
                b = b_desc.load([pid_n * BN, k]).T
            acc = tl.dot(a, b, acc)
        store_tile(c_ptr, acc, pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN), M, N, scm, scn)


@triton.jit
def wide_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sbk, sbn, scm, scn, BM: tl.constexpr,
                BN1: tl.constexpr, BN2: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                B_ROW_MAJOR: tl.constexpr):  # fmt: skip
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN1 + BN2)
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [sam, 1], [BM, BK])
    b1_desc = b_descriptor(b_ptr, K, N, sbk, sbn, BK, BN1, B_ROW_MAJOR)
    b2_desc = b_descriptor(b_ptr, K, N, sbk, sbn, BK, BN2, B_ROW_MAJOR)
    for t in range(tl.program_id(0), npm * npn, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(t, npm, npn, GROUP_M)
        n1 = pid_n * (BN1 + BN2)
        n2 = n1 + BN1
        acc1 = tl.zeros((BM, BN1), dtype=tl.float32)
        acc2 = tl.zeros((BM, BN2), dtype=tl.float32)
        for k in range(0, K, BK):
            a = a_desc.load([pid_m * BM, k])
            if B_ROW_MAJOR:
                b1 = b1_desc.load([k, n1])
                b2 = b2_desc.load([k, n2])
            else:
                b1 = b1_desc.load([n1, k]).T
                b2 = b2_desc.load([n2, k]).T
            acc1 = tl.dot(a, b1, acc1)
            acc2 = tl.dot(a, b2, acc2)
        offs_m = pid_m * BM + tl.arange(0, BM)
        store_tile(c_ptr, acc1, offs_m, n1 + tl.arange(0, BN1), M, N, scm, scn)
        store_tile(c_ptr, acc2, offs_m, n2 + tl.arange(0, BN2), M, N, scm, scn)


def make(a, b, out, bm, bn1, bn2, bk, warps, stages, group_m=8):
    """A call of the plain (``bn2 == 0``) or wide kernel on ``a @ b -> out``."""
    m, k = a.shape
    n = b.shape[1]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn1 + bn2)
    grid = min(num_sms(a.device), tiles)
    scratch = Scratch()
    common = (a, b, out, m, n, k, a.stride(0), b.stride(0), b.stride(1), out.stride(0), out.stride(1))
    opts = dict(BK=bk, GROUP_M=group_m, B_ROW_MAJOR=b.stride(1) == 1, num_warps=warps, num_stages=stages)

    def run():
        with scratch_allocator(scratch):
            if bn2:
                wide_kernel[(grid,)](*common, BM=bm, BN1=bn1, BN2=bn2, **opts)
            else:
                plain_kernel[(grid,)](*common, BM=bm, BN=bn1, **opts)

    return run, tiles


def key_row(m: int, n: int, k: int, layout: str) -> dict:
    """Every tile of one key, checked (NaN-poisoned, fp32 reference), then timed side by side with cuBLAS."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if layout == "nk":
        b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).t()
    else:
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    fns, names, failed = [lambda: torch.matmul(a, b, out=out)], ["cublas"], {}
    for bm, bn1, bn2, bk, warps, stages in TILES:
        name = f"{bm}x{bn1}{'+' + str(bn2) if bn2 else ''}x{bk} w{warps} s{stages}"
        try:
            run, tiles = make(a, b, out, bm, bn1, bn2, bk, warps, stages)
            for _ in range(2):
                out.fill_(float("nan"))
                run()
            torch.cuda.synchronize()
        except Exception as e:  # a tile that does not compile (shared memory) is reported, not fatal
            failed[name] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        err = ((out.float() - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            raise SystemExit(f"M={m} N={n} {name}: WRONG, relative error {err}")
        fns.append(run)
        names.append(f"{name} ({tiles} tiles)")
    times = interleaved(fns, reps=30, rounds=7)
    cb = times[0]
    forms = dict(zip(names[1:], times[1:], strict=True))
    plain = min((t, nm) for nm, t in forms.items() if "+" not in nm)
    wide = min(((t, nm) for nm, t in forms.items() if "+" in nm), default=(float("nan"), "-"))
    print(
        f"M={m} N={n} K={k} {layout}: cublas {cb * 1e3:.1f} us | plain {plain[0] * 1e3:.1f} ({plain[1]}) "
        f"{cb / plain[0]:.3f} | wide {wide[0] * 1e3:.1f} ({wide[1]}) {cb / wide[0]:.3f}",
        flush=True,
    )
    for nm, msg in failed.items():
        print(f"    {nm}: {msg}", flush=True)
    return {"M": m, "N": n, "K": k, "b_layout": layout, "cublas_ms": cb, "forms": forms, "failed": failed}


def main() -> None:
    rows = [key_row(*key) for key in KEYS]
    path = os.path.join(os.environ.get("OUT", "."), "wide_probe.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
