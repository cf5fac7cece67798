"""Probe (2026-11-29, one H200): a stream-K TMA GEMM against the plain persistent tile and cuBLAS at keys
whose tiles fill part of a wave (issue 47: the fused kernels' core at 0.72-0.78x cuBLAS there).

The tiles of the last partial wave (``T % G`` of ``T`` tiles on a grid of ``G`` programs, or all of them
below one wave) are cut into their K iterations, and each program takes an equal contiguous run of those
iterations across tile boundaries; the full waves before them are whole tiles. A run that starts inside a
tile (a tile's tail or middle) stores its fp32 partial in the program's own slot and raises its flag to
the call's epoch; the program holding the tile's first iterations (it reaches them last, at the end of its
run) waits for each later program that covers the tile, adds its partial and writes the tile. Flags carry
the call number, so nothing is reset between calls. Every program must be resident (grid <= SMs).

Run from the repository root after ``source bench/device.sh``:
``python3 -P bench/results/2026-11-29_streamk_h200/streamk_probe.py`` (writes ``$OUT/streamk_probe.json``).
A record of the run its README reports, not part of the package.
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
from autotaxer.kernels.common.tma import Scratch, b_descriptor, scratch_allocator

from autotaxer.tools.one_rank import interleaved

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "2026-11-29_tile192_h200"))
from wide_probe import make as make_plain  # noqa: E402  (the plain persistent tile, same loop)

KEYS = [  # (M, N, K, B layout)
    (1024, 2560, 8192, "nk"), (1024, 2560, 8192, "kn"), (256, 2560, 8192, "nk"), (512, 2560, 8192, "nk"),
    (1024, 1280, 8192, "nk"), (2048, 2560, 8192, "nk"), (1024, 5120, 8192, "nk"), (4096, 2560, 8192, "nk"),
    (1024, 14336, 8192, "nk"), (1024, 8192, 2048, "nk"),
]  # fmt: skip
#: (BM, BN, BK, warps, stages)
TILES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 4, 5), (128, 128, 64, 8, 4)]


@triton.jit
def _tile_iters(acc, a_desc, b_desc, off_m, off_n, k0, k1, BK: tl.constexpr, B_ROW_MAJOR: tl.constexpr):
    for ki in range(k0, k1):
        a = a_desc.load([off_m, ki * BK])
        if B_ROW_MAJOR:
            b = b_desc.load([ki * BK, off_n])
        else:
            b = b_desc.load([off_n, ki * BK]).T
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit(do_not_specialize=["epoch"])
def streamk_kernel(a_ptr, b_ptr, c_ptr, part_ptr, flag_ptr, epoch, M, N, K, sam, sbk, sbn, scm, scn,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   B_ROW_MAJOR: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    tiles = npm * npn
    iters = tl.cdiv(K, BK)
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [sam, 1], [BM, BK])
    b_desc = b_descriptor(b_ptr, K, N, sbk, sbn, BK, BN, B_ROW_MAJOR)
    sk_tiles = tiles % grid
    dp_tiles = tiles - sk_tiles
    for t in range(pid, dp_tiles, grid):  # the full waves: whole tiles
        pid_m, pid_n = grouped_tile(t, npm, npn, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc = _tile_iters(acc, a_desc, b_desc, pid_m * BM, pid_n * BN, 0, iters, BK, B_ROW_MAJOR)
        store_tile(c_ptr, acc, pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN), M, N, scm, scn)
    total = sk_tiles * iters
    per = tl.cdiv(total, grid)
    it = pid * per
    end = tl.minimum(it + per, total)
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    while it < end:
        t = it // iters
        k0 = it % iters
        k1 = tl.minimum(iters, k0 + (end - it))
        pid_m, pid_n = grouped_tile(dp_tiles + t, npm, npn, GROUP_M)
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc = _tile_iters(acc, a_desc, b_desc, pid_m * BM, pid_n * BN, k0, k1, BK, B_ROW_MAJOR)
        if k0 == 0:  # the tile's head: add the later programs' partials, write the tile
            c = pid + 1
            nxt = t * iters + k1
            while nxt < (t + 1) * iters:
                while tl.atomic_add(flag_ptr + c, 0, sem="acquire", scope="gpu") != epoch:
                    pass
                acc += tl.load(part_ptr + tl.cast(c, tl.int64) * (BM * BN) + offs, cache_modifier=".cg")
                nxt = (c + 1) * per
                c += 1
            store_tile(c_ptr, acc, offs_m, offs_n, M, N, scm, scn)
        else:  # a tail or middle: the partial to this program's slot, then its flag
            tl.store(part_ptr + tl.cast(pid, tl.int64) * (BM * BN) + offs, acc)
            tl.debug_barrier()
            tl.atomic_xchg(flag_ptr + pid, epoch, sem="release", scope="gpu")
        it += k1 - k0


@triton.jit(do_not_specialize=["epoch"])
def streamk_flat_kernel(a_ptr, b_ptr, c_ptr, part_ptr, flag_ptr, epoch, M, N, K, sam, sbk, sbn, scm, scn,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                        B_ROW_MAJOR: tl.constexpr):  # fmt: skip
    """The same split as :func:`streamk_kernel`, its stream-K iterations one flat loop (one ``for`` over the
    program's run, the segment's epilogue under an ``if``), as Triton's persistent matmul fuses its loops."""
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    npm = tl.cdiv(M, BM)
    npn = tl.cdiv(N, BN)
    tiles = npm * npn
    iters = tl.cdiv(K, BK)
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [sam, 1], [BM, BK])
    b_desc = b_descriptor(b_ptr, K, N, sbk, sbn, BK, BN, B_ROW_MAJOR)
    sk_tiles = tiles % grid
    dp_tiles = tiles - sk_tiles
    for t in range(pid, dp_tiles, grid):
        pid_m, pid_n = grouped_tile(t, npm, npn, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc = _tile_iters(acc, a_desc, b_desc, pid_m * BM, pid_n * BN, 0, iters, BK, B_ROW_MAJOR)
        store_tile(c_ptr, acc, pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN), M, N, scm, scn)
    total = sk_tiles * iters
    per = tl.cdiv(total, grid)
    start = pid * per
    end = tl.minimum(start + per, total)
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for it in range(start, end):
        t = it // iters
        ki = it % iters
        pid_m, pid_n = grouped_tile(dp_tiles + t, npm, npn, GROUP_M)
        a = a_desc.load([pid_m * BM, ki * BK])
        if B_ROW_MAJOR:
            b = b_desc.load([ki * BK, pid_n * BN])
        else:
            b = b_desc.load([pid_n * BN, ki * BK]).T
        acc = tl.dot(a, b, acc)
        if (ki == iters - 1) | (it == end - 1):  # the segment ends here
            if tl.maximum(start, t * iters) == t * iters:  # it began the tile: the head
                c = pid + 1
                nxt = it + 1
                while nxt < (t + 1) * iters:
                    while tl.atomic_add(flag_ptr + c, 0, sem="acquire", scope="gpu") != epoch:
                        pass
                    acc += tl.load(part_ptr + tl.cast(c, tl.int64) * (BM * BN) + offs, cache_modifier=".cg")
                    nxt = (c + 1) * per
                    c += 1
                offs_m = pid_m * BM + tl.arange(0, BM)
                store_tile(c_ptr, acc, offs_m, pid_n * BN + tl.arange(0, BN), M, N, scm, scn)
            else:
                tl.store(part_ptr + tl.cast(pid, tl.int64) * (BM * BN) + offs, acc)
                tl.debug_barrier()
                tl.atomic_xchg(flag_ptr + pid, epoch, sem="release", scope="gpu")
            acc = tl.zeros((BM, BN), dtype=tl.float32)


