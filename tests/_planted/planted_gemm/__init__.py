"""``planted_gemm``: the planted op's host folder. Rank r holds ``A_r (M/ws, K)``, every rank ``B (K, N)``;
every rank gets ``C = cat_r(A_r) @ B`` (an all-gather GEMM along rows, ``gather_dim`` 0 only).

Variants: ``bsp`` (the all-gather, then ``torch.matmul``) and ``triton`` (the all-gather, then the device
module's GEMM; on CPU only under Triton's interpreter). It serves the column-parallel layer and takes
part in ``autotaxer bench`` (``_bench.py``, the form the op carries: ``Op.forms``)."""

from __future__ import annotations

import os
from typing import Any

from autotaxer._problem import ProblemKey, Target, dtype_name, torch_dtype
from autotaxer.ops import Op, Variant, Workspace
from autotaxer.ops._collectives import all_gather_shards
from autotaxer.ops._forms import LayerForm

from ._bench import FORM as BENCH


def _generator(device: Any, seed: int) -> Any:
    import torch

    return torch.Generator(device=device).manual_seed(seed)


class PlantedGemm(Op):
    name = "planted_gemm"
    shape_fields = ("M", "N", "K")
    layout_choices = {"gather_dim": (0,)}
    integrations = frozenset({"bench"})
    forms = {"bench": BENCH}  # a form that needs nothing above the ops: carried by the op
    layer = LayerForm("column", {"gather_dim": 0})
    flops = staticmethod(lambda key: 2.0 * key["M"] * key["N"] * key["K"])

    def validate(self, key: ProblemKey) -> None:
        for f in self.shape_fields:
            if key[f] <= 0:
                raise ValueError(f"{f}: must be positive, got {key[f]}")
        if key["M"] % key.world_size:
            raise ValueError(f"M: {key['M']} is not divisible by world size {key.world_size}")

    def key_from_inputs(self, tensors: tuple, layout: dict, world_size: int, gpu_model: str) -> ProblemKey:
        if len(tensors) != 2:
            raise ValueError(f"planted_gemm: expected 2 tensors (a_shard, b), got {len(tensors)}")
        a, b = tensors
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"K: a_shard {tuple(a.shape)} and b {tuple(b.shape)} do not multiply")
        shape = {"M": a.shape[0] * world_size, "N": b.shape[1], "K": a.shape[1]}
        return ProblemKey.make(self.name, gpu_model, world_size, dtype_name(a.dtype), shape, layout)

    def _shard(self, key: ProblemKey, rank: int, device: Any, seed: int) -> Any:
        import torch

        g = _generator(device, seed * 1009 + 17 * (rank + 1))
        a = torch.randn((key["M"] // key.world_size, key["K"]), generator=g, device=device)
        return a.to(torch_dtype(key.dtype))

    def _weight(self, key: ProblemKey, device: Any, seed: int) -> Any:
        import torch

        g = _generator(device, seed * 1009 + 3)
        return torch.randn((key["K"], key["N"]), generator=g, device=device).to(torch_dtype(key.dtype))

    def make_inputs(self, key: ProblemKey, rank: int, device: Any, seed: int) -> tuple[Any, ...]:
        return self._shard(key, rank, device, seed), self._weight(key, device, seed)

    def reference(self, key: ProblemKey, rank: int, device: Any, seed: int) -> Any:
        import torch

        a = torch.cat([self._shard(key, r, device, seed).double() for r in range(key.world_size)])
        return (a @ self._weight(key, device, seed).double()).float()

    def empty_output(self, key: ProblemKey, device: Any) -> Any:
        import torch

        return torch.full((key["M"], key["N"]), float("nan"), dtype=torch_dtype(key.dtype), device=device)


class _Gathering(Variant):
    """All-gather the shards into the workspace, then multiply (:meth:`product`)."""

    device_types = frozenset({"cpu", "cuda"})

    def prepare(self, key: ProblemKey, params: dict, ctx: Any) -> Workspace:
        import torch

        shape = (ctx.world_size, key["M"] // ctx.world_size, key["K"])
        gathered = torch.empty(shape, dtype=torch_dtype(key.dtype), device=ctx.device)
        return Workspace(key, dict(params), {"gathered": gathered})

    def run(self, ws: Workspace, inputs: tuple, ctx: Any, out: Any = None) -> Any:
        import torch

        a_shard, b = inputs
        all_gather_shards(a_shard, ws.buffers["gathered"], ctx)
        a = ws.buffers["gathered"].view(ws.key["M"], ws.key["K"])
        if out is None:
            out = torch.empty((ws.key["M"], ws.key["N"]), dtype=a.dtype, device=a.device)
        return self.product(a, b, out, ws.params)

    def run_for_backward(self, ws: Workspace, inputs: tuple, ctx: Any) -> Any:
        return None  # the planted op has no autograd integration

    def product(self, a: Any, b: Any, out: Any, params: dict) -> Any:
        raise NotImplementedError


class Bsp(_Gathering):
    name = "bsp"
    is_baseline = True

    def product(self, a: Any, b: Any, out: Any, params: dict) -> Any:
        import torch

        return torch.matmul(a, b, out=out)


class TritonGemm(_Gathering):
    name = "triton"

    def unavailable_reason(self, target: Target) -> str | None:
        if target.device_type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return "triton: on CPU only under Triton's interpreter (TRITON_INTERPRET=1)"
        return super().unavailable_reason(target)

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return {"BLOCK": (16, 32)}

    def check(self, key: ProblemKey, target: Target, params: dict) -> str | None:
        return None if params["BLOCK"] <= max(key["M"], 16) else "BLOCK: larger than M"

    def product(self, a: Any, b: Any, out: Any, params: dict) -> Any:
        from _planted.planted_gemm_kernel import gemm

        return gemm(a, b, out, params["BLOCK"])


OP = PlantedGemm()
OP.register(Bsp())
OP.register(TritonGemm())
