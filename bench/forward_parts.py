"""``push_ws_fwd``'s kernel taken apart on 2 GPUs, side by side (``time_interleaved``, graph): as it runs;
with the forward warp but no wait for the peer's boxes (what forwarding costs this rank's own tiles; the
output is wrong); and the GEMM alone in the same tile order (no forward warp, no wait). N=K=8192, 128x128
tiles on two MMA warpgroups, 5 stages, tile groups of 8.

    python3 -P bench/forward_parts.py --problems 256:0,512:0,256:1 --out F.json
"""

from __future__ import annotations

import argparse
import json


def _rank(ctx, problems: list[tuple[int, int]], iters: int, samples: int) -> list[dict]:
    import torch
    from autotaxer.kernels.ag_gemm.experimental.push_ws import ws_config
    from autotaxer.kernels.ag_gemm.experimental.ws import KERNEL, launch_args
    from autotaxer.kernels.ag_gemm.fused import (
        SYNC_WORDS,
        FusedConfig,
        flags_count,
        geometry,
        inbox_shape,
        shard_dims,
    )

    from autotaxer.measure import time_interleaved

    heap = ctx.iris()
    bases = heap.get_heap_bases()
    rows = []
    for m, gd in problems:
        n = k = 8192
        ms, ks = shard_dims(m, k, 2, gd)
        gen = torch.Generator(device=ctx.device).manual_seed(ctx.rank)
        shard = torch.randn(ms, ks, device=ctx.device, dtype=torch.bfloat16, generator=gen)
        b = torch.randn(k, n, device=ctx.device, dtype=torch.bfloat16, generator=gen)
        out = torch.empty(m, n, device=ctx.device, dtype=torch.bfloat16)
        config = FusedConfig(128, 128, 64, 8, 8, 5, 0, -(-ms // 128), -(-ks // 64), 0)
        geo = geometry(config, ms, ks)
        entries, names = [], []
        for name, forward, wait in (("as it runs", True, True), ("forwarding, no wait", True, False),
                                    ("GEMM alone", False, False)):  # fmt: skip
            inbox = heap.zeros(*inbox_shape(ms, ks, 2), dtype=torch.bfloat16)
            flags = heap.zeros(flags_count(geo, 2), dtype=torch.int32)
            sync = torch.zeros(SYNC_WORDS, dtype=torch.int64, device=ctx.device)
            grid, args, options = launch_args(
                a_shard=shard, b=b, out=out, inbox=inbox, flags=flags, sync=sync, arrivals=132, rank=ctx.rank,
                world_size=2, gather_dim=gd, geometry=(geo.row_width, geo.n_row, geo.col_width, geo.n_col),
                config=ws_config(config), grid=132, wait=wait, heap_bases=bases if forward else None,
                forward=forward,
            )  # fmt: skip
            if not forward:  # the same tile order as forwarding in one wave (no local-first clamp)
                args[KERNEL.arg_names.index("group_m")] = config.group_m

            def run(args=args, sync=sync, grid=grid, options=options):
                sync[0:1].add_(132)
                KERNEL[(grid,)](*args, **options)

            entries.append(run)
            names.append(name)
        heap.barrier()
        timed = time_interleaved(entries, ctx, modes=("graph",), iters=iters, samples=samples)
        for name, t in zip(names, timed, strict=True):
            rows.append({"M": m, "gather_dim": gd, "entry": name, **t})
    return rows


def main() -> None:
    from autotaxer.testing import run_ranks

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--problems", default="256:0,512:0,256:1", help="comma list of M:gather_dim")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    problems = [tuple(int(x) for x in s.split(":")) for s in a.problems.split(",")]
    rows = run_ranks(_rank, 2, "cuda", args=(problems, a.iters, a.samples), timeout=500)[0]
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    for r in rows:
        g = r.get("graph")
        print(f"M={r['M']:<5} gather_dim={r['gather_dim']}  {r['entry']:<22} graph {g and round(g, 1)}")


if __name__ == "__main__":
    main()
