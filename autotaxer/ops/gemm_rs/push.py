"""``push``: the fused ``gemm_rs``: each rank's GEMM tiles are pushed to their owner as they finish (the
next rank's slice first) with a flag per tile, and the owner reduces them in fp32 (one persistent
launch on the Iris heap; ``autotaxer.kernels.gemm_rs.push_kernel``).

History: written 2026-11-25 with its interpreter tests at 2, 4 and 8 emulated ranks and checked on one
H100 at world size 1. Its owner-pull form ``pull`` (issue 27: the tiles kept where they are made and
loaded by their owner) was retired on 2026-11-29 (issue 47): it was never the fastest nor within 2% of it
at any of 48 keys at 2 GPUs (2×H200, tuned with up to hundreds of trials a key) and 9 at 4 (4×H200,
4×H100): 1.04-2.6× the best, mostly ``copy_engine`` or BSP; not measured at 8. Measured:
2×H200, ``push`` and ``push_tma`` one record each of the shipped ws2 graph table's 20 ``gemm_rs``
records; 4×H100 (2026-11-28, seeds, dependent timing) ``push`` 0.49-0.93× and ``push_tma`` 0.70-0.97×
BSP at the TP4 layer's keys at M=1024 and 4096 (``bench/results/2026-11-28_tp4_layer_h100x4/``); not yet
at 8 GPUs.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from ..._target import tma_unavailable
from .._base import Params, RunContext, Variant, Workspace
from .._iris_heap import iris_unavailable
from ._op import GemmRs, out_shape
from ._space import FUSED_SEEDS, FUSED_SPACE

#: Shared-memory budget of one CTA (H100/H200).
_SMEM_BYTES = 232448
_ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


class PushVariant(Variant):
    name = "push"
    device_types = frozenset({"cuda"})
    #: The GEMM's K loop by TMA loads (``push_tma``; calls TMA cannot address run the plain loop).
    tma = False

    def unavailable_reason(self, target: Target) -> str | None:
        return super().unavailable_reason(target) or iris_unavailable(self.name)

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return dict(FUSED_SPACE)

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """The persistent GEMM's usual tiles (:data:`._space.FUSED_SEEDS`)."""
        return [dict(seed) for seed in FUSED_SEEDS]

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from autotaxer.kernels.common.gemm import register_error, smem_error
        from autotaxer.kernels.gemm_rs.push import RsConfig

        try:
            config = RsConfig(**params)
            config.validate()
        except (TypeError, ValueError) as exc:
            return str(exc)
        return register_error(config) or smem_error(config, _ELEM_BYTES[key.dtype], _SMEM_BYTES)

    def heap_bytes(self, key: ProblemKey, params: Params) -> int:
        """Symmetric heap a rank needs: the inbox (two parity slots of every rank's partial slice), flags."""
        from autotaxer.kernels.gemm_rs.push import RsConfig, flags_count

        mo, no = out_shape(key)
        ws = key.world_size
        config = RsConfig(**params)
        return 2 * ws * mo * no * _ELEM_BYTES[key.dtype] + 4 * flags_count(
            key["M"], key["N"], ws, key["scatter_dim"], config
        )

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from autotaxer.kernels.common.tma import Scratch
        from autotaxer.kernels.gemm_rs.push import (
            SYNC_WORDS,
            RsConfig,
            flags_count,
            gemm_rs_push,
            inbox_shape,
        )

        GemmRs().validate(key)
        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"{self.name} params {dict(params)}: {reason}")
        need = self.heap_bytes(key, params) + 4096
        if need > ctx.heap_size:
            raise ValueError(
                f"heap_size: {self.name} needs {need} B of symmetric heap for {key.text}, "
                f"the context has {ctx.heap_size} B"
            )
        config = RsConfig(**params)
        heap = ctx.iris()
        mo, no = out_shape(key)
        buffers = {
            "inbox": heap.zeros(*inbox_shape(mo, no, ctx.world_size), dtype=torch_dtype(key.dtype)),
            "flags": heap.zeros(
                flags_count(key["M"], key["N"], ctx.world_size, key["scatter_dim"], config), dtype=torch.int32
            ),
            "sync": torch.zeros(SYNC_WORDS, dtype=torch.int64, device=ctx.device),
            "heap_bases": heap.get_heap_bases(),
            "config": config,
            "scratch": Scratch(),  # the TMA descriptors' global scratch (push_tma)
            "watch": ctx.watch_slot(key, self.name),  # bounds the kernel's waits on peers, names this site
        }
        # the launcher bound to what every call of this workspace passes unchanged
        buffers["launch"] = partial(
            gemm_rs_push, inbox=buffers["inbox"], flags=buffers["flags"], sync=buffers["sync"],
            heap_bases=buffers["heap_bases"], rank=ctx.rank, world_size=ctx.world_size,
            scatter_dim=key["scatter_dim"], config=config, num_sms=ctx.target.num_sms, tma=self.tma,
            scratch=buffers["scratch"], watch=buffers["watch"].tensor,
        )  # fmt: skip
        heap.barrier()  # every rank's flags are zero before any peer can signal into them
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        a, b = inputs
        if out is None:  # fresh from the caching allocator: no later call writes it
            out = torch.empty(out_shape(ws.key), dtype=a.dtype, device=a.device)
        return ws.buffers["launch"](a=a, b=b, out=out)

    def run_for_backward(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext) -> Any:
        """``(C slice, None)``: backward needs only the inputs it already holds."""
        return self.run(ws, inputs, ctx), None


class PushTmaVariant(PushVariant):
    """``push`` with a TMA GEMM core (NVIDIA sm_90+): the same buffers, protocol and parameters."""

    name = "push_tma"
    tma = True

    def unavailable_reason(self, target: Target) -> str | None:
        return super().unavailable_reason(target) or tma_unavailable(self.name, target)


VARIANTS = [PushVariant(), PushTmaVariant()]
