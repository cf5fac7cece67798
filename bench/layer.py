"""The layer benchmark: one Llama-class decoder layer with sequence-parallel TP, every way users run it.

    python bench/layer.py --out layer.json            # 2 GPUs, Llama-3-70B sizes (starts its 2 ranks)
    torchrun --nproc-per-node 2 bench/layer.py --cases train:4096,fwd:256 --modes plain_compile,async_tp
    python bench/layer.py --device cpu --cases fwd:64 --modes plain_eager,autotaxer_eager --hidden 256 \
        --heads 4 --kv-heads 2 --head-dim 64 --ffn 512 --reps 3    # a CPU smoke run on 2 gloo ranks

Outside a launch the script checks the device and starts ``--nproc-per-node`` ranks under torchrun; a
usage error or missing GPUs end it with one ``error:`` line and exit 2 (under torchrun each rank exits 2,
and torchrun adds its own report).

Modes (rows), each on the same weights (:class:`autotaxer.models.TPLlamaLayer`):

* ``plain_eager``: PyTorch's functional collectives + ``F.linear``, eager;
* ``autotaxer_eager``: the projections through autotaxer's TP layers (dispatch), eager;
* ``plain_compile``: ``plain`` under ``torch.compile`` (the users' baseline);
* ``async_tp``: ``plain`` under ``torch.compile`` with inductor's micro-pipeline TP pass (PyTorch's async
  TP: ``torch.ops.symm_mem`` fused all-gather-matmul and matmul-reduce-scatter);
* ``async_tp_autotaxer``: ``async_tp``'s compiled code with ``autotaxer.async_tp.enable()`` (torch's fused
  ops served by autotaxer where it has a record; switched on around each of its steps only);
* ``autotaxer_compile``: autotaxer's layers under ``torch.compile``;
* ``functions_eager`` / ``functions_compile``: the projections through autotaxer's torch-signature
  functions, as code written for PyTorch's async TP calls them (``fused_all_gather_matmul(x, [W.t()], 0,
  group_name, return_A=False)``, ``fused_matmul_reduce_scatter(x, W.t(), "sum", 0, group_name)``), eager
  and under ``torch.compile``;
* ``ceiling``: ``torch.compile`` of the layer with its communication removed.

Cases (columns): ``train:S`` (forward + backward of the layer input and every weight), ``fwd:S``
(forward under ``torch.no_grad``), ``graph:S`` (forward captured in one CUDA graph and replayed), at a
global sequence length ``S`` (``--batch`` sequences). Steps are interleaved over the modes (every
repetition runs each mode once after a barrier, starting one mode later than the repetition before, so
no mode always follows the same one), each timed with CUDA events; a mode's time is the median over
repetitions of the slowest rank. Compiled modes use static shapes per case. The table prints ms and
ratios to ``plain_eager`` and to ``plain_compile``, then per case and mode what served the timed steps'
calls (:func:`autotaxer.served`: per key and call path, the variant and its calls, ``tuned`` /
``untuned`` / ``fell back``; a BSP that ``torch.compile`` traced into the graph while the mode warmed up
is listed as traced, its calls uncounted; a ``graph`` case's replays never reach autotaxer, so only its
capture is listed), and per case how each replayed workspace's calls were launched (``launches``: CUDA-graph
captures and replays, or why its launcher turned eager; :mod:`autotaxer.runtime.replay`); ``--out`` writes
every sample, the device, the versions and what dispatch served (per case and mode: ``served``).
``--warmup-budget S`` first runs ``autotaxer.warmup`` (S seconds) on each autotaxer mode's step of a
case, so keys no table covers are tuned in the launch (``--check-graphs``: a graph case's in-step check
times its forward as CUDA-graph replays, as the case runs it); with ``async_tp_autotaxer``, every
fused-op call its compiled code made is then replayed alone, torch's kernel against autotaxer's (``--out``:
``async_tp_calls``).
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import gc
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any, NoReturn

import torch
import torch.distributed as dist

#: seconds a rank may take to leave after the results are written (then: its stacks, and exit)
EXIT_WAIT_S = 60

MODES = (
    "plain_eager", "autotaxer_eager", "plain_compile", "async_tp", "async_tp_autotaxer", "autotaxer_compile",
    "functions_eager", "functions_compile", "ceiling",
)  # fmt: skip
#: Modes whose keys ``--warmup-budget`` tunes, in this order: a key is tuned and checked in the step of the
#: first mode that calls it, and the later modes are served what that check decided, so autotaxer's own
#: compiled layers (the comparison with ``torch.compile``) come first and async TP's step last (on 4xH200
#: async TP's check ran first and served ``torch_fused`` to the compiled layers: 0.93x ``torch.compile``).
TUNED_MODES = ("autotaxer_compile", "functions_compile", "autotaxer_eager", "functions_eager",
               "async_tp_autotaxer")  # fmt: skip
DEFAULT_CASES = "train:4096,train:8192,fwd:256,fwd:4096,fwd:16384,graph:64,graph:256"
#: The CPU smoke run the missing-GPU error suggests (the README's).
CPU_SMOKE = (
    "python bench/layer.py --device cpu --cases fwd:64 --modes plain_eager,autotaxer_eager --hidden 256 "
    "--heads 4 --kv-heads 2 --head-dim 64 --ffn 512 --reps 3"
)
COMM = {"plain_eager": "plain", "autotaxer_eager": "autotaxer", "plain_compile": "plain",
        "async_tp": "plain", "async_tp_autotaxer": "plain", "autotaxer_compile": "autotaxer",
        "functions_eager": "functions", "functions_compile": "functions", "ceiling": "none"}  # fmt: skip
#: Modes that run eager (the others are compiled).
EAGER_MODES = ("plain_eager", "autotaxer_eager", "functions_eager")


def _parse_cases(text: str) -> list[tuple[str, int]]:
    cases = []
    for item in text.split(","):
        kind, _, s = item.strip().partition(":")
        if kind not in ("train", "fwd", "graph") or not s.isdigit():
            _usage(f"--cases: {item!r} is not train:S, fwd:S or graph:S")
        cases.append((kind, int(s)))
    return cases


def _usage(message: str) -> NoReturn:
    """End the run with one ``error:`` line and exit 2 (in a launch: rank 0's line only)."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _check_device(device: str, cases: list[tuple[str, int]], modes: list[str], nproc: int) -> None:
    """A usage error where the device cannot run the cases and modes: CUDA graphs and async TP need CUDA,
    ``--device cuda`` one GPU a rank (a launch's ranks, else ``--nproc-per-node``)."""
    if device == "cpu":
        if any(k == "graph" for k, _ in cases) or {"async_tp", "async_tp_autotaxer"} & set(modes):
            _usage("--device cpu: graph cases and the async_tp modes need CUDA (choose --cases and --modes)")
        return
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", nproc))
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if visible < ranks:
        need = f"{ranks} rank(s) need {ranks} GPU(s), {visible} visible"
        _usage(f"--device cuda: {need}; a CPU smoke run: {CPU_SMOKE}")


def _launch(nproc: int, argv: list[str]) -> NoReturn:
    """Outside a launch: run this script's ``nproc`` ranks under torchrun (this process becomes torchrun)."""
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    os.execv(sys.executable, [*run, os.path.abspath(__file__), *argv])


def _build(mode: str, base: Any, group_name: str) -> Any:
    """The callable of ``mode``: a shallow copy of ``base`` (the same parameters) set to its comm."""
    layer = copy.copy(base).set_comm(COMM[mode])
    if mode in EAGER_MODES:
        return layer
    options = None
    if mode in ("async_tp", "async_tp_autotaxer"):
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group_name)
        options = {"_micro_pipeline_tp": True}
    return torch.compile(layer, fullgraph=True, dynamic=False, options=options)


