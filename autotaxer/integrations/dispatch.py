"""``autotaxer.dispatch``: which path a call takes, then the runtime serves it.

Under ``torch.compile`` a call becomes the traced BSP or the op's custom op (:mod:`.compiled`); a call
whose input requires grad (under grad mode) runs through its op's autograd (:mod:`.autograd`); every
other call is the runtime's hot path (:func:`autotaxer.runtime.dispatch.serve_hot`), which tells which
of the last two a call is at no cost to the hot one.
"""

from __future__ import annotations

from typing import Any

import torch

from ..runtime._runtimes import RUNTIMES
from ..runtime.dispatch import init, serve_hot
from .autograd import differentiable_call
from .compiled import compiled_dispatch

_is_compiling = torch.compiler.is_compiling


def dispatch(op: str, *tensors: Any, group: Any = None, out: Any = None, **layout: int) -> Any:
    """Run ``op`` (e.g. ``"ag_gemm"``) with the tuned variant; the same result as BSP. Collective.

    ``dispatch("ag_gemm", a_shard, b, gather_dim=0, group=None, out=None)``: ``a_shard`` is this rank's
    part of A, ``b`` the full B; returns ``C (M, N)`` (in ``out`` when given). See
    :mod:`autotaxer.runtime.dispatch` for what the first call of a shape does and for CUDA graphs and
    ``torch.compile``.
    """
    if _is_compiling():
        return compiled_dispatch(op, tensors, out, layout, group)
    rt = RUNTIMES.get(group)
    if rt is None:
        rt = init(None, group)
    return serve_hot(rt, op, tensors, out, layout, differentiable_call)


__all__ = ["dispatch"]
