"""PyTorch's async TP with and without ``autotaxer.async_tp.enable()`` on a compiled sequence-parallel block.

    torchrun --nproc-per-node 2 bench/async_tp_check.py [--seq 4096] [--batch 1] [--hidden 8192]
        [--ffn 28672] [--modes fwd,train] [--table tuned.json] [--misses-out DIR] [--json-out FILE]

For each mode (``fwd``: inference forward; ``train``: forward + backward) the block of
:mod:`autotaxer.testing.sp_block` (bf16) is compiled twice, each timed after warm-up: plain
``torch.compile``, then ``torch.compile`` with async TP (``_micro_pipeline_tp``, symmetric memory for the
group). The async-TP code is timed with torch's fused kernels and, the same compiled code, with
``autotaxer.async_tp.enable()``, interleaved sample by sample. Then every fused-op call the compiled code
made is replayed alone on random inputs of its sizes and strides, torch's kernel against autotaxer's.
Times are medians of ``--samples`` samples of ``--iters`` back-to-back calls (CUDA events), max over ranks.
Prints the counters and, per call, its problem key and whether autotaxer served it. ``--misses-out DIR``
writes the keys without a tuned record as ``DIR/ag_gemm.csv`` and ``DIR/gemm_rs.csv`` for ``autotaxer
tune``; ``--table`` serves a table of such a tuning (default: the shipped tables).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings
from collections.abc import Callable, Collection
from pathlib import Path


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", type=int, default=4096, help="global sequence length (sharded)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--ffn", type=int, default=28672, help="global FFN size (sharded)")
    p.add_argument("--modes", default="fwd,train", help="comma-separated: fwd, train")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--table", default=None, help="table file or folder to serve (default: shipped tables)")
    p.add_argument("--misses-out", default=None, help="folder for the untuned keys as shapes files")
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    for m in modes:
        if m not in ("fwd", "train"):
            p.error(f"--modes: unknown mode {m!r} (expected fwd, train)")
    for name in ("iters", "samples"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: must be at least 1")
    args.modes = modes
    return args


def _time(
    fns: dict[str, Callable[[], object]],
    iters: int,
    samples: int,
    warmup: int,
    with_autotaxer: Collection[str] = (),
) -> dict[str, float]:
    """Median ms per call of each function (interleaved samples), max over ranks; the functions named in
    ``with_autotaxer`` run with ``autotaxer.async_tp`` enabled, the others without (switched untimed)."""
    import torch
    import torch.distributed as dist

    import autotaxer.async_tp as atp
    from autotaxer.tools.one_rank import ms_per_call

    def switch(name: str) -> None:
        if name in with_autotaxer:
            atp.enable()
        else:
            atp.disable()

    for name, fn in fns.items():
        switch(name)
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(samples):
        for name, fn in fns.items():
            switch(name)
            dist.barrier()
            torch.cuda.synchronize()
            times[name].append(ms_per_call(fn, iters))
    med = torch.tensor([statistics.median(t) for t in times.values()], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    return dict(zip(fns, med.tolist(), strict=True))


def _block_step(mode: str, shape, rank: int, ws: int) -> Callable[[Callable], Callable[[], object]]:
    """``make(fn)``: a no-argument call of one forward (``fwd``) or forward + backward (``train``)."""
    import torch

    from autotaxer.testing.sp_block import full_weights, shard_weights

    full = full_weights(shape, 0, "cuda")
    w = shard_weights(full, rank, ws, torch.bfloat16)
    del full
    x = torch.randn(shape.seq // ws, shape.batch, shape.hidden, device="cuda", dtype=torch.bfloat16)
    if mode == "fwd":
        w = {k: v.detach() for k, v in w.items()}
    else:
        x.requires_grad_()
    grad = torch.randn_like(x)

    def make(fn: Callable) -> Callable[[], object]:
        if mode == "fwd":

            def fwd() -> object:
                with torch.no_grad():
                    return fn(x, w)

            return fwd

        def train() -> object:
            y = fn(x, w)
            y.backward(grad)
            return y

        return train

    return make


def _replay(calls: list[dict], args: argparse.Namespace) -> list[dict]:
    """Each fused-op call of the compiled code alone: torch's kernel against autotaxer's, each call waiting
    for the previous one's output as in the tuner (:class:`autotaxer.measure.Chain`; the link alone timed
    beside them and subtracted: ``link_ms``). A served call is also timed as the tuner times its variant
    (``direct_ms``: the plan's run into one reused output), so a gap between ``autotaxer_ms`` and it is the
    served call path's, and between ``direct_ms`` and the record's ``confirmed_us`` the process state's."""
    import torch

    from autotaxer.integrations._signature import resolve_group
    from autotaxer.measure import Chain, less_link
    from autotaxer.runtime.dispatch import runtime_for

    rows = []
    for c in calls:
        # what served the call: the variant and parameters, to compare with the tuner's record of the key
        rt = runtime_for(resolve_group(c["args"]["group_name"]))
        decision = {k.text: d for k, d in rt.decisions().items()}.get(c["key"])
        if decision is not None:
            c = {**c, "variant": decision.variant, "params": dict(decision.params)}
        ins = []
        for size, stride, dtype in c["inputs"]:
            t = torch.empty_strided(size, stride, dtype=getattr(torch, dtype), device="cuda")
            ins.append(t.normal_())
        op = getattr(torch.ops.symm_mem, c["op"])
        a = c["args"]
        if c["op"] == "fused_all_gather_matmul":

            def fn(ins=ins, a=a, op=op) -> object:
                return op(ins[0], ins[1:], a["gather_dim"], a["group_name"], return_A=a["return_A"])[1][0]
        else:

            def fn(ins=ins, a=a, op=op) -> object:
                return op(ins[0], ins[1], a["reduce_op"], a["scatter_dim"], a["group_name"])

        chain = Chain(ins[0])
        fns = {"torch": chain.wrap(fn), "autotaxer": chain.wrap(fn), "link": chain.alone()}
        direct = _direct(rt, c, ins) if c["served"] and decision is not None else None
        if direct is not None:  # the served plan's run into one reused output: what the tuner times
            fns["direct"] = Chain(ins[0], direct[1]).wrap(direct[0])
        t = _time(fns, args.iters, args.samples, 3, {"autotaxer"})
        row = {**c, "link_ms": t["link"]}
        for name in ("torch", "autotaxer", "direct"):
            if name in t:
                row[f"{name}_ms"] = less_link(t[name], t["link"])
        rows.append(row)
    return rows


def _direct(rt, call: dict, ins: list) -> tuple[Callable[[], object], object]:
    """``(fn, out)``: the served plan of ``call`` run on its 2-D inputs into ``out``, without the async-TP
    kernel, ``integrations.autograd.serve`` or an output per call (collective: every rank replays the
    same calls)."""
    import autotaxer.async_tp as atp
    from autotaxer.integrations._signature import to_matrix

    args = call["args"]
    if call["op"] == "fused_all_gather_matmul":
        a2d, dim = to_matrix(ins[0], args["gather_dim"])
        layout = {"gather_dim": dim}
    else:
        a2d, dim = atp._rs_matrix(ins[0], args["scatter_dim"])
        layout = {"scatter_dim": dim}
    plan = rt.plan(atp.OPS[call["op"]], a2d, ins[1], **layout)
    inputs = (a2d, ins[1])
    out = plan.run(plan.workspace, inputs, plan.ctx, None)
    return (lambda: plan.run(plan.workspace, inputs, plan.ctx, out)), out


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    import torch._inductor.config
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem

    import autotaxer
    import autotaxer.async_tp as atp
    from autotaxer.testing.sp_block import BlockShape, sp_block

    rank, ws = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1")
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    shape = BlockShape(args.seq, args.batch, args.hidden, args.ffn)
    try:
        shape.validate(ws)
    except ValueError as e:
        print(f"error: --{str(e)}", file=sys.stderr)
        return 2
    group = dist.group.WORLD
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(group.group_name)
    autotaxer.init(autotaxer.RuntimeConfig(tables=(args.table,) if args.table else ()))
    results: dict = {"shape": vars(shape), "world_size": ws, "device": torch.cuda.get_device_name()}

    def block(x, w):
        return sp_block(x, w, group)

    for mode in args.modes:
        make = _block_step(mode, shape, rank, ws)
        torch._dynamo.reset()
        torch._inductor.config._micro_pipeline_tp = False
        plain = _time(
            {"compile": make(torch.compile(block, fullgraph=True))}, args.iters, args.samples, args.warmup
        )
        torch._dynamo.reset()
        torch._inductor.config._micro_pipeline_tp = True
        step = make(torch.compile(block, fullgraph=True))
        atp.reset_counters()
        fns = {"async_tp": step, "async_tp+autotaxer": step}
        t = _time(fns, args.iters, args.samples, args.warmup, {"async_tp+autotaxer"})
        atp.disable()
        results[mode] = {"ms": plain | t, "counters": atp.counters()}
        results[mode]["speedup"] = t["async_tp"] / t["async_tp+autotaxer"]
    results["calls"] = _replay(atp.decisions(), args)
    atp.disable()
    if args.misses_out and rank == 0:
        from autotaxer.runtime._runtimes import get_runtime
        from autotaxer.runtime.misses import write_shapes_csv

        Path(args.misses_out).mkdir(parents=True, exist_ok=True)
        misses = get_runtime(None).misses()
        for op in ("ag_gemm", "gemm_rs"):
            if any(m.key.op == op for m in misses):
                write_shapes_csv(misses, Path(args.misses_out) / f"{op}.csv", op=op)
    if rank == 0:
        _print(results)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(results, indent=2, default=str))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _print(results: dict) -> None:
    s = results["shape"]
    print(f"# {results['device']} x{results['world_size']}: seq {s['seq']}, batch {s['batch']}, "
          f"hidden {s['hidden']}, ffn {s['ffn']}, bf16 (median ms, max over ranks)")  # fmt: skip
    for mode in ("fwd", "train"):
        if mode not in results:
            continue
        ms = results[mode]["ms"]
        line = ", ".join(f"{k} {v:.3f}" for k, v in ms.items())
        print(f"{mode}: {line}; autotaxer over torch's async TP x{results[mode]['speedup']:.3f}")
        print(f"{mode} counters: {results[mode]['counters']}")
    print("calls (torch ms / autotaxer ms, served, key):")
    for c in results["calls"]:
        ratio = c["torch_ms"] / c["autotaxer_ms"]
        direct = f" (its run alone {c['direct_ms']:.3f})" if "direct_ms" in c else ""
        print(f"  {c['op']} {c['inputs'][0][0]} {c['args']}: {c['torch_ms']:.3f} / {c['autotaxer_ms']:.3f}"
              f"{direct} "
              f"(x{ratio:.3f}) served={c['served']} {c['key']} {c.get('variant', '')} "
              f"{c.get('params', '')}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