class _Step:
    """One timed step of a mode at one case (``serve_async_tp``: ``prepare`` switches ``autotaxer.async_tp``
    on before it runs)."""

    def __init__(
        self, fn: Any, params: list[torch.Tensor], kind: str, x: torch.Tensor, grad: torch.Tensor,
        serve_async_tp: bool = False,
    ) -> None:  # fmt: skip
        self.fn, self.params, self.kind, self.x, self.grad = fn, params, kind, x, grad
        self.serve_async_tp = serve_async_tp
        self.graph: Any = None

    def prepare(self) -> None:
        """Switch ``autotaxer.async_tp`` on for this step, off for the others (untimed, before each run)."""
        atp = sys.modules.get("autotaxer.async_tp")
        if self.serve_async_tp:
            import autotaxer.async_tp as atp

            atp.enable()
        elif atp is not None:
            atp.disable()

    def __call__(self) -> None:
        if self.kind == "train":
            for p in self.params:
                p.grad = None
            self.x.grad = None
            self.fn(self.x).backward(self.grad)
        elif self.kind == "fwd":
            with torch.no_grad():
                self.fn(self.x)
        else:
            self.graph.replay()

    def capture(self) -> None:
        """Warm up on a side stream, then capture the forward in one CUDA graph (``graph`` cases)."""
        from autotaxer._capture import gc_paused

        x = self.x.detach()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):
                self.fn(x)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with gc_paused(), torch.cuda.graph(self.graph), torch.no_grad():
            self.out = self.fn(x)
        torch.cuda.synchronize()

    def release(self) -> None:
        """Destroy the captured graph (it holds the NCCL communicator of the collectives it captured:
        ``destroy_process_group`` waits for every such graph to go)."""
        from autotaxer.measure import release_graphs

        if self.graph is not None:
            release_graphs([self.graph])
            self.graph = None


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time_case(steps: dict[str, _Step], reps: int, warmup: int) -> dict[str, Any]:
    """Interleaved timing: per repetition every mode once, after a barrier; slowest rank per sample (CUDA
    events on GPUs, the wall clock on CPUs)."""
    import autotaxer

    errors: dict[str, str] = {}
    live = dict(steps)
    served: dict[str, dict[tuple, dict[str, Any]]] = {mode: {} for mode in live}
    for mode, step in list(live.items()):
        try:
            before = autotaxer.served()
            step.prepare()
            if step.kind == "graph":
                step.capture()
            for _ in range(warmup):
                step()
            _sync()
            # what torch.compile traced into the graph as plain PyTorch (its calls are never counted)
            _add_served(served[mode], [r for r in autotaxer.served(since=before) if r.calls is None])
        except Exception as exc:  # noqa: BLE001  (reported in the table, the other modes go on)
            errors[mode] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            traceback.print_exc()
            del live[mode]
    failed = [None] * dist.get_world_size()
    dist.all_gather_object(failed, sorted(errors))
    for mode in {m for per_rank in failed for m in per_rank}:  # every rank drops what any rank could not run
        live.pop(mode, None)
        errors.setdefault(mode, "failed on another rank")
    cuda = torch.cuda.is_available()
    samples = torch.zeros(len(live), reps, device="cuda" if cuda else "cpu")
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    steps = list(live.values())
    for rep in range(reps):
        for i in (*range(rep % len(steps), len(steps)), *range(rep % len(steps))):  # a rotating order
            step = steps[i]
            step.prepare()
            before = autotaxer.served()
            dist.barrier()
            _sync()
            if cuda:
                start.record()
            t = time.perf_counter()
            step()
            if cuda:
                end.record()
            _sync()
            samples[i, rep] = start.elapsed_time(end) if cuda else (time.perf_counter() - t) * 1e3
            _add_served(served[list(live)[i]], autotaxer.served(since=before))
    atp = sys.modules.get("autotaxer.async_tp")
    if atp is not None:
        atp.disable()
    dist.all_reduce(samples, op=dist.ReduceOp.MAX)
    out: dict[str, Any] = {m: {"error": e} for m, e in errors.items()}
    for i, mode in enumerate(live):
        values = samples[i].tolist()
        out[mode] = {
            "ms": statistics.median(values),
            "samples_ms": values,
            "served": list(served[mode].values()),
        }
    return out


