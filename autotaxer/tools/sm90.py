"""Compile the fused ag_gemm kernels for Hopper (sm_90) without a GPU and report what the K loop became.

The launch arguments come from the real launcher's argument builder (``ag_gemm.fused._launch_args``);
they are bound and specialised by Triton's own JIT binder (:func:`compile_for_hopper`), then compiled
for ``GPUTarget("cuda", 90, 32)``. Per kernel it prints the shared memory Triton allocates
(``metadata.shared``), registers and local memory per thread (``cuobjdump`` on the cubin; the ptxas
bundled with Triton chooses them, so they match a GPU run of the same Triton: triton 3.6 here gives the
counts ``bench/gemm_vs_cublas.py --resources`` read on the H200s), the number of ``cp.async``
copies (pipelined loads), of ``wgmma.mma_async`` and of ``wgmma.wait_group`` (2 = the MMA is pipelined
across iterations), next to the persistent GEMM of ``kernels/common/gemm.py``, and checks the
shared-memory estimate of the variants' ``check()``.

    python -m autotaxer.tools.sm90 [--m 4096] [--n 8192] [--k 8192] [--kinds push,pull] [--json F]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re


class _Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kw)`` records the launch."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.launches: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launches.append((grid, args, kw))


def compile_for_hopper(fn, args, kwargs):
    """Compile ``fn`` (a Triton or Gluon kernel) for sm_90 as launched with ``args``/``kwargs``; returns
    the compiled kernel.

    The arguments are bound and specialised by Triton's own JIT binder (an integer equal to 1 becomes a
    constant, integers and pointers divisible by 16 get ``tt.divisibility=16``, tuples leaf by leaf;
    ``do_not_specialize`` honoured), exactly as a launch does, only against the sm_90 back end instead of
    the current device."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kwargs = dict(kwargs)
    bound, specialization, options = create_function_from_signature(fn.signature, fn.params, backend)(
        *args, **kwargs
    )
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    source = GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource
    src = source(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=target, options=options.__dict__)


def _resources(cubin: bytes) -> dict:
    """Registers and local memory (spills) per thread from ``cuobjdump --dump-resource-usage`` (the one
    bundled with Triton) on ``cubin``; empty when the tool is not there."""
    import os
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+).*LOCAL:(\d+)", text)
    return {"registers": int(found.group(1)), "local_bytes": int(found.group(2))} if found else {}


def summary(kernel) -> dict:
    """Shared memory, registers and spills (ptxas's choice, as on a GPU with this Triton) and the
    pipelining evidence in a compiled kernel's PTX."""
    ptx = kernel.asm["ptx"]
    return {
        "shared": kernel.metadata.shared,
        **_resources(kernel.asm["cubin"]),
        "cp_async": len(re.findall(r"cp\.async\.c[ag]\.shared", ptx)),
        "cp_async_bulk": len(re.findall(r"cp\.async\.bulk", ptx)),
        "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
        "wgmma_wait": len(re.findall(r"wgmma\.wait_group", ptx)),
        "ld_global_v4": len(re.findall(r"ld\.global[a-z.:0-9]*\.v4", ptx)),
        "st_global_v4": len(re.findall(r"st\.global[a-z.:0-9]*\.v4", ptx)),
    }


def fused_launch(kind: str, m: int, n: int, k: int, gather_dim: int, params: dict, world_size: int = 2):
    """Record the launch of the ``kind`` kernel (``push``, ``pull`` or ``push_tma``: push's arguments) for one
    problem and config; returns ``(fn, args, kw)``."""
    import torch

    from autotaxer.kernels.ag_gemm import fused

    config = fused.FusedConfig(**params)
    ms, ks = fused.shard_dims(m, k, world_size, gather_dim)
    dt = torch.bfloat16
    geo = fused.geometry(config, ms, ks)
    _, args, kw = fused._launch_args(
        "push" if kind == "push_tma" else kind,
        a_shard=torch.empty(ms, ks, dtype=dt),
        b=torch.empty(k, n, dtype=dt),
        out=torch.empty(m, n, dtype=dt),
        flags=torch.zeros(fused.flags_count(geo, world_size), dtype=torch.int32),
        sync=torch.zeros(fused.SYNC_WORDS, dtype=torch.int64),
        heap_bases=torch.zeros(world_size, dtype=torch.int64),
        rank=0,
        world_size=world_size,
        gather_dim=gather_dim,
        config=config,
        num_sms=132,
        phase="all",
        inbox=torch.empty(fused.inbox_shape(ms, ks, world_size), dtype=dt),
        tma=kind == "push_tma",
    )
    return fused.KERNEL, args, kw


