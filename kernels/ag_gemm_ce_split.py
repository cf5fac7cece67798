"""Copy-engine all-gather + GEMM for ``gather_dim=0`` with the GEMM split along N instead of M.

At mid M (about 128-1024 rows on Hopper) a GEMM is bound by reading ``B`` once, whatever its row
count; ``copy_engine`` overlaps the gather with a GEMM of the local rows and then runs one of the
peers' rows, so it reads ``B`` once per row block (twice at world size 2), and its ``gather_first``
form reads it once but hides nothing. This schedule reads only a column block of ``B`` twice:

* side stream: ``copy_engine``'s transport (each rank's shard into every peer's inbox with the copy
  engine, one flag per peer, and its own shard into its own inbox slot);
* caller's stream: ``C[local rows, :n_first] = A_r @ B[:, :n_first]`` while the copies run; then, all
  flags up, ``C[:, n_first:] = A @ B[:, n_first:]`` over every row at once; last the peers' rows of
  the first columns. ``B[:, :n_first]`` is read twice, the rest once, and ``n_first`` is tuned so the
  first GEMM lasts about as long as the gather.

Flags, inbox reuse and CUDA-graph safety are the copy-engine channel's (:mod:`ag_gemm_ce`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import signal as sig
from .ag_gemm_ce import MAX_CHUNKS, Channel, Plan, _await, _raise, _send

#: Column blocks are multiples of this (vendor GEMM tile widths).
COLUMN_ALIGN = 128


def first_columns(n: int, fraction: float, align: int = COLUMN_ALIGN) -> int:
    """Columns of the first GEMM: ``fraction`` of ``n`` rounded to ``align``, at least one block and
    leaving at least one; ``ValueError`` when ``n`` has fewer than two blocks or ``fraction`` is not in
    (0, 1)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"first_cols: fraction {fraction} is not in (0, 1)")
    if n < 2 * align:
        raise ValueError(f"N: {n} columns leave no room for two {align}-column blocks")
    blocks = round(n * fraction / align)
    return min(max(blocks, 1), n // align - 1) * align


@dataclass(frozen=True)
class Step:
    """One GEMM of the schedule: ``C[rows, cols] = A[rows] @ B[:, cols]``, ``A`` being the gathered
    matrix (``rows`` index it and ``C`` alike); ``local``: those rows are this rank's own shard."""

    rows: tuple[int, int]
    cols: tuple[int, int]
    local: bool


def schedule(rank: int, world_size: int, rows: int, n: int, n_first: int) -> tuple[list[Step], list[Step]]:
    """The GEMMs before the gather is complete and after it; together they cover ``C`` exactly once."""
    own = (rank * rows, (rank + 1) * rows)
    before = [Step(own, (0, n_first), local=True)]
    after = [Step((0, world_size * rows), (n_first, n), local=False)]
    if rank > 0:
        after.append(Step((0, own[0]), (0, n_first), local=False))
    if rank < world_size - 1:
        after.append(Step((own[1], world_size * rows), (0, n_first), local=False))
    return before, after


def ag_gemm_ce_split(
    channel: Channel,
    plan: Plan,
    inbox: Any,
    a_shard: Any,
    b: Any,
    out: Any,
    steps: tuple[list[Step], list[Step]],
) -> Any:
    """``out = all_gather(a_shard, dim=0) @ b`` with the N-split ``steps`` (from :func:`schedule`,
    resolved once per workspace); collective.

    ``plan`` must be a ``gather_dim=0``, ``gather_first`` plan (its own shard lands in its inbox slot,
    one chunk per peer). Launches only: no host synchronisation, no allocation.
    """
    import torch

    if plan.gather_dim != 0 or not plan.gather_first or len(plan.chunk_rows) != 1:
        raise ValueError("ag_gemm_ce_split: needs a gather_dim=0, gather_first plan with one chunk")
    ch, ws = channel, channel.world_size
    rows, ks = plan.rows, plan.k_shard
    main = torch.cuda.current_stream()
    if ch.backend == "triton":
        sig.advance_epoch(ch.epoch)
    ch.fork.record(main)
    ch.side.wait_event(ch.fork)
    with torch.cuda.stream(ch.side):
        _send(ch, plan, a_shard)
    ch.join.record(ch.side)

    before, after = steps
    for st in before:  # the local rows' first columns while the copies run
        (c0, c1), (lo, hi) = st.cols, st.rows
        torch.matmul(a_shard, b[:, c0:c1], out=out[lo:hi, c0:c1])
    flags = ch.data.view(ws, MAX_CHUNKS)  # every shard here: peers' flags, this rank's own copy
    for p in plan.peers:
        _await(ch, flags[p, 0:1], main)
    main.wait_event(ch.join)
    a_full = inbox[: ws * rows * ks].view(ws * rows, ks)
    for st in after:  # the remaining columns over every row, then the peers' rows of the first ones
        (c0, c1), (lo, hi) = st.cols, st.rows
        torch.matmul(a_full[lo:hi], b[:, c0:c1], out=out[lo:hi, c0:c1])
    # This rank has consumed its inbox: peers may overwrite it in their next call.
    for _, done in plan.remote_done:
        _raise(ch, done, main)
    return out