def _add_served(total: dict[tuple, dict[str, Any]], rows: list[Any]) -> None:
    """Add one step's :func:`autotaxer.served` rows to a mode's ``(key, path, variant) -> row`` totals."""
    for row in rows:
        where = (row.key, row.path, row.variant)
        old = total.get(where)
        entry = row.to_dict()
        if old is not None:
            if entry["calls"] is not None:
                entry["calls"] += old["calls"] or 0
            entry["traces"] += old["traces"]
        total[where] = entry


def _served_lines(results: dict[str, dict[str, Any]], modes: list[str]) -> str:
    """Per case and mode, what served the timed steps' calls (one line per key, path and variant)."""
    from autotaxer.runtime.served import Served

    lines = []
    for case, per_mode in results.items():
        for mode in modes:
            rows = per_mode.get(mode, {}).get("served")
            if rows is None:
                continue
            lines.append(f"served {case} {mode}:" + ("" if rows else " nothing through autotaxer"))
            for row in rows:
                fields = {k: v for k, v in row.items() if k != "status"}
                lines.append("  " + Served(**fields).line())
    return "\n".join(lines)


def _served(group: Any) -> list[dict[str, Any]]:
    """What dispatch served for each key the layer called (variant, where the decision came from)."""
    from autotaxer.runtime.dispatch import get_runtime

    rt = get_runtime(group)
    if rt is None:
        return []
    return [
        {"key": k.text, "variant": d.variant, "params": dict(d.params), "source": d.source}
        for k, d in sorted(rt.decisions().items(), key=lambda kv: kv[0].text)
    ]


