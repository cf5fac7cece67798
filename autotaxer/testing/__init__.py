"""Test helpers: run a function on every rank of a freshly spawned process group.

``run_ranks`` (:mod:`autotaxer._launch`, where production code spawns its ranks too) runs ``fn(ctx,
*args)`` on ``world_size`` spawned ranks and returns their results in rank order; ``run_world_sizes``
runs ``fn`` at several world sizes in one spawned group (subgroups of it). The modules of this package
are test programs, planted faults and emulations: the library never imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._launch import RanksFailed, free_port, run_ranks

__all__ = ["RanksFailed", "free_port", "run_ranks", "run_world_sizes"]


def run_world_sizes(
    fn: Callable[..., Any], world_sizes: tuple[int, ...], device: str = "cpu", args: tuple = (),
    timeout: float = 300.0,
) -> dict[int, list[Any]]:  # fmt: skip
    """``fn(ctx, *args)`` at every world size of ``world_sizes`` in one spawned group of the largest:
    at world size ``ws`` ranks ``0..ws-1`` run it over a subgroup of them (the whole group at the largest),
    one world size after another. Returns ``{ws: results in rank order}``. Spawning a group costs seconds;
    this spawns one, and checks as a side effect that ``fn`` keeps to ``ctx.group``."""
    per_rank = run_ranks(
        _on_subgroups, max(world_sizes), device, args=(fn, tuple(world_sizes), args), timeout=timeout
    )
    return {ws: [per_rank[r][ws] for r in range(ws)] for ws in world_sizes}


def _on_subgroups(
    ctx: Any, fn: Callable[..., Any], world_sizes: tuple[int, ...], args: tuple
) -> dict[int, Any]:
    import dataclasses

    import torch.distributed as dist

    out = {}
    for ws in world_sizes:
        group = None if ws == ctx.world_size else dist.new_group(list(range(ws)))  # every rank calls it
        if ctx.rank < ws:
            out[ws] = fn(dataclasses.replace(ctx, world_size=ws, group=group), *args)
        dist.barrier()
    return out
