"""Tensor-parallel layers served by :func:`autotaxer.dispatch`.

:class:`ColumnParallelLinear` is the column-parallel linear layer of sequence-parallel tensor parallelism
(Megatron's ``ColumnParallelLinear`` with ``sequence_parallel=True``): each rank holds a slice of the
sequence of the input, ``(s / world_size, *, in_features)``, and the rows ``out_features / world_size``
of the weight; the forward all-gathers the input along the sequence (dim 0) and multiplies it by the
weight shard, as one tuned all-gather GEMM (``b_layout=nk``: the weight is nn.Linear's ``(out, in)``),
giving ``(s, *, out_features / world_size)``. Backward: the weight's gradient from the gathered input the
forward kept, the input's by a tuned GEMM + reduce-scatter (:mod:`autotaxer.integrations.autograd`).

:class:`RowParallelLinear` is its pair (Megatron's ``RowParallelLinear`` with ``sequence_parallel=True``):
the input holds this rank's ``in_features / world_size`` features of the whole sequence,
``(s, *, in_features / world_size)``; the forward multiplies by the rank's weight columns and
reduce-scatters the partial sums along the sequence, as one tuned GEMM + reduce-scatter, giving
``(s / world_size, *, out_features)``; the bias is added to each rank's slice. Backward: one tuned
all-gather GEMM of the output's gradient.

The op serving each layer comes from the op registry: the first op whose ``layer`` has the layer's role
(``column``/``row``, :class:`autotaxer.ops._forms.LayerForm`), or the op named by ``op=``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .integrations._signature import group_world_size, resolve_group

if TYPE_CHECKING:
    import torch.distributed as dist


class _ShardedLinear(nn.Module):
    """A linear layer whose weight is split over the ranks of ``group`` along ``_sharded``
    (``out_features``: rows of the weight; ``in_features``: its columns), kept as an nn.Linear shard's
    parameters."""

    _sharded = "out_features"
    _role = "column"

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        group: dist.ProcessGroup | str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        op: str | None = None,
    ) -> None:
        super().__init__()
        self._use_op(op)
        self.group = resolve_group(group)
        ws = group_world_size(self.group)
        sizes = {"in_features": in_features, "out_features": out_features}
        if sizes[self._sharded] % ws:
            raise ValueError(
                f"{self._sharded}: {sizes[self._sharded]} is not divisible by the world size {ws}"
            )
        local = dict(sizes, **{self._sharded: sizes[self._sharded] // ws})
        shard = nn.Linear(local["in_features"], local["out_features"], bias=bias, device=device, dtype=dtype)
        self._adopt(shard, ws, sizes)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: Any = None, *, op: str | None = None):
        """The layer whose shard on this rank is ``linear`` (its parameters are shared, not copied)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._use_op(op)
        layer.group = resolve_group(group)
        ws = group_world_size(layer.group)
        sizes = {"in_features": linear.in_features, "out_features": linear.out_features}
        sizes[cls._sharded] *= ws
        layer._adopt(linear, ws, sizes)
        return layer

    def _use_op(self, op: str | None) -> None:
        """Serve the layer by ``op`` (None: the registry's op for this layer's role)."""
        from .ops import get_op, layer_op

        chosen = layer_op(self._role) if op is None else get_op(op)
        form = chosen.layer
        if form is None or form.role != self._role:
            raise ValueError(f"op: {chosen.name} does not serve a {self._role}-parallel layer")
        self.op, self._layout = chosen.name, dict(form.layout)

    def _adopt(self, shard: nn.Linear, world_size: int, sizes: dict[str, int]) -> None:
        self.world_size = world_size
        self.in_features, self.out_features = sizes["in_features"], sizes["out_features"]
        self.weight = shard.weight
        self.bias = shard.bias

    def _refuse(self, error: str) -> None:
        """Raise ``ValueError(error)`` (a bad input to ``forward``) on every rank of the group: the others
        learn it in the exchange of their first call, where they would otherwise wait for this rank."""
        from .integrations._signature import refuse

        refuse(self.op, self.group, ValueError(f"{type(self).__name__}: {error}"))

    def extra_repr(self) -> str:
        local = getattr(self, self._sharded) // self.world_size
        return (
            f"in_features={self.in_features}, out_features={self.out_features} ({self._sharded} {local} on "
            f"this rank), bias={self.bias is not None}"
        )


class ColumnParallelLinear(_ShardedLinear):
    """``y = all_gather(x, dim=0) @ weightᵀ + bias`` with this rank's weight shard; collective.

    ``out_features`` is the layer's full width (divisible by the world size); each rank keeps
    ``out_features / world_size`` rows of the weight (and of the bias). ``group``: a process group, its
    name, or None for the default group. Every rank of the group calls ``forward`` with the same shapes.
    ``op``: the registered op serving it (default: the registry's first that serves a column layer).
    """

    _sharded = "out_features"
    _role = "column"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .integrations.dispatch import dispatch

        if x.shape[-1] != self.in_features:
            self._refuse(f"x: last dimension {x.shape[-1]}, expected in_features={self.in_features}")
        rows = x.reshape(-1, self.in_features)
        y = dispatch(self.op, rows, self.weight.t(), group=self.group, **self._layout)
        if self.bias is not None:
            y = y + self.bias
        return y.view(x.shape[0] * self.world_size, *x.shape[1:-1], y.shape[-1])


class RowParallelLinear(_ShardedLinear):
    """``y = reduce_scatter(x @ weightᵀ, dim=0) + bias`` with this rank's weight columns; collective.

    ``in_features`` is the layer's full width (divisible by the world size); each rank keeps
    ``in_features / world_size`` columns of the weight and the whole bias. ``group``: a process group, its
    name, or None for the default group. Every rank calls ``forward`` with the same shapes.
    ``op``: the registered op serving it (default: the registry's first that serves a row layer).
    """

    _sharded = "in_features"
    _role = "row"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .integrations.dispatch import dispatch

        shard_in = self.in_features // self.world_size
        if x.shape[-1] != shard_in:
            self._refuse(f"x: last dimension {x.shape[-1]}, expected in_features / world size = {shard_in}")
        if x.shape[0] % self.world_size:
            self._refuse(
                f"x: dimension 0 ({x.shape[0]}) is not divisible by the world size {self.world_size}"
            )
        y = dispatch(self.op, x.reshape(-1, shard_in), self.weight.t(), group=self.group, **self._layout)
        if self.bias is not None:
            y = y + self.bias
        return y.view(x.shape[0] // self.world_size, *x.shape[1:-1], y.shape[-1])