def _launches(group: Any) -> list[dict[str, Any]]:
    """How the calls of each workspace kept so far were launched (``Runtime.launch_stats``: CUDA-graph
    captures and replays, or why its launcher turned eager)."""
    from autotaxer.runtime.dispatch import get_runtime

    rt = get_runtime(group)
    return [] if rt is None else rt.launch_stats()


def _launch_lines(results: dict[str, dict[str, Any]]) -> str:
    """Per case, one line per replayed workspace: captures, replays, and whether it turned eager."""
    lines = []
    for case, per_case in results.items():
        for row in per_case.get("launches") or ():
            state = "replayed" if row["off"] is None else f"turned eager ({row['off']})"
            lines.append(f"launches {case} {row['key']} {row['variant']}: {row['captures']} capture(s), "
                         f"{row['replays']} replay(s), {row['graphs']} graph(s) held, {state}")  # fmt: skip
    return "\n".join(lines) if lines else "launches: no replayed workspace"


def _ratio(base: dict[str, Any], mine: dict[str, Any]) -> str:
    return f"{base['ms'] / mine['ms']:.2f}" if "ms" in base else "-"


def _table(results: dict[str, dict[str, Any]], modes: list[str]) -> str:
    cols = list(results)
    lines = ["ms (x plain eager / x torch.compile)".ljust(20) + "".join(c.rjust(24) for c in cols)]
    for mode in modes:
        row = mode.ljust(20)
        for c in cols:
            r, eager, comp = (
                results[c].get(mode, {}),
                results[c].get("plain_eager", {}),
                results[c].get("plain_compile", {}),
            )
            if "ms" not in r:
                row += "failed".rjust(24)
                continue
            row += f"{r['ms']:.3f} ({_ratio(eager, r)}/{_ratio(comp, r)})".rjust(24)
        lines.append(row)
    return "\n".join(lines)


