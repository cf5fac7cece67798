"""What ``autotaxer bench`` times in a ``planted_gemm`` row besides BSP, its variants and dispatch: the
all-gather alone and the full GEMM alone."""

from __future__ import annotations

from functools import partial
from typing import Any

from autotaxer.ops._collectives import all_gather_shards
from autotaxer.ops._forms import BenchForm


def _parts(key: Any, ctx: Any, inputs: tuple, ws: Any) -> dict[str, Any]:
    import torch

    a_full = torch.randn((key["M"], key["K"]), device=ctx.device).to(inputs[0].dtype)
    out = torch.empty((key["M"], key["N"]), dtype=a_full.dtype, device=ctx.device)
    return {
        "allgather": partial(all_gather_shards, inputs[0], ws.buffers["gathered"], ctx),
        "gemm": partial(torch.matmul, a_full, inputs[1], out=out),
    }


FORM = BenchForm(parts=_parts)
