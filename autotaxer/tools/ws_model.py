"""The waits of ``push_ws``'s warp-specialised consumer (``kernels/ag_gemm/experimental/ws_kernel.py``),
modelled on CPU: every rank's CTAs and their partitions run side by side until all end or none can move.

Gluon kernels have no interpreter, and the phased N-rank emulation (:mod:`.emulated_ranks`) runs every
rank's producing step before any rank's consuming step, so neither can show a cycle of waits between
ranks that are resident at once. This model runs each partition of each CTA of each rank as a coroutine
that mirrors the kernel's loops step for step: the **load** warp (its flag polls: the leading K chunks of
a peer's rows that have landed; then the ring slot's ``empty`` barrier; the TMA load arrives on
``ready``), the **forward** warp (``FORWARD``: the ``ready`` wait, the box store, the flag release that
:func:`~autotaxer.kernels.ag_gemm.experimental.ws_kernel._release_due` decides, which it calls) and the
**MMA** warps (``ready`` waits, ``empty`` arrivals one step late). Barriers complete phases as
``mbarrier`` does (a wait on parity ``p`` passes while the current phase's parity differs). The tile
order is the kernel's (``_tile_of``, the host's ``consumer_group_m``), all CTAs resident (one per SM).

What it leaves out: data (only flags and barriers), timing (a deadlock here is one for every timing;
no deadlock here does not rule out a slow path), and the producers of ``comm_sms > 0``.

    python -m autotaxer.tools.ws_model --m 256 --n 640 --k 512 --gather-dim 1
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotaxer.kernels.ag_gemm.experimental.ws import WsConfig

Wait = Callable[[], bool]
Coroutine = Generator[tuple[str, Wait], None, None]


def _default_config() -> WsConfig:
    """128x128x64 tiles, 5 stages (the kernel module is imported only when a problem is made)."""
    from autotaxer.kernels.ag_gemm.experimental.ws import WsConfig

    return WsConfig(block_n=128, stages=5)


@dataclass(frozen=True)
class WsProblem:
    """One two-rank call of ``push_ws_fwd`` as the kernel sees it: C (m, n) = gather(A) (m, k) @ B (k, n),
    the shards row blocks (``gather_dim`` 0) or K slices (1), ``config`` the consumer's tiles, ring depth
    and tile order (default 128x128x64 tiles, 5 stages); one flag per ``block_m x block_k`` box of A, as
    the forwarding transport requires, and one persistent CTA per SM."""

    m: int
    n: int
    k: int
    gather_dim: int
    config: WsConfig = field(default_factory=_default_config)
    num_sms: int = 132
    world_size: int = 2

    @property
    def shard(self) -> tuple[int, int]:
        ws = self.world_size
        return (self.m // ws, self.k) if self.gather_dim == 0 else (self.m, self.k // ws)


@dataclass
class Outcome:
    """How a modelled call ended: ``deadlock`` with the waits that never passed, else every partition done."""

    deadlock: bool
    stuck: list[str] = field(default_factory=list)
    steps: int = 0

    def __str__(self) -> str:
        if not self.deadlock:
            return f"completed ({self.steps} steps)"
        return f"deadlock: {len(self.stuck)} waits never pass, e.g. " + "; ".join(self.stuck[:4])


class _Barrier:
    """An ``mbarrier``: ``count`` arrivals complete a phase."""

    __slots__ = ("count", "arrived", "phase")

    def __init__(self, count: int) -> None:
        self.count, self.arrived, self.phase = count, 0, 0

    def arrive(self) -> None:
        self.arrived += 1
        if self.arrived == self.count:
            self.arrived, self.phase = 0, self.phase + 1

    def passed(self, parity: int) -> Wait:
        return lambda: self.phase % 2 != parity


def _cdiv(x: int, d: int) -> int:
    return -(-x // d)


def _tile_of(t: int, num_pid_m: int, num_pid_n: int, group_m: int, first_m: int) -> tuple[int, int]:
    """The kernel's ``_tile_of``: grouped order, row blocks rotated by ``first_m``."""
    width = group_m * num_pid_n
    first = (t // width) * group_m
    size = min(num_pid_m - first, group_m)
    pid_m = first + (t % width) % size
    pid_n = (t % width) // size
    return (pid_m + first_m) % num_pid_m, pid_n


class _Rank:
    """One rank's flags (``[src, rc, kc]`` -> epoch) and launch arithmetic."""

    def __init__(
        self, p: WsProblem, rank: int, release_due: Callable[..., object], release_after: int
    ) -> None:
        from autotaxer.kernels.ag_gemm.experimental.ws import consumer_group_m

        self.p, self.rank = p, rank
        self.ms, self.ks = p.shard
        self.num_pid_m, self.num_pid_n = _cdiv(p.m, p.config.block_m), _cdiv(p.n, p.config.block_n)
        self.tiles = self.num_pid_m * self.num_pid_n
        self.grid = min(p.num_sms, self.tiles)
        self.group_m = consumer_group_m(p.config, p.gather_dim, self.ms, self.tiles, self.grid, True)
        self.first_m = (rank * self.ms) // p.config.block_m if p.gather_dim == 0 else 0
        self.k_steps = _cdiv(p.k if p.gather_dim == 0 else self.ks, p.config.block_k)
        self.n_rc, self.n_kc = _cdiv(self.ms, p.config.block_m), _cdiv(self.ks, p.config.block_k)
        self.flags: dict[tuple[int, int, int], int] = {}
        self.release_due, self.release_after = release_due, release_after

    def steps(self, cta: int) -> Generator[tuple[int, int, int, int, int], None, None]:
        """``(it, pid_n, src, row, ks)`` of every ring step of ``cta``, in the kernel's order."""
        p, it = self.p, 0
        slices = 1 if p.gather_dim == 0 else p.world_size
        for t in range(cta, self.tiles, self.grid):
            pid_m, pid_n = _tile_of(t, self.num_pid_m, self.num_pid_n, self.group_m, self.first_m)
            off_m = pid_m * p.config.block_m
            for step in range(slices):
                if p.gather_dim == 0:
                    src, row = off_m // self.ms, off_m % self.ms
                else:
                    src, row = (self.rank + step) % p.world_size, off_m
                for ks in range(self.k_steps):
                    yield it, pid_n, src, row, ks
                    it += 1

    def landed(self, src: int, row: int) -> int:
        """Leading K chunks of ``src``'s rows ``row..`` whose every row chunk's flag is up."""
        row_hi = min(row + self.p.config.block_m, self.ms) - 1
        landed = self.n_kc
        for rc in range(row // self.p.config.block_m, row_hi // self.p.config.block_m + 1):
            kc = 0
            while kc < self.n_kc and self.flags.get((src, rc, kc), 0) >= 1:
                kc += 1
            landed = min(landed, kc)
        return landed


def _load(r: _Rank, cta: int, ready: list[_Barrier], empty: list[_Barrier]) -> Coroutine:
    p = r.p
    k_len = p.k if p.gather_dim == 0 else r.ks
    for it, _, src, row, ks in r.steps(cta):
        if src != r.rank:
            need = (min(ks * p.config.block_k + p.config.block_k, k_len) - 1) // p.config.block_k + 1
            what = f"load: flags of rank {src}'s rows {row}.. up to K chunk {need - 1}"
            yield what, lambda src=src, row=row, need=need: r.landed(src, row) >= need
        s = it % p.config.stages
        yield f"load: slot {s} empty (step {it})", empty[s].passed(((it // p.config.stages) & 1) ^ 1)
        ready[s].arrive()  # the TMA load lands


def _forward(r: _Rank, peer: _Rank, cta: int, ready: list[_Barrier], empty: list[_Barrier],
             after_wait: bool) -> Coroutine:  # fmt: skip
    p = r.p
    pending, pending_it = -1, 0
    for it, pid_n, src, row, ks in r.steps(cta):
        s = it % p.config.stages
        mine = (src == r.rank) & (ks % r.num_pid_n == pid_n)
        for when in (False, True):
            if when == after_wait and bool(r.release_due(pending, pending_it, it, mine, src != r.rank,
                                                           r.release_after)):  # fmt: skip
                peer.flags[(r.rank, pending // r.n_kc, pending % r.n_kc)] = 1
                pending = -1
            if not when:
                what = f"forward: slot {s} ready (step {it}, holding box {pending})"
                yield what, ready[s].passed((it // p.config.stages) & 1)
        if mine:
            pending, pending_it = (row // p.config.block_m) * r.n_kc + ks, it
        empty[s].arrive()
    if pending >= 0:
        peer.flags[(r.rank, pending // r.n_kc, pending % r.n_kc)] = 1


def _mma(r: _Rank, cta: int, ready: list[_Barrier], empty: list[_Barrier]) -> Coroutine:
    p = r.p
    slices = 1 if p.gather_dim == 0 else p.world_size
    it = 0
    for _ in range(cta, r.tiles, r.grid):
        for ks in range(slices * r.k_steps):
            s = it % p.config.stages
            yield f"mma: slot {s} ready (step {it})", ready[s].passed((it // p.config.stages) & 1)
            if ks > 0:
                empty[(it + p.config.stages - 1) % p.config.stages].arrive()
            it += 1
        empty[(it + p.config.stages - 1) % p.config.stages].arrive()


def served_error(r: _Rank) -> str | None:
    """Why the launcher refuses to forward this call (``forward_error``, or gather_dim=0 tiles that straddle
    two ranks' rows, which TMA cannot read: the variant runs ``push``'s kernel instead), else None."""
    from autotaxer.kernels.ag_gemm.experimental.ws import forward_error

    p = r.p
    if p.gather_dim == 0 and r.ms % p.config.block_m:
        return f"gather_dim=0: {r.ms}-row shards straddle {p.config.block_m}-row tiles"
    return forward_error(
        (p.config.block_m, r.n_rc, p.config.block_k, r.n_kc), p.config, p.gather_dim, r.tiles, r.grid
    )


def _kernel_rule() -> tuple[Callable[..., object], int]:
    from autotaxer.kernels.ag_gemm.experimental.ws_kernel import RELEASE_AFTER, _release_due

    return _release_due.fn, int(RELEASE_AFTER.value)


def run_forward(
    problem: WsProblem,
    *,
    release_due: Callable[..., object] | None = None,
    release_after: int | None = None,
    after_wait: bool = False,
    seed: int | None = None,
) -> Outcome:
    """Run one call of ``push_ws_fwd`` on both ranks of ``problem``; the forward warp's release rule is the
    kernel's (``_release_due``, ``RELEASE_AFTER``, decided before the step's ``ready`` wait) unless given
    (``after_wait``: decided after it, as the kernel did before issue 35). ``seed``: visit the partitions
    in a shuffled order each round (None: round robin)."""
    if problem.world_size != 2:
        raise ValueError(f"world_size: forwarding serves one peer (2 ranks), got {problem.world_size}")
    kernel_rule, kernel_after = _kernel_rule()
    rule = release_due if release_due is not None else kernel_rule
    after = release_after if release_after is not None else kernel_after
    ranks = [_Rank(problem, r, rule, after) for r in range(2)]
    why = served_error(ranks[0])
    if why is not None:
        raise ValueError(f"push_ws_fwd does not serve {problem}: {why}")
    live: list[tuple[str, Coroutine, list]] = []
    for r in ranks:
        peer = ranks[1 - r.rank]
        for cta in range(r.grid):
            ready = [_Barrier(1) for _ in range(problem.config.stages)]
            empty = [_Barrier(2) for _ in range(problem.config.stages)]
            where = f"rank {r.rank} CTA {cta}"
            for part in (
                _load(r, cta, ready, empty),
                _forward(r, peer, cta, ready, empty, after_wait),
                _mma(r, cta, ready, empty),
            ):
                live.append((where, part, [None]))
    rng = random.Random(seed) if seed is not None else None
    steps = 0
    while live:
        moved = False
        order = list(range(len(live)))
        if rng is not None:
            rng.shuffle(order)
        done = set()
        for i in order:
            where, part, waiting = live[i]
            while True:
                if waiting[0] is not None and not waiting[0][1]():
                    break
                try:
                    waiting[0] = next(part)
                except StopIteration:
                    done.add(i)
                    break
                steps += 1
                moved = True
        live = [x for i, x in enumerate(live) if i not in done]
        if not moved and live:
            return Outcome(True, [f"{where}: {w[0][0]}" for where, _, w in live if w[0] is not None], steps)
    return Outcome(False, [], steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--k", type=int, required=True)
    parser.add_argument("--gather-dim", type=int, choices=(0, 1), required=True)
    parser.add_argument("--block-n", type=int, default=128)
    parser.add_argument("--stages", type=int, default=5)
    parser.add_argument("--group-m", type=int, default=8)
    parser.add_argument("--num-sms", type=int, default=132)
    args = parser.parse_args(argv)
    from autotaxer.kernels.ag_gemm.experimental.ws import WsConfig

    config = WsConfig(block_n=args.block_n, stages=args.stages, group_m=args.group_m)
    problem = WsProblem(args.m, args.n, args.k, args.gather_dim, config, num_sms=args.num_sms)
    outcome = run_forward(problem)
    print(f"{problem}: {outcome}")
    return 1 if outcome.deadlock else 0


if __name__ == "__main__":
    raise SystemExit(main())