def paired(base: list[float], mine: list[float]) -> tuple[float, float, float] | None:
    """The per-repetition ratios ``base / mine`` of two modes timed in the same repetitions (interleaved:
    a drift of the machine cancels): their median and quartiles; None without samples."""
    ratios = sorted(b / m for b, m in zip(base, mine, strict=True) if m > 0)
    if not ratios:
        return None
    n = len(ratios)
    return statistics.median(ratios), ratios[(n - 1) // 4], ratios[(3 * (n - 1) + 3) // 4]


def _paired_table(results: dict[str, dict[str, Any]], modes: list[str]) -> str:
    """Per mode and case, the paired ratio to ``plain_compile``: median [first quartile, third quartile]
    of the repetitions' ratios (the spread says whether a few percent is a gain or noise)."""
    cols = list(results)
    lines = ["x torch.compile, paired: median [q1, q3]".ljust(20) + "".join(c.rjust(24) for c in cols)]
    for mode in modes:
        if mode == "plain_compile":
            continue
        row = mode.ljust(20)
        for c in cols:
            base, mine = results[c].get("plain_compile", {}), results[c].get(mode, {})
            got = paired(base.get("samples_ms", []), mine.get("samples_ms", [])) if "ms" in mine else None
            row += (f"{got[0]:.2f} [{got[1]:.2f}, {got[2]:.2f}]" if got else "-").rjust(24)
        lines.append(row)
    return "\n".join(lines)


def layer_options(ap: argparse.ArgumentParser) -> None:
    """The layer's sizes (Llama-3-70B's by default), the timing and the device."""
    ap.add_argument("--batch", type=int, default=1, help="sequences a step (default 1)")
    ap.add_argument("--hidden", type=int, default=8192, help="hidden size H (default 8192)")
    ap.add_argument("--heads", type=int, default=64, help="attention heads (default 64)")
    ap.add_argument("--kv-heads", type=int, default=8, help="key/value heads, GQA (default 8)")
    ap.add_argument("--head-dim", type=int, default=128, help="size of a head (default 128)")
    ap.add_argument("--ffn", type=int, default=28672, help="SwiGLU intermediate size (default 28672)")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions of every mode (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps of every mode first (default 3)")
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda",
        help="cuda: NCCL, bf16, one GPU a rank (default); cpu: gloo, fp32, a smoke run of the script",
    )  # fmt: skip


def start(device_name: str) -> tuple[torch.device, torch.dtype]:
    """Join the launch's process group: NCCL on this rank's GPU in bf16, or (a smoke run of a script)
    gloo on CPU in fp32; multicast off."""
    for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}.items():
        os.environ.setdefault(k, v)
    if device_name == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
        return device, torch.bfloat16
    dist.init_process_group("gloo")
    return torch.device("cpu"), torch.float32