def make_streamk(a, b, out, bm, bn, bk, warps, stages, group_m=8, flat=False):
    """A call of the stream-K kernel (``flat``: :func:`streamk_flat_kernel`) on ``a @ b -> out`` (each call
    a new epoch)."""
    m, k = a.shape
    n = b.shape[1]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    grid = num_sms(a.device)
    part = torch.empty(grid * bm * bn, dtype=torch.float32, device=a.device)
    flags = torch.zeros(grid, dtype=torch.int32, device=a.device)
    scratch = Scratch()
    state = {"epoch": 0}

    def run():
        state["epoch"] += 1
        with scratch_allocator(scratch):
            (streamk_flat_kernel if flat else streamk_kernel)[(grid,)](
                a, b, out, part, flags, state["epoch"], m, n, k, a.stride(0), b.stride(0), b.stride(1),
                out.stride(0), out.stride(1), BM=bm, BN=bn, BK=bk, GROUP_M=group_m,
                B_ROW_MAJOR=b.stride(1) == 1, num_warps=warps, num_stages=stages,
            )  # fmt: skip

    return run, tiles


def key_row(m: int, n: int, k: int, layout: str) -> dict:
    """Every tile of one key, plain and stream-K, checked (NaN-poisoned, fp32 reference, three calls),
    then timed side by side with cuBLAS."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if layout == "nk":
        b = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).t()
    else:
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ref = a.float() @ b.float()
    fns, names, failed = [lambda: torch.matmul(a, b, out=out)], ["cublas"], {}
    for bm, bn, bk, warps, stages in TILES:
        for kind in ("plain", "sk", "skflat"):
            name = f"{kind} {bm}x{bn}x{bk} w{warps} s{stages}"
            try:
                if kind != "plain":
                    run, tiles = make_streamk(a, b, out, bm, bn, bk, warps, stages, flat=kind == "skflat")
                else:
                    run, tiles = make_plain(a, b, out, bm, bn, 0, bk, warps, stages)
                for _ in range(3):
                    out.fill_(float("nan"))
                    run()
                torch.cuda.synchronize()
            except Exception as e:  # a form that does not compile is reported, not fatal
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
    plain = min((t, nm) for nm, t in forms.items() if nm.startswith("plain"))
    sk = min(((t, nm) for nm, t in forms.items() if nm.startswith("sk ")), default=(float("nan"), "-"))
    flat = min(((t, nm) for nm, t in forms.items() if nm.startswith("skflat")), default=(float("nan"), "-"))
    print(
        f"M={m} N={n} K={k} {layout}: cublas {cb * 1e3:.1f} us | plain {plain[0] * 1e3:.1f} ({plain[1]}) "
        f"{cb / plain[0]:.3f} | stream-K {sk[0] * 1e3:.1f} ({sk[1]}) {cb / sk[0]:.3f} | flat "
        f"{flat[0] * 1e3:.1f} ({flat[1]}) {cb / flat[0]:.3f}",
        flush=True,
    )
    for nm, msg in failed.items():
        print(f"    {nm}: {msg}", flush=True)
    return {"M": m, "N": n, "K": k, "b_layout": layout, "cublas_ms": cb, "forms": forms, "failed": failed}


def main() -> None:
    rows = [key_row(*key) for key in KEYS]
    path = os.path.join(os.environ.get("OUT", "."), "streamk_probe.json")
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
