"""One entry of a benchmark row: a variant (at its tuned configuration, or the best of a capped sweep),
``dispatch`` as a user calls it, or a peer. Each is validated against the op's reference before it is
registered with the row's :class:`~.timing.RowTimings`; a failure is the entry's ``error``, never the
row's."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from ..measure import error_text
from .case import BenchConfig
from .timing import RowTimings


def capped(configs: list[dict], cap: int) -> list[dict]:
    """At most ``cap`` configs, spread evenly over the list (first and last kept)."""
    if len(configs) <= cap:
        return configs
    step = (len(configs) - 1) / (cap - 1) if cap > 1 else 0
    return [configs[round(i * step)] for i in range(cap)]


def variant_entry(
    op, variant, key, ctx, inputs, cfg: BenchConfig, tuned: Mapping | None, timings: RowTimings
) -> dict[str, Any]:
    """``variant`` at its tuned configuration, or at the best (eager) of a capped sweep, registered with
    ``timings`` for the row's side-by-side timing. Its calls are launched as dispatch serves them and the
    tuner times them (:func:`autotaxer.runtime.replay.launcher`: CUDA-graph replays for the ops' replayed
    variants; ``launch`` says which). Launched by ``variant.run`` instead, a copy-engine schedule's eager
    time was its host's, 404 against dispatch's 183 µs for the same configuration (2xH200, 2026-11-29)."""
    from ..measure import check_variant, time_variant
    from ..ops import iter_grid
    from ..runtime import replay

    result: dict[str, Any] = {}
    configs: list[dict] = []
    if tuned is not None:
        reason = variant.check(key, ctx.target, tuned)
        if reason is None:
            configs, result["source"] = [dict(tuned)], "tuned"
        else:
            result["tuned_rejected"] = f"{dict(tuned)}: {reason}"
    if not configs:
        space = variant.search_space(key, ctx.target)
        valid = [p for p in iter_grid(space) if variant.check(key, ctx.target, p) is None]
        seeds = [p for p in variant.seed_configs(key, ctx.target) if p in valid][: cfg.max_configs]
        rest = [p for p in valid if p not in seeds]
        configs = (
            seeds + capped(rest, cfg.max_configs - len(seeds)) if len(seeds) < cfg.max_configs else seeds
        )
        result["source"] = "sweep"
        result["valid_configs"] = len(valid)
        result["seeded"] = len(seeds)
    result["launch"] = "replay" if replay.replayable(op, variant, ctx.device) else "eager"
    tried, failed = [], []
    best: tuple[float, dict, Any, Any, float, Any] | None = None
    for params in configs:
        try:
            ws = variant.prepare(key, params, ctx)
            run = replay.launcher(op, variant, key, ctx.device)  # one a workspace, as dispatch keeps them
            err = check_variant(op, variant, key, params, ctx, cfg.seed, ws=ws, run=run)
            if not err <= op.tolerance(key):
                failed.append({"params": params, "error": f"relative error {err:.3g}"})
                continue
            out = op.empty_output(key, ctx.device)
            fn = partial(run, ws, inputs, ctx, out=out)
            t = time_variant(
                fn, ctx, cfg.warmup, cfg.iters, "eager", cfg.samples, chain=cfg.link(inputs[0], out)
            )
            tried.append({"params": params, "eager": t, "err": err})
            if best is None or t < best[0]:
                best = (t, params, ws, out, err, run)
        except Exception as exc:
            failed.append({"params": params, "error": error_text(exc)})
    result.update(tried=tried, failed=failed)
    if best is not None:
        _, params, ws, out, err, run = best
        result.update(best_params=params, err=err)
        timings.add(result, partial(run, ws, inputs, ctx, out=out), cfg.link(inputs[0], out))
    return result


def dispatch_entry(rt, op, key, ctx, inputs, cfg: BenchConfig, timings: RowTimings) -> dict[str, Any]:
    """``dispatch`` as a user calls it (its plan created by an untimed first call), registered with
    ``timings``."""
    from ..ops import relative_error

    layout = {f: key[f] for f in op.call_layout()}
    try:
        plan = rt.plan(key.op, *inputs, **layout)
        out = op.empty_output(key, ctx.device)
        got = rt.dispatch(key.op, *inputs, out=out, **layout)
        got = out if got is None else got
        err = relative_error(got, op.reference(key, ctx.rank, ctx.device, cfg.seed))
        d = plan.decision
        entry = {"variant": d.variant, "params": dict(d.params), "source": d.source, "err": err}
        if d.tuned_key is not None:
            entry["tuned_key"] = d.tuned_key.text
        if not err <= op.tolerance(key):
            entry["error"] = f"relative error {err:.3g}"
            return entry
        fn = partial(rt.dispatch, key.op, *inputs, out=out, **layout)
        return timings.add(entry, fn, cfg.link(inputs[0], out))
    except Exception as exc:
        return {"error": error_text(exc)}


def peer_entry(peer: Any, op: Any, key, ctx, inputs, cfg: BenchConfig, timings: RowTimings) -> dict:
    """The peer ``peer`` (:class:`autotaxer.ops._forms.Peer`) on this row's inputs, checked against the
    reference and registered with ``timings``."""
    if ctx.target.device_type not in peer.device_types:
        return {"skipped": f"needs {' or '.join(sorted(peer.device_types)).upper()}"}
    from ..ops import relative_error

    try:
        fn = peer.make(key, ctx, inputs)
        got = fn()
        if ctx.target.device_type == "cuda":
            import torch

            torch.cuda.synchronize()
        err = relative_error(got, op.reference(key, ctx.rank, ctx.device, cfg.seed))
        return timings.add({"err": err}, fn, cfg.link(inputs[0]))  # a peer returns its output
    except Exception as exc:
        return {"error": error_text(exc)}
