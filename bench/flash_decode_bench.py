"""Side-by-side distributed flash decode (issue 5 item 5): BSP, fused, and the ceiling, on 2 GPUs.

For B in {1, 8, 32}, H=32, Hkv=8, D=128, S in {8k, 32k, 128k, 512k} (global context, sharded over the
ranks): BSP (split-KV decode + NCCL all-gather of the partials + combine kernel), the fused Iris kernel
(push + flags + in-kernel combine), and the ceiling = the local split-KV decode alone (no
communication, no combine). Each is swept over a capped list of configurations; every configuration is
checked against BSP's default output (and BSP against the fp32 reference on the smaller shapes) before
it is timed. Timing: eager (back-to-back) and CUDA-graph replay, median of samples after warm-up, max
across ranks (``autotaxer.measure.time_variant``). Speedups are against the faster BSP mode. With
``--dispatch`` it also times ``autotaxer.dispatch`` with whatever tuning table is installed, or only
with ``--table FILE`` (an exported table); the table's winner and each variant's default (the tuner's
first guess) join that variant's sweep, so BSP is always timed at the configuration dispatch falls
back to. Shapes run longest context first and rank 0 rewrites the JSON after every shape, so a run
cut short keeps the long-context rows. ``--device cpu`` is a gloo dry run (BSP and dispatch only).
``--summarize FILE`` prints the table of a finished (or partial) JSON, dispatch against BSP last.

    python bench/flash_decode_bench.py --quick --out bench/results/flash_decode_quick.json
    python bench/flash_decode_bench.py --quick --dispatch --table tuned.json --out fd.json
    python bench/flash_decode_bench.py --summarize fd.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

from autotaxer.testing import run_ranks

BS = (1, 8, 32)
SS = (8192, 32768, 131072, 524288)
WORLD_SIZE = 2
REFERENCE_LIMIT = 8 * 32768  # B * S up to which BSP is also checked against the fp32 reference


@dataclass(frozen=True)
class BenchConfig:
    """What to run; frozen so every rank gets the same plan."""

    bs: tuple[int, ...]
    ss: tuple[int, ...]
    h: int
    hkv: int
    d: int
    dtype: str
    splits: tuple[int, ...]
    blocks: tuple[tuple[int, int, int], ...]  # (block_n, num_warps, num_stages)
    warmup: int
    iters: int
    samples: int
    heap_gib: int
    dispatch: bool
    seed: int = 1234
    table: str | None = None  # exported tuning table: dispatch uses only it; its winners join the sweeps
    dispatch_timing: str | None = None  # RuntimeConfig.timing: serve only records timed this way


def _configs(cfg: BenchConfig, variant, key, target, extra: tuple[dict, ...] = ()) -> list[dict[str, int]]:
    """The capped sweep, after ``extra`` configurations (tuned winner, default) not already in it."""
    out = []
    for p in extra:
        if p not in out and variant.check(key, target, p) is None:
            out.append(dict(p))
    for bn, nw, ns in cfg.blocks:
        for s in cfg.splits:
            p = {"block_n": bn, "splits": s, "num_warps": nw, "num_stages": ns}
            if p not in out and variant.check(key, target, p) is None:
                out.append(p)
    return out


def _extra_configs(variant, key, target, tuned) -> tuple[dict, ...]:
    """The table's winner when it is this variant, then the variant's default (dispatch's fallback)."""
    extra = []
    if tuned is not None and tuned.variant == variant.name:
        extra.append(dict(tuned.params))
    extra.append(variant.default_params(key, target))
    return tuple(extra)


def _tuned_entry(rec) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {
        "variant": rec.variant,
        "params": dict(rec.params),
        "median_us": rec.median_us,
        "bsp_us": rec.bsp_us,
        "speedup": rec.speedup,
        "trials": rec.trials,
    }


def _sync(ctx) -> None:
    if ctx.target.device_type == "cuda":
        import torch

        torch.cuda.synchronize(ctx.device)


def _time(fn, ctx, cfg: BenchConfig) -> dict[str, Any]:
    from autotaxer.measure import time_variant

    out: dict[str, Any] = {}
    for mode in ("eager", "graph"):
        try:
            out[mode] = time_variant(
                fn, ctx, warmup=cfg.warmup, iters=cfg.iters, mode=mode, samples=cfg.samples
            )
        except Exception as exc:  # reported per entry
            out[mode] = None
            out[f"{mode}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def _best(entry: dict[str, Any] | None, mode: str | None = None) -> float | None:
    if not entry:
        return None
    modes = (mode,) if mode else ("eager", "graph")
    vals = [entry.get(m) for m in modes if entry.get(m) is not None]
    return min(vals) if vals else None


def _keep_best(best: dict[str, Any] | None, params: dict, timing: dict[str, Any]) -> dict[str, Any]:
    """Per mode, the fastest time seen so far and the configuration that gave it."""
    best = dict(best) if best is not None else {"eager": None, "graph": None}
    for mode in ("eager", "graph"):
        if timing.get(mode) is not None and (best[mode] is None or timing[mode] < best[mode]):
            best[mode] = timing[mode]
            best[f"{mode}_params"] = params
        elif timing.get(f"{mode}_error") and f"{mode}_error" not in best:
            best[f"{mode}_error"] = timing[f"{mode}_error"]
    return best


def _sweep(op, variant, key, ctx, inputs, cfg: BenchConfig, expect, extra=()) -> dict[str, Any]:
    """Best eager and best graph time over the capped configs; configs that fail the check are listed."""

    from autotaxer.measure import max_over_ranks
    from autotaxer.ops import relative_error

    best, failures = None, []
    configs = _configs(cfg, variant, key, ctx.target, extra)
    for params in configs:
        try:
            ws = variant.prepare(key, params, ctx)
            out = op.empty_output(key, ctx.device)
            variant.run(ws, inputs, ctx, out=out)
            _sync(ctx)
            err = max_over_ranks(relative_error(out, expect), ctx)  # every rank takes the same branch
            if not err <= op.tolerance(key):
                failures.append({"params": params, "error": f"relative error {err:.3g}"})
                continue
            timing = _time(lambda ws=ws, out=out: variant.run(ws, inputs, ctx, out=out), ctx, cfg)
            best = _keep_best(best, params, timing)
            del ws
        except Exception as exc:
            failures.append({"params": params, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return {"best": best, "failures": failures, "configs": len(configs)}


def _ceiling(key, ctx, inputs, cfg: BenchConfig, extra=()) -> dict[str, Any]:
    """The local split-KV decode alone, best over the same configurations."""
    import torch
    from autotaxer.kernels.flash_decode.partials import DecodeConfig, decode_partials

    from autotaxer.ops import get_op

    bsp = get_op("flash_decode").variants["bsp"]
    q, k, v, lens = inputs
    best = None
    for params in _configs(cfg, bsp, key, ctx.target, extra):
        c = DecodeConfig(**params)
        o = torch.empty((key["B"], key["H"], c.splits, key["D"]), dtype=torch.float32, device=ctx.device)
        lse = torch.empty((key["B"], key["H"], c.splits), dtype=torch.float32, device=ctx.device)
        timing = _time(lambda c=c, o=o, lse=lse: decode_partials(q, k, v, lens, o, lse, config=c), ctx, cfg)
        best = _keep_best(best, params, timing)
    return {"best": best}


def _dispatch(key, ctx, inputs, cfg: BenchConfig, expect) -> dict[str, Any]:

    from autotaxer import dispatch
    from autotaxer.ops import get_op, relative_error
    from autotaxer.runtime.dispatch import get_runtime

    try:
        out = get_op("flash_decode").empty_output(key, ctx.device)
        dispatch("flash_decode", *inputs, out=out)
        _sync(ctx)
        err = relative_error(out, expect)
        decision = get_runtime().decisions()[key]
        timing = _time(lambda: dispatch("flash_decode", *inputs, out=out), ctx, cfg)
        entry = dict(timing, variant=decision.variant, params=dict(decision.params), source=decision.source)
        return {"best": dict(entry, error=err)}
    except Exception as exc:
        return {"best": None, "error": f"{type(exc).__name__}: {exc}"[:300]}


def _init_dispatch(cfg: BenchConfig) -> None:
    """With ``--table``, dispatch reads that table only (no $AUTOTAXER_TABLE, no shipped tables)."""
    from autotaxer.runtime.dispatch import RuntimeConfig, init

    if cfg.dispatch and cfg.table is not None:
        init(
            RuntimeConfig(
                heap_size=cfg.heap_gib << 30,
                tables=(cfg.table,),
                env_tables=False,
                shipped_tables=False,
                persist_misses=False,
                timing=cfg.dispatch_timing,
            )
        )


def _bench_rank(ctx, cfg: BenchConfig, out_path: str | None = None) -> list[dict[str, Any]]:
    import torch

    from autotaxer._problem import ProblemKey
    from autotaxer.ops import get_op, relative_error
    from autotaxer.table_file import read_table

    op = get_op("flash_decode")
    ctx.heap_size = cfg.heap_gib << 30
    tuned = {r.key: r for r in read_table(cfg.table)} if cfg.table is not None else {}
    _init_dispatch(cfg)
    rows: list[dict[str, Any]] = []
    for s in sorted(cfg.ss, reverse=True):  # longest contexts first: a run cut short keeps the target shapes
        for b in cfg.bs:
            shape = {"B": b, "H": cfg.h, "Hkv": cfg.hkv, "D": cfg.d, "S": s}
            key = ProblemKey.make("flash_decode", ctx.target.gpu_model, ctx.world_size, cfg.dtype, shape)
            row: dict[str, Any] = {"shape": shape, "dtype": cfg.dtype}
            rec = tuned.get(key)
            if cfg.table is not None:
                row["tuned"] = _tuned_entry(rec)
            try:
                inputs = op.make_inputs(key, ctx.rank, ctx.device, cfg.seed)
                bsp = op.variants["bsp"]
                ws = bsp.prepare(key, bsp.default_params(key, ctx.target), ctx)
                expect = op.empty_output(key, ctx.device)
                bsp.run(ws, inputs, ctx, out=expect)
                del ws
                if b * s <= REFERENCE_LIMIT:
                    row["bsp_reference_error"] = relative_error(
                        expect, op.reference(key, ctx.rank, ctx.device, cfg.seed)
                    )
                bsp_extra = _extra_configs(bsp, key, ctx.target, rec)
                if ctx.target.device_type == "cuda":
                    row["ceiling"] = _ceiling(key, ctx, inputs, cfg, bsp_extra)
                else:  # the ceiling is the Triton decode kernel alone
                    row["ceiling"] = {"best": None, "skipped": "needs CUDA"}
                for name, variant in sorted(op.available_variants(ctx.target).items()):
                    extra = _extra_configs(variant, key, ctx.target, rec)
                    row[name] = _sweep(op, variant, key, ctx, inputs, cfg, expect, extra)
                if cfg.dispatch:
                    row["dispatch"] = _dispatch(key, ctx, inputs, cfg, expect)
                del inputs, expect
            except Exception as exc:  # e.g. out of memory at the largest shapes: reported, not fatal
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            if ctx.target.device_type == "cuda":
                torch.cuda.empty_cache()
            rows.append(row)
            if ctx.rank == 0:
                print(_row_line(row), flush=True)
                if out_path is not None:
                    _write_report(out_path, cfg, rows, partial=True)
    return rows


# -- report -------------------------------------------------------------------------------------------
def _fmt(us: float | None) -> str:
    return "-" if us is None else f"{us:9.1f}"


def _speedup(num: float | None, den: float | None) -> str:
    return "-" if num is None or den is None or den <= 0 else f"{num / den:5.2f}x"


def _row_line(row: dict[str, Any]) -> str:
    sh = row["shape"]
    head = f"B={sh['B']:<3d} S={sh['S']:<7d}"
    if "error" in row:
        return f"{head} error: {row['error']}"
    bsp = (row.get("bsp") or {}).get("best")
    fused = (row.get("fused") or {}).get("best")
    ceil = row["ceiling"]["best"]
    disp = (row.get("dispatch") or {}).get("best")
    cols = [
        f"bsp {_fmt(_best(bsp, 'eager'))} {_fmt(_best(bsp, 'graph'))}",
        f"fused {_fmt(_best(fused, 'eager'))} {_fmt(_best(fused, 'graph'))}",
        f"ceiling {_fmt(_best(ceil, 'eager'))} {_fmt(_best(ceil, 'graph'))}",
        f"fused/bsp eager {_speedup(_best(bsp, 'eager'), _best(fused, 'eager'))}",
        f"graph {_speedup(_best(bsp, 'graph'), _best(fused, 'graph'))}",
        f"best {_speedup(_best(bsp), _best(fused))}",
    ]
    if disp is not None:
        cols.append(
            f"dispatch {_fmt(_best(disp))} ({disp['variant']}) vs bsp {_speedup(_best(bsp), _best(disp))}"
        )
    return f"{head} " + " | ".join(cols)


def _verdict(row: dict[str, Any], modes: tuple[str, ...] = ("eager", "graph")) -> str:
    """Dispatch against the best BSP in each of ``modes`` (the timing modes its table serves): ``ok``
    unless dispatch is more than 2% slower."""
    bsp = (row.get("bsp") or {}).get("best")
    disp = (row.get("dispatch") or {}).get("best")
    if not bsp or not disp:
        return "-"
    worse = []
    for mode in modes:
        b, d = _best(bsp, mode), _best(disp, mode)
        if b is not None and d is not None and d > 1.02 * b:
            worse.append(f"{mode} {b / d:.2f}x")
    return "WORSE " + ", ".join(worse) if worse else "ok"


def summary_lines(report: dict[str, Any]) -> list[str]:
    """A short table of a report: tuned winner, BSP, fused and dispatch against BSP per timing mode."""

    def ratios(base: dict | None, other: dict | None) -> str:
        return " ".join(f"{_speedup(_best(base, m), _best(other, m)):>6}" for m in ("eager", "graph"))

    head = (
        f"{'B':>3} {'S':>7} | {'tuned (x tuner)':<20} | {'bsp eager  graph':>17} | {'fused x e   g':>13} | "
        f"{'ceil x':>6} | {'dispatch  x e   g':>19} | check"
    )
    served = (report.get("config") or {}).get("dispatch_timing")
    modes = (served,) if served else ("eager", "graph")
    lines = [
        "µs, max over ranks; x = BSP time / other time (eager, graph); check: dispatch within 2% of BSP"
        + (f" ({served} only: dispatch served {served}-timed records)" if served else ""),
        head,
        "-" * len(head),
    ]
    for row in report.get("rows", []):
        sh = row["shape"]
        lead = f"{sh['B']:>3} {sh['S']:>7} |"
        if "error" in row:
            lines.append(f"{lead} error: {row['error']}")
            continue
        tuned = row.get("tuned")
        t_name = "-"
        if tuned:
            t_name = f"{tuned['variant']} s={tuned['params'].get('splits', '-')} ({tuned['speedup']:.2f})"
        bsp = (row.get("bsp") or {}).get("best")
        fused = (row.get("fused") or {}).get("best")
        ceil = (row.get("ceiling") or {}).get("best")
        disp = (row.get("dispatch") or {}).get("best")
        d_name = disp["variant"][:5] if disp else "-"
        bsp_us = " ".join(f"{_fmt(_best(bsp, m))[-8:]:>8}" for m in ("eager", "graph"))
        lines.append(
            f"{lead} {t_name:<20} | {bsp_us} | "
            f"{ratios(bsp, fused):>13} | {_speedup(_best(bsp), _best(ceil)):>6} | "
            f"{d_name:<5} {ratios(bsp, disp):>13} | {_verdict(row, modes)}"
        )
    return lines


def _write_report(path: str, cfg: BenchConfig, rows: list[dict[str, Any]], partial: bool) -> None:
    rows = sorted(rows, key=lambda r: (r["shape"]["S"], r["shape"]["B"]))
    report = {"config": asdict(cfg), "environment": _environment(), "partial": partial, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


def _environment() -> dict[str, Any]:
    import torch

    from autotaxer._target import software_versions

    env: dict[str, Any] = dict(software_versions())
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    env["when"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return env


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, str, float, str | None, str]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer configurations and samples, same shapes")
    p.add_argument("--b", default=None, help=f"comma list of B (default {BS})")
    p.add_argument("--s", default=None, help=f"comma list of global S (default {SS})")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--heap-gib", type=int, default=2, help="Iris heap per rank (GiB)")
    p.add_argument("--dispatch", action="store_true", help="also time autotaxer.dispatch")
    p.add_argument(
        "--table", default=None, help="exported tuning table: dispatch uses only it, winners swept"
    )
    p.add_argument(
        "--summarize", default=None, metavar="JSON", help="print the table of a report (and --table) and exit"
    )
    p.add_argument(
        "--dispatch-timing", default=None, choices=("eager", "graph"),
        help="with --table: dispatch serves only winners tuned with this --timing (BSP elsewhere)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole run")
    p.add_argument(
        "--device", default="cuda", choices=("cuda", "cpu"), help="cpu: gloo dry run of BSP and dispatch only"
    )
    p.add_argument("--out", default=None, help="JSON path (default bench/results/flash_decode[_quick].json)")
    a = p.parse_args(argv)
    if a.table is not None and not os.path.isfile(a.table):
        p.error(f"--table: no such file: {a.table}")
    if a.dispatch_timing is not None and a.table is None:
        p.error("--dispatch-timing: needs --table (the table whose records it filters)")

    def ints(text: str | None, default: tuple[int, ...], field: str) -> tuple[int, ...]:
        if text is None:
            return default
        try:
            vals = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            p.error(f"--{field}: expected a comma list of integers, got {text!r}")
        if not vals or min(vals) <= 0:
            p.error(f"--{field}: expected positive integers, got {text!r}")
        return vals

    if a.quick:
        splits, blocks, warmup, iters, samples = (8, 16, 32, 64), ((64, 4, 2),), 3, 10, 5
    else:
        splits = (4, 8, 16, 32, 64)
        blocks = ((64, 4, 2), (64, 4, 3), (128, 8, 2), (32, 4, 3))
        warmup, iters, samples = 5, 20, 7
    cfg = BenchConfig(
        bs=ints(a.b, BS, "b"), ss=ints(a.s, SS, "s"), h=32, hkv=8, d=128, dtype=a.dtype,
        splits=splits, blocks=blocks, warmup=warmup, iters=iters, samples=samples,
        heap_gib=a.heap_gib, dispatch=a.dispatch, table=a.table, dispatch_timing=a.dispatch_timing,
    )  # fmt: skip
    out = a.out or f"bench/results/flash_decode{'_quick' if a.quick else ''}.json"
    return cfg, out, a.timeout, a.summarize, a.device


def _table_rows(table: str, report: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for the table's flash_decode records that ``report`` lacks (tuned column only)."""
    from autotaxer.table_file import read_table

    have = {tuple(sorted(r["shape"].items())) for r in report.get("rows", [])}
    extra = []
    for rec in read_table(table):
        shape = dict(rec.key.shape)
        if rec.key.op == "flash_decode" and tuple(sorted(shape.items())) not in have:
            extra.append({"shape": shape, "dtype": rec.key.dtype, "tuned": _tuned_entry(rec)})
    return sorted(extra, key=lambda r: (r["shape"]["S"], r["shape"]["B"]))


def summarize(path: str, table: str | None = None) -> int:
    """Print the summary table of the report at ``path`` (plus the ``table``'s shapes it lacks);
    1 when neither can be read."""
    report: dict[str, Any] = {"rows": []}
    status = 0
    try:
        with open(path) as f:
            report = json.load(f)
        for row in report.get("rows", []):  # reports written without --table: take the tuned column here
            row.setdefault("tuned", None)
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        status = 1
    if report.get("partial"):
        print(f"{path}: partial report (the run ended early)")
    if table is not None:
        try:
            report["rows"] = report.get("rows", []) + _table_rows(table, report)
            status = 0
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
    if report["rows"]:
        print("\n".join(summary_lines(report)))
    return status


def main(argv: list[str] | None = None) -> int:
    cfg, out, timeout, summary, device = parse_args(argv)
    if summary is not None:
        return summarize(summary, cfg.table)
    rows = run_ranks(_bench_rank, WORLD_SIZE, device, args=(cfg, out), timeout=timeout)[0]
    _write_report(out, cfg, rows, partial=False)
    print("\nmicroseconds (eager graph), max over ranks; speedup = bsp / fused")
    for row in sorted(rows, key=lambda r: (r["shape"]["S"], r["shape"]["B"])):
        print(_row_line(row))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
