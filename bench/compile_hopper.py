"""Compile the fused ag_gemm kernels for Hopper (sm_90) without a GPU and report what the K loop became.

The launch arguments come from the real launcher (``_ag_fused.launch``) with a stand-in kernel that
records them; they are specialised exactly as Triton's JIT does at launch (an integer equal to 1
becomes a constant, integers and pointers divisible by 16 get ``tt.divisibility=16``), then compiled
for ``GPUTarget("cuda", 90, 32)``. Per kernel it prints the shared memory Triton allocates
(``metadata.shared``), the number of ``cp.async`` copies (pipelined loads), of ``wgmma.mma_async``
and of ``wgmma.wait_group`` (2 = the MMA is pipelined across iterations), next to the persistent GEMM
of ``kernels/gemm.py``, and checks the shared-memory estimate of the variants' ``check()``.

    python bench/compile_hopper.py [--m 4096] [--n 8192] [--k 8192] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re


class _Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kw)`` records the launch."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.launches: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append((grid, args, kw))


def _specialise(fn, args, kwargs):
    """``(signature, constexprs, attrs, options)`` as the JIT would derive them for this launch."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    names = fn.arg_names
    values = dict(zip(names, args, strict=False))
    values.update(kwargs)
    sig, consts, attrs = {}, {}, {}
    for i, name in enumerate(names):
        value = values[name]
        if fn.params[i].is_constexpr:
            sig[name] = "constexpr"
            consts[name] = value
            continue
        ty, attr = native_specialize_impl(BaseBackend, value, False, True, True)
        if ty == "constexpr":
            sig[name] = "constexpr"
            consts[name] = attr
        else:
            sig[name] = ty
            if attr == "D":
                attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, consts, attrs, options


def compile_for_hopper(fn, args, kwargs):
    """Compile ``fn`` for sm_90 as launched with ``args``/``kwargs``; returns the compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, consts, attrs, options = _specialise(fn, args, dict(kwargs))
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def summary(kernel) -> dict:
    """Shared memory and the pipelining evidence in a compiled kernel's PTX."""
    ptx = kernel.asm["ptx"]
    return {
        "shared": kernel.metadata.shared,
        "cp_async": len(re.findall(r"cp\.async\.c[ag]\.shared", ptx)),
        "cp_async_bulk": len(re.findall(r"cp\.async\.bulk", ptx)),
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "wgmma_wait": len(re.findall(r"wgmma\.wait_group", ptx)),
        "ld_global_v4": len(re.findall(r"ld\.global[a-z.:0-9]*\.v4", ptx)),
        "st_global_v4": len(re.findall(r"st\.global[a-z.:0-9]*\.v4", ptx)),
    }


def fused_launch(kind: str, m: int, n: int, k: int, gather_dim: int, params: dict, world_size: int = 2):
    """Record the launch of the ``kind`` kernel for one problem and config; returns ``(fn, args, kw)``."""
    import torch

    from autotaxer.kernels import _ag_fused, ag_gemm_pull, ag_gemm_push

    fn = {"push": ag_gemm_push, "pull": ag_gemm_pull}[kind].KERNEL
    config = _ag_fused.FusedConfig(**params)
    ms, ks = _ag_fused.shard_dims(m, k, world_size, gather_dim)
    dt = torch.bfloat16
    rec = _Recorder(fn)
    buf_shape = _ag_fused.buffer_shape(kind, ms, ks, world_size)
    geo = _ag_fused.geometry(config, ms, ks)
    _ag_fused.launch(
        rec,
        a_shard=torch.empty(ms, ks, dtype=dt),
        b=torch.empty(k, n, dtype=dt),
        out=torch.empty(m, n, dtype=dt),
        buf=torch.empty(buf_shape, dtype=dt),
        flags=torch.zeros(_ag_fused.flags_count(geo, world_size), dtype=torch.int32),
        sync=torch.zeros(2, dtype=torch.int32),
        heap_bases=torch.zeros(world_size, dtype=torch.int64),
        rank=0,
        world_size=world_size,
        gather_dim=gather_dim,
        config=config,
        num_sms=132,
    )
    _, args, kw = rec.launches[0]
    return fn, args, kw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    from autotaxer._problem import ProblemKey, Target
    from autotaxer.kernels.gemm import GemmConfig, gemm
    from autotaxer.ops.ag_gemm.push import PushVariant

    rows = []
    cfg = GemmConfig()
    rec = _Recorder(None)
    import autotaxer.kernels.gemm as gemm_mod

    real, gemm_mod._gemm_kernel = gemm_mod._gemm_kernel, rec
    try:
        dt = torch.bfloat16
        gemm(torch.empty(args.m, args.k, dtype=dt), torch.empty(args.k, args.n, dtype=dt),
             torch.empty(args.m, args.n, dtype=dt), cfg)
    finally:
        gemm_mod._gemm_kernel = real
    _, a, kw = rec.launches[0]
    rows.append({"kernel": "gemm", "gather_dim": None, **summary(compile_for_hopper(real, a, kw))})
    target = Target("nvidia-h200", "sm_90", 132)
    params = {"block_m": 128, "block_n": 256, "block_k": 64, "group_m": 8, "num_warps": 8,
              "num_stages": 3, "comm_sms": 16, "row_chunks": 4, "k_chunks": 1}
    for kind in ("push", "pull"):
        for gd in (0, 1):
            key = ProblemKey.make("ag_gemm", target.gpu_model, 2, "bf16",
                                  {"M": args.m, "N": args.n, "K": args.k}, {"gather_dim": gd})
            fn, a, kw = fused_launch(kind, args.m, args.n, args.k, gd, params)
            row = {"kernel": kind, "gather_dim": gd, **summary(compile_for_hopper(fn, a, kw))}
            row["check_estimate"] = PushVariant().smem_estimate(key, params)
            rows.append(row)
    for r in rows:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