def ws_launch(m: int, n: int, k: int, gather_dim: int, config, world_size: int = 2, col_b: bool = False,
              dtype: str = "bf16", produce: bool = False, rank: int = 0, forward: bool = False):  # fmt: skip
    """The launch of ``push_ws``'s warp-specialised consumer (Gluon,
    ``kernels/ag_gemm/experimental/ws.py``) for one
    problem and ``WsConfig``, as its launcher builds it (CPU tensors: only shapes and alignment matter;
    ``produce``: the CTAs move the shard first, ``comm_sms=0``; ``rank`` 1 is specialised to a constant, as
    at launch; ``forward``: the forward warp sends the boxes instead, one flag per box); returns
    ``(fn, args, kw)``."""
    import torch

    from autotaxer.kernels.ag_gemm.experimental.ws import KERNEL, launch_args
    from autotaxer.kernels.ag_gemm.fused import inbox_shape, shard_dims

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    ms, ks = shard_dims(m, k, world_size, gather_dim)
    b = torch.empty(n, k, dtype=dt).t() if col_b else torch.empty(k, n, dtype=dt)
    geometry = (ms, 1, max(1, ks // 8), 8)
    if forward:
        geometry = (config.block_m, -(-ms // config.block_m), config.block_k, -(-ks // config.block_k))
    _, args, kw = launch_args(
        a_shard=torch.empty(ms, ks, dtype=dt), b=b, out=torch.empty(m, n, dtype=dt),
        inbox=torch.empty(inbox_shape(ms, ks, world_size), dtype=dt),
        flags=torch.zeros(64, dtype=torch.int32), sync=torch.zeros(2, dtype=torch.int64), arrivals=132,
        rank=rank, world_size=world_size, gather_dim=gather_dim, geometry=geometry, config=config, grid=128,
        heap_bases=torch.zeros(world_size, dtype=torch.int64) if produce or forward else None,
        forward=forward,
    )  # fmt: skip
    return KERNEL, args, kw


CONFIGS = [  # FusedConfig fields in order: block_m, block_n, block_k, group_m, warps, stages, comm_sms,
    # row_chunks, k_chunks, prefetch_k
    (128, 256, 64, 8, 8, 3, 16, 4, 1, 0),
    (128, 128, 64, 8, 4, 4, 16, 8, 1, 0),
    (16, 64, 128, 8, 4, 4, 8, 1, 4, 0),
    (16, 128, 128, 8, 4, 4, 8, 4, 1, 1024),
    (64, 128, 128, 8, 4, 3, 16, 1, 2, 0),
    (16, 128, 128, 8, 4, 4, 0, 4, 8, 0),  # comm_sms=0: every program produces, one K loop per tile
    (128, 128, 64, 8, 4, 4, 0, 16, 8, 0),
]


def gemm_launch(m: int, n: int, k: int, config=None):
    """Record the launch of the persistent GEMM of ``kernels/common/gemm.py`` (bf16, ``config`` or its
    default)
    for one problem; returns ``(fn, args, kw)`` like :func:`fused_launch`."""
    import torch

    import autotaxer.kernels.common.gemm as gemm_mod

    real, rec = gemm_mod._gemm_kernel, _Recorder(None)
    gemm_mod._gemm_kernel = rec
    try:
        dt = torch.bfloat16
        gemm_mod.gemm(
            torch.empty(m, k, dtype=dt), torch.empty(k, n, dtype=dt), torch.empty(m, n, dtype=dt), config
        )
    finally:
        gemm_mod._gemm_kernel = real
    _, args, kw = rec.launches[0]
    return real, args, kw


def _gemm_row(m: int, n: int, k: int) -> dict:
    return {"kernel": "gemm", "M": m, **summary(compile_for_hopper(*gemm_launch(m, n, k)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", default="4096,16")
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--kinds", default="push,pull")
    parser.add_argument("--json")
    args = parser.parse_args()
    from autotaxer.kernels.ag_gemm.fused import FusedConfig
    from autotaxer.kernels.common.gemm import smem_bytes

    rows = [_gemm_row(4096, args.n, args.k)]
    print(json.dumps(rows[0]), flush=True)
    for m in (int(x) for x in args.m.split(",")):
        for c in CONFIGS:
            params = dataclasses.asdict(FusedConfig(*c))
            if params["block_m"] > max(16, m):
                continue
            for kind in args.kinds.split(","):
                for gd in (0, 1):
                    fn, a, kw = fused_launch(kind, m, args.n, args.k, gd, params)
                    row = {
                        "kernel": kind,
                        "M": m,
                        "gather_dim": gd,
                        "params": c,
                        **summary(compile_for_hopper(fn, a, kw)),
                        "smem_estimate": smem_bytes(FusedConfig(**params), 2),
                    }
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
