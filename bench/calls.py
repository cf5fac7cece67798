"""One fused-op call measured every way: the tuner's trial against the served call, the layer's async-TP
calls replayed alone, and a stored speedup against both (issue 46's tools).

    torchrun --nproc-per-node 2 bench/calls.py served-vs-trial [--op gemm_rs] [--M 4096 --N 8192 --K 8192]
        [--variant copy_engine] [--params '{"streams": 1, "signal": "memop"}'] [--json-out FILE]
    python3 -P bench/calls.py agreement --layer layer.json --db sqlite:///layer.sqlite --out agreement.json

``served-vs-trial`` (issue 46: on 2xH200 the tuner's confirmation timed ``gemm_rs`` ``copy_engine``
(M=4096 N=8192 K=8192, scatter_dim 0, nk) at 463 µs while async TP's replay of the same call through
``autotaxer.async_tp`` read 694 µs). Every entry below runs the same variant with the same parameters on
the same inputs, in one :func:`autotaxer.measure.time_interleaved` (chained, link subtracted: what the
tuner's confirmation does), each layer of the served call added one at a time:

* ``trial``: the variant through :func:`autotaxer.runtime.replay.launcher` (a CUDA-graph replay where the
  variant is replayed), its own workspace, one output reused (what the tuner times);
* ``eager``: ``variant.run(ws, inputs, ctx, out=out)`` (every launch from Python: the tuner before
  2026-11-27's replays);
* ``fresh_out``: ``trial`` with ``out=None`` (a fresh output per call, as served calls get);
* ``serve``: :func:`autotaxer.integrations.autograd.serve` ``(rt, "async_tp", ...)`` with the runtime's
  plan and workspace (decision set to the variant: ``Runtime.serve_decision``);
* ``async_tp``: the kernel ``autotaxer.async_tp`` registers, called on async TP's 3-D input (sizes and
  strides as inductor's calls; the dispatcher hop itself is not in it);
* ``dispatcher``: ``torch.ops.symm_mem.<op>`` with ``autotaxer.async_tp`` enabled: what compiled code and
  the replay call (on gloo the override is registered for the CPU key, as the CPU tests do);
* ``torch``: torch's own fused kernel, called as a function (CUDA only).

Then the replay's timing of ``trial`` and ``async_tp`` (:func:`time_calls`: fixed order, no lead-in call)
and, per entry, the host's time to enqueue one call (perf_counter around ``--iters`` calls before the
device is synchronised): an entry whose host time per call reaches its device time is bound by the host,
not the GPU. Max over ranks; µs per call. Runs on gloo (CPU) too, with a CPU variant (``--variant bsp``),
as a smoke test.

:func:`replay` (``bench/layer.py`` with the mode ``async_tp_autotaxer``): every fused-op call async TP's
compiled code made, alone on random inputs of its sizes and strides, torch's kernel against autotaxer's.

``agreement`` (does a stored speedup hold in the layer?), after ``bench/layer.py --write-shapes``, ``autotaxer
tune`` over those shapes and ``bench/layer.py --modes plain_compile,autotaxer_compile,async_tp,
async_tp_autotaxer --db ... --out layer.json``: for every call of ``layer.json``'s ``async_tp_calls``, the
key's record in the database: its confirmed speedup over torch's fused op (``env["confirmed_us"]``; over
the fastest BSP form where torch's op was not measured) against the replay's ratio; ``agree`` when they
are within ``--within`` (3%). Per case, the step's gain (``async_tp`` over ``async_tp_autotaxer``) against
the gain the replays predict: the step less each of its calls' replayed saving (a call of the case = its
key's ``M`` is the case's rows, ``S * batch``; one call per signature and step is assumed, which holds for
the forward of one layer), and, where both ran, ``plain_compile`` over ``autotaxer_compile``. Records that
were not confirmed show no ratio (the tuner's best trial against one BSP sample). The replay times each
call waiting for the last one's output, as the tuner does unless a key was tuned with ``--chain
back-to-back``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any


def _served_options(p: argparse.ArgumentParser) -> None:
    """``served-vs-trial``: the problem, the variant and its parameters, the timing."""
    p.add_argument("--op", default="gemm_rs", choices=("gemm_rs", "ag_gemm"))
    p.add_argument("--M", type=int, default=4096)
    p.add_argument("--N", type=int, default=8192)
    p.add_argument("--K", type=int, default=8192)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--variant", default="copy_engine")
    p.add_argument("--params", default='{"streams": 1, "signal": "memop"}', help="JSON object")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json-out", default=None)


def host_us(fn: Any, iters: int, on_cuda: bool) -> float:
    """µs per call the host takes to enqueue ``iters`` calls (the device synchronised before and after)."""
    import torch

    if on_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = time.perf_counter() - t0
    if on_cuda:
        torch.cuda.synchronize()
    return host * 1e6 / iters


def served_vs_trial(args: argparse.Namespace) -> int:
    """The ``served-vs-trial`` table (every rank runs it; rank 0 prints and writes ``--json-out``)."""
    import torch
    import torch.distributed as dist

    import autotaxer.async_tp as atp
    from autotaxer._problem import ProblemKey
    from autotaxer.integrations.autograd import serve
    from autotaxer.measure import Chain, maxes_over_ranks, time_interleaved
    from autotaxer.ops import get_op
    from autotaxer.runtime.lookup import EXACT, Decision
    from autotaxer.runtime.replay import launcher
    from autotaxer.tools.bench_ranks import join_ranks

    rt, on_cuda = join_ranks(29533)
    group = dist.group.WORLD
    ctx, ws_n = rt.ctx, dist.get_world_size()
    dtype = "fp32" if not on_cuda and args.dtype == "bf16" else args.dtype
    layout = {"scatter_dim": 0} if args.op == "gemm_rs" else {"gather_dim": 0}
    key = ProblemKey.make(
        args.op, ctx.target.gpu_model, ws_n, dtype, {"M": args.M, "N": args.N, "K": args.K},
        {**layout, "b_layout": "nk"},
    )  # fmt: skip
    op = get_op(args.op)
    op.validate(key)
    variant, params = op.variants[args.variant], json.loads(args.params)
    inputs = op.make_inputs(key, ctx.rank, ctx.device, 1234)
    a, b = inputs
    a3 = a.view(a.shape[0], 1, a.shape[1])  # async TP's sequence-parallel (S, batch 1, H) input
    gn = group.group_name

    ws = variant.prepare(key, params, ctx)
    run = launcher(op, variant, key, ctx.device)
    out = op.empty_output(key, ctx.device)
    rt.serve_decision(key, Decision(args.variant, params, EXACT, 0.0, key))
    if args.op == "gemm_rs":
        from autotaxer.ops._torch_symm import matmul_reduce_scatter as torch_rs

        fns = {
            "trial": lambda: run(ws, inputs, ctx, out=out),
            "eager": lambda: variant.run(ws, inputs, ctx, out=out),
            "fresh_out": lambda: run(ws, inputs, ctx),
            "serve": lambda: serve(rt, "async_tp", "gemm_rs", (a, b), layout)[0],
            "async_tp": lambda: atp._matmul_reduce_scatter(a3, b, "sum", 0, gn),
            "dispatcher": lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a3, b, "sum", 0, gn),
            "torch": lambda: torch_rs(a3, b, "sum", 0, gn),
        }
    else:
        from autotaxer.ops._torch_symm import all_gather_matmul as torch_ag

        fns = {
            "trial": lambda: run(ws, inputs, ctx, out=out),
            "eager": lambda: variant.run(ws, inputs, ctx, out=out),
            "fresh_out": lambda: run(ws, inputs, ctx),
            "serve": lambda: serve(rt, "async_tp", "ag_gemm", (a, b), layout)[0],
            "async_tp": lambda: atp._all_gather_matmul(a3, [b], 0, gn, return_A=False)[1][0],
            "dispatcher": lambda: torch.ops.symm_mem.fused_all_gather_matmul(a3, [b], 0, gn, return_A=False)[
                1
            ][0],
            "torch": lambda: torch_ag(a3, [b], 0, gn, return_A=False)[1][0],
        }
    # the dispatcher entry reaches autotaxer's kernel (on gloo registered for the CPU key, as the CPU tests
    # do); the other entries call functions directly
    atp._install("CUDA" if on_cuda else "CPU")
    if not on_cuda:  # torch's fused kernel is CUDA's
        del fns["torch"]
    fns["async_tp"]()  # decides the signature (collective) before any timing
    chains = [Chain(a, out) if name in ("trial", "eager") else Chain(a) for name in fns]
    got = time_interleaved(
        list(fns.values()), ctx, ("eager",), args.warmup, args.iters, args.samples, chains=chains
    )
    tuner = {name: r.get("eager") for name, r in zip(fns, got, strict=True)}
    link_us = got[0].get("eager_link")
    replayed = [n for n in ("trial", "async_tp", "dispatcher") if n in fns]
    replay = _replay_times({n: fns[n] for n in replayed}, Chain(a), args, ctx, on_cuda)
    host = maxes_over_ranks([host_us(Chain(a).wrap(fn), args.iters, on_cuda) for fn in fns.values()], ctx)
    served = atp.counters()
    result = {
        "key": key.text, "variant": args.variant, "params": params, "world_size": ws_n,
        "device": torch.cuda.get_device_name() if on_cuda else "cpu",
        "interleaved_us": tuner, "link_us": link_us, "replay_timing_us": replay,
        "host_us_per_call": dict(zip(fns, host, strict=True)), "async_tp_counters": served,
    }  # fmt: skip
    if ctx.rank == 0:
        print(f"# {result['device']} x{ws_n}: {key.text} {args.variant} {params} (µs a call, max over ranks)")
        print(f"{'entry':<10} {'interleaved':>12} {'host':>10}")
        for name in fns:
            t, h = tuner[name], result["host_us_per_call"][name]
            print(f"{name:<10} {'failed' if t is None else f'{t:.1f}':>12} {h:>10.1f}")
        timed = ", ".join(f"{n} {t:.1f}" for n, t in replay.items())
        print(f"link {link_us}; the replay's timing (fixed order, no lead-in call): {timed}")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
    atp.disable()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _replay_times(fns: dict[str, Any], chain: Any, args: argparse.Namespace, ctx: Any, on_cuda: bool) -> dict:
    """:func:`time_calls`' order: fixed order, a barrier and a synchronisation before each sample,
    no lead-in call, link subtracted; µs, max over ranks."""
    import statistics

    import torch.distributed as dist

    from autotaxer.measure import less_link, maxes_over_ranks

    wrapped = {name: chain.wrap(fn) for name, fn in fns.items()} | {"link": chain.alone()}
    for fn in wrapped.values():
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in wrapped}
    for _ in range(args.samples):
        for name, fn in wrapped.items():
            dist.barrier()
            times[name].append(_timed_us(fn, args.iters, on_cuda))
    meds = maxes_over_ranks([statistics.median(t) for t in times.values()], ctx)
    got = dict(zip(wrapped, meds, strict=True))
    return {name: less_link(got[name], got["link"]) for name in fns}


def _timed_us(fn: Any, iters: int, on_cuda: bool) -> float:
    if not on_cuda:
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e6 / iters
    import torch

    from autotaxer.tools.one_rank import ms_per_call

    torch.cuda.synchronize()
    return ms_per_call(fn, iters) * 1e3


def time_calls(
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


def replay(calls: list[dict], iters: int = 20, samples: int = 7) -> list[dict]:
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
        t = time_calls(fns, iters, samples, 3, {"autotaxer"})
        row = {**c, "link_ms": t["link"]}
        for name in ("torch", "autotaxer", "direct"):
            if name in t:
                row[f"{name}_ms"] = less_link(t[name], t["link"])
        rows.append(row)
    return rows


def _direct(rt: Any, call: dict, ins: list) -> tuple[Callable[[], object], object]:
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


def _agreement_options(ap: argparse.ArgumentParser) -> None:
    """``agreement``: the layer run, its database and the tolerance."""
    ap.add_argument("--layer", required=True, help="bench/layer.py's --out (with async_tp_autotaxer)")
    ap.add_argument("--db", required=True, help="the database the layer's warm-up stored its winners in")
    ap.add_argument("--within", type=float, default=0.03, help="relative difference that still agrees")
    ap.add_argument("--out", default="", help="write the rows as JSON here")


def key_rows(calls: list[dict[str, Any]], db: Any, within: float) -> list[dict[str, Any]]:
    """Per replayed call: its key, the record's confirmed speedups and the replay's ratio."""
    from autotaxer import ProblemKey
    from autotaxer.records import confirmed_times, is_confirmed

    rows = []
    for c in calls:
        row: dict[str, Any] = {"op": c["op"], "key": c["key"], "served": c["served"]}
        row["replay"] = c["torch_ms"] / c["autotaxer_ms"]
        row["saving_ms"] = c["torch_ms"] - c["autotaxer_ms"]
        rec = db.get_winner(ProblemKey.from_text(c["key"])) if c["key"] else None
        if rec is None:
            rows.append({**row, "note": "no record in the database"})
            continue
        times = confirmed_times(rec.env)
        row.update(variant=rec.variant, confirmed=is_confirmed(rec.env), chain=rec.env.get("chain"))
        if row["confirmed"]:
            row["stored_x_bsp"] = rec.speedup
            base = "torch_fused" if "torch_fused" in times else None
            row["stored_x_torch"] = times[base] / rec.median_us if base else None
            stored = row["stored_x_torch"] if base else rec.speedup
            row["agree"] = abs(stored / row["replay"] - 1) <= within
        rows.append(row)
    return rows


def case_rows(results: dict[str, Any], keys: list[dict[str, Any]], batch: int) -> list[dict[str, Any]]:
    """Per case: the step's measured gain and the gain its calls' replayed savings predict."""
    from autotaxer import ProblemKey

    out = []
    for case, modes in results.items():
        if case == "async_tp_calls" or ":" not in case:
            continue
        base, mine = modes.get("async_tp", {}).get("ms"), modes.get("async_tp_autotaxer", {}).get("ms")
        if base is None or mine is None:
            continue
        rows = int(case.split(":")[1]) * batch
        saving = sum(k["saving_ms"] for k in keys if k["key"] and ProblemKey.from_text(k["key"])["M"] == rows)
        row = {"case": case, "async_tp_ms": base, "autotaxer_ms": mine, "step_gain": base / mine,
               "predicted_gain": base / (base - saving) if base > saving else None}  # fmt: skip
        plain, layers = modes.get("plain_compile", {}).get("ms"), modes.get("autotaxer_compile", {}).get("ms")
        if plain is not None and layers is not None:  # autotaxer's layers compiled, against torch.compile
            row["compile_gain"] = plain / layers
        out.append(row)
    return out


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


def agreement(args: argparse.Namespace) -> int:
    """The ``agreement`` table of a layer run and its database."""
    from autotaxer.storage import open_database

    with open(args.layer) as f:
        layer = json.load(f)
    calls = layer["results"].get("async_tp_calls")
    if not calls:
        why = "no async_tp_calls (run bench/layer.py with the mode async_tp_autotaxer)"
        print(f"error: {args.layer}: {why}", file=sys.stderr)
        return 2
    with open_database(args.db, read_only=True) as db:
        keys = key_rows(calls, db, args.within)
    cases = case_rows(layer["results"], keys, layer["config"]["batch"])
    for k in keys:
        stored = _x(k.get("stored_x_torch") or k.get("stored_x_bsp")) if k.get("confirmed") else "unconfirmed"
        agree = {True: "agree", False: "DIFFER"}.get(k.get("agree"), "-")
        print(f"{k['key']}: {k.get('variant', '-')} stored {stored} (x bsp {_x(k.get('stored_x_bsp'))}), "
              f"replay {_x(k['replay'])} served={k['served']} {agree} {k.get('note', '')}")  # fmt: skip
    for c in cases:
        print(f"{c['case']}: step {_x(c['step_gain'])}, predicted by the replays {_x(c['predicted_gain'])}, "
              f"compiled layers over torch.compile {_x(c.get('compile_gain'))}")  # fmt: skip
    if args.out:
        doc = {"layer": args.layer, "db": args.db, "within": args.within, "keys": keys, "cases": cases}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    _served_options(sub.add_parser("served-vs-trial", help="one variant timed as the tuner and as served"))
    _agreement_options(sub.add_parser("agreement", help="stored speedups against a layer run's replays"))
    args = ap.parse_args(argv)
    return served_vs_trial(args) if args.command == "served-vs-trial" else agreement(args)


if __name__ == "__main__":
    sys.exit(main())