def make_layer(cfg: Any, device: torch.device, dtype: torch.dtype, rank: int) -> Any:
    """This rank's shard of the layer (``comm="plain"``), weights drawn from a per-rank seed."""
    from autotaxer.models import TPLlamaLayer

    torch.manual_seed(1234 + rank)
    layer = TPLlamaLayer(cfg, "plain", device=device, dtype=dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    return layer


def main(argv: list[str] | None = None) -> int:
    from autotaxer.models import LlamaConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cases",
        default=DEFAULT_CASES,
        help=f"comma-separated train:S, fwd:S, graph:S (default {DEFAULT_CASES})",
    )
    ap.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated modes (default: all; {', '.join(MODES)})"
    )
    ap.add_argument(
        "--nproc-per-node", type=int, default=2, help="ranks to start when not run under torchrun (default 2)"
    )
    layer_options(ap)
    ap.add_argument(
        "--tables", default="", help="comma-separated table files for autotaxer (default: shipped)"
    )
    ap.add_argument(
        "--no-shipped", action="store_true", help="serve no shipped table (tuning_db/): only --tables, --db"
    )
    ap.add_argument(
        "--timing",
        choices=("any", "eager", "graph"),
        default="any",
        help="serve only records tuned with this timing (autotaxer.RuntimeConfig(timing=...)): graph for "
        "the graph cases of a shipped table, as code under CUDA graphs is served; any (default): a key's "
        "eager record where it has both",
    )
    ap.add_argument(
        "--out", default="", help="JSON file of every sample, the device, versions and what was served"
    )
    ap.add_argument(
        "--write-shapes",
        metavar="PATH",
        help="write the shapes file of every problem the cases dispatch (for autotaxer tune) and exit; "
        "needs --world-size",
    )
    ap.add_argument("--world-size", type=int, default=0, help="with --write-shapes: the ranks to shard over")
    ap.add_argument(
        "--warmup-budget",
        type=float,
        default=0.0,
        help="seconds of autotaxer.warmup per autotaxer mode and case",
    )
    ap.add_argument(
        "--check-graphs",
        action="store_true",
        help="graph cases: the warm-up's in-step check times the forward captured in a CUDA graph per arm",
    )
    ap.add_argument("--db", default="", help="the runtime's database (warm-up trials and winners)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        _usage(f"--modes: unknown {unknown} (known: {', '.join(MODES)})")
    cases = _parse_cases(args.cases)
    cfg = LlamaConfig(args.hidden, args.heads, args.kv_heads, args.head_dim, args.ffn)
    if args.write_shapes:
        return _write_shapes(args.write_shapes, cfg, args.world_size, cases, args.batch)

    _check_device(args.device, cases, modes, args.nproc_per_node)
    if "LOCAL_RANK" not in os.environ:
        _launch(args.nproc_per_node, sys.argv[1:] if argv is None else argv)
    device, dtype = start(args.device)
    rank, ws = dist.get_rank(), dist.get_world_size()
    group_name = dist.group.WORLD.group_name

    import autotaxer

    tables = tuple(t for t in args.tables.split(",") if t)
    autotaxer.init(
        autotaxer.RuntimeConfig(
            tables=tables,
            persist_misses=False,
            db_url=args.db or None,
            shipped_tables=not args.no_shipped,
            timing=None if args.timing == "any" else args.timing,
        )
    )
    base = make_layer(cfg, device, dtype, rank)
    params = list(base.parameters())
    # Every mode compiles the same forward (one code object) for every case: static shapes per case, as a
    # user with fixed sizes gets (automatic dynamic shapes would trace later cases symbolically), and room
    # for all of them in dynamo's cache (past its limit a frame runs eager).
    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
    fns = {m: _build(m, base, group_name) for m in modes if m != "async_tp_autotaxer"}
    if "async_tp_autotaxer" in modes:  # the same compiled code as async_tp's, served by autotaxer
        built = fns.get("async_tp")  # (a compiled module has no truth value: compare with None)
        if built is None:
            built = _build("async_tp_autotaxer", base, group_name)
        fns["async_tp_autotaxer"] = built

    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for kind, s in cases:
        if s % ws:
            _usage(f"--cases: S={s} is not divisible by the world size {ws}")
        x = torch.randn(s // ws, args.batch, cfg.hidden, device=device, dtype=dtype)
        x.requires_grad_(kind == "train")
        grad = torch.randn_like(x)
        steps = {m: _Step(fns[m], params, kind, x, grad, m == "async_tp_autotaxer") for m in modes}
        if args.warmup_budget > 0:
            _warm_up(steps, args.warmup_budget, rank, args.check_graphs)
        if "async_tp_autotaxer" in modes:
            import autotaxer.async_tp as atp

            atp.reset_counters()
        results[f"{kind}:{s}"] = _time_case(steps, args.reps, args.warmup)
        if "async_tp_autotaxer" in modes:
            results[f"{kind}:{s}"]["async_tp_counters"] = atp.counters()
        results[f"{kind}:{s}"]["launches"] = _launches(None)
        if rank == 0:
            print(f"{kind}:{s} done at {time.perf_counter() - t0:.0f} s", flush=True)
        if args.out and rank == 0:
            _write(args, results, modes, ws)
        for step in steps.values():
            step.release()
        del steps
        if device.type == "cuda":
            torch.cuda.empty_cache()
    calls = _replay_async_tp(args) if "async_tp_autotaxer" in modes else None
    if rank == 0:
        if calls is not None:
            results["async_tp_calls"] = calls
        if args.out:
            _write(args, results, modes, ws)
        print(_table({c: r for c, r in results.items() if c != "async_tp_calls"}, modes))
        if "plain_compile" in modes:
            print(_paired_table({c: r for c, r in results.items() if c != "async_tp_calls"}, modes))
        print(_served_lines({c: r for c, r in results.items() if c != "async_tp_calls"}, modes))
        print(_launch_lines({c: r for c, r in results.items() if c != "async_tp_calls"}))
        for c in calls or ():
            dim = c["args"].get("gather_dim", c["args"].get("scatter_dim"))
            direct = f"(its run alone {c['direct_ms']:.3f}) " if "direct_ms" in c else ""
            print(f"  {c['op']} {c['inputs'][0][0]} dim {dim}: "
                  f"torch {c['torch_ms']:.3f} / autotaxer {c['autotaxer_ms']:.3f} ms "
                  f"{direct}"
                  f"(x{c['torch_ms'] / c['autotaxer_ms']:.3f}) served={c['served']} {c['key']} "
                  f"{c.get('variant', '')} {c.get('params', '')}")  # fmt: skip
    # the results are written: a rank still here after EXIT_WAIT_S (a barrier, the group's teardown, the
    # interpreter's exit) prints every thread's stack and exits instead of holding the launch
    faulthandler.dump_traceback_later(EXIT_WAIT_S, exit=True)
    gc.collect()  # a CUDA graph with a collective in it, still referenced, holds the teardown
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _warm_up(steps: dict[str, _Step], budget_s: float, rank: int, check_graphs: bool = False) -> None:
    """``autotaxer.warmup`` on the step of each autotaxer mode (a ``graph`` case's as its forward, its
    trials timed as CUDA-graph replays, checked in CUDA graphs with ``check_graphs``)."""
    import autotaxer

    for mode in TUNED_MODES:
        step = steps.get(mode)
        if step is None:
            continue
        graphs = check_graphs and step.kind == "graph"
        # a graph case's step is replayed: its trials are timed as replays (eager host time left out)
        timing = "graph" if step.kind == "graph" and torch.cuda.is_available() else None
        if step.kind == "graph":
            step = _Step(step.fn, step.params, "fwd", step.x, step.grad, step.serve_async_tp)
        step.prepare()
        t0 = time.perf_counter()
        report = autotaxer.warmup(
            step, budget_s=budget_s, progress=rank == 0, check_graphs=graphs, timing=timing
        )
        if rank == 0:
            print(
                f"warm-up of {mode}: {len(report.results)} key(s) in {time.perf_counter() - t0:.0f} s",
                flush=True,
            )


def _replay_async_tp(args: Any) -> list[dict[str, Any]] | None:
    """Every fused-op call async TP's compiled code made, alone: torch's kernel against autotaxer's
    (``bench/calls.py``'s :func:`replay`); None on CPUs."""
    if not torch.cuda.is_available():
        return None
    import importlib.util
    from pathlib import Path

    import autotaxer.async_tp as atp

    spec = importlib.util.spec_from_file_location("calls_bench", Path(__file__).with_name("calls.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls = module.replay(atp.decisions(), iters=20, samples=7)
    atp.disable()
    return calls


def _write_shapes(path: str, cfg: Any, world_size: int, cases: list[tuple[str, int]], batch: int) -> int:
    from autotaxer.models import layer_problems

    if world_size < 1:
        _usage("--write-shapes needs --world-size")
    cfg.validate(world_size)
    rows: dict[tuple, dict[str, Any]] = {}
    for kind, s in cases:
        for row in layer_problems(cfg, world_size, s * batch, train=kind == "train"):
            rows.setdefault(tuple(sorted(row.items())), row)
    fields = ["op", "M", "N", "K", "dtype", "gather_dim", "scatter_dim", "b_layout"]
    with open(path, "w") as f:
        f.write(",".join(fields) + "\n")
        for row in rows.values():
            f.write(",".join(str({**row, "dtype": "bf16"}.get(name, "")) for name in fields) + "\n")
    print(f"{len(rows)} problems written to {path}")
    return 0


def _write(args: Any, results: dict[str, Any], modes: list[str], ws: int) -> None:
    import autotaxer

    doc = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "world_size": ws,
        "torch": torch.__version__,
        "autotaxer": autotaxer.__version__,
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "config": {k: getattr(args, k) for k in ("batch", "hidden", "heads", "kv_heads", "head_dim", "ffn")},
        "reps": args.reps,
        "modes": modes,
        "results": results,
        "served": _served(None),
    }
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    raise SystemExit(main())
