"""``pull`` and ``push``: one Iris kernel, producers moving the shards, a persistent GEMM reading locally.

``push``: producer CTAs store the local shard into the peers' inboxes; ``pull``: they load the peers'
staged shards into the local inbox. What both share (pruning, prepare and launch) is
:class:`IrisFusedVariant`; their search space and seeds are data in :mod:`._space`. The launchers are
``autotaxer.kernels.ag_gemm.pull`` / ``ag_gemm_push`` (one kernel); both take a
:class:`~autotaxer.kernels.ag_gemm.fused.FusedConfig` built from the trial's parameters.

Measured: 2×H200, ``push`` 13 and 14, ``pull`` 5 and 3 of the shipped ws2 tables' 89 eager and graph
records (small M above all); 4×H200 (2026-11-22, back-to-back timing), ``push`` 10 and 7, ``pull`` 4
and 3 of the shipped ws4 tables' 26 records, and on 4×H100 (2026-11-28, seeds, dependent timing)
``push`` 0.35-0.81× BSP at the TP4 layer's keys at M=1024 and 4096
(``bench/results/2026-11-28_tp4_layer_h100x4/``); 8×H200 (2026-11-22), ``push`` 4 of the ws8 graph
table's 18 records (M=8, 256 and 16384, 1.005-1.10×; ``bench/results/2026-11-22_lean_h200x8/``).
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from .._iris_heap import iris_unavailable
from ._op import AgGemm, shard_shape
from ._space import fused_seeds, fused_space

#: Shared-memory budget of one CTA (H100/H200: 227 KiB; MI300X: 64 KiB LDS, pruned by the same rule).
_SMEM_BYTES = {"nvidia": 232448, "amd": 65536}
_ELEM_BYTES = {"bf16": 2, "fp16": 2}


def _next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


class IrisFusedVariant(Variant):
    """Base of the fused Iris variants; subclasses name the kernel and the heap buffer's shape."""

    device_types = frozenset({"cuda"})
    #: True where producers store into the peers (push's transport): push_order and release_each apply.
    pushes: bool = True

    # -- availability and search space ----------------------------------------------------------
    def unavailable_reason(self, target: Target) -> str | None:
        return super().unavailable_reason(target) or iris_unavailable(self.name)

    def search_space(self, key: ProblemKey, target: Target) -> dict[str, tuple[Any, ...]]:
        return fused_space(key, self.pushes)

    def complete_params(self, params: Params) -> dict[str, Any]:
        """``params`` with the fields added since it was tuned at their defaults (the kernel it ran)."""
        from autotaxer.kernels.ag_gemm.fused import FusedConfig

        defaults = {f: v.default for f, v in FusedConfig.__dataclass_fields__.items()}
        return {**{f: defaults[f] for f in ("group_across", "push_order", "release_each")}, **params}

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """Good starting points by regime, best first (:func:`._space.fused_seeds`)."""
        return fused_seeds(key, target, self.pushes)

    def check(self, key: ProblemKey, target: Target, params: Params) -> str | None:
        from autotaxer.kernels.ag_gemm.fused import FusedConfig, geometry
        from autotaxer.kernels.common.gemm import register_error, smem_error

        if key.dtype not in _ELEM_BYTES:
            return f"dtype: {self.name} supports bf16 and fp16, not {key.dtype}"
        try:
            config = FusedConfig(**params)
            config.validate()
        except (TypeError, ValueError) as exc:
            return str(exc)
        m, k, ws = key["M"], key["K"], key.world_size
        if config.block_m > max(16, _next_pow2(m)):
            return f"block_m: {config.block_m} is larger than M={m} needs"
        tiles = register_error(config)
        if tiles is not None:
            return tiles
        if config.prefetch_k:
            if target.is_amd:
                return "prefetch_k: the L2 prefetch is NVIDIA PTX; AMD runs without it"
            if key["gather_dim"] != 0:
                return "prefetch_k: only gather_dim=0 tiles wait before reading B"
            if config.prefetch_k > k:
                return f"prefetch_k: {config.prefetch_k} rows exceed K={k}"
        smem = smem_error(config, _ELEM_BYTES[key.dtype], _SMEM_BYTES["amd" if target.is_amd else "nvidia"])
        if smem is not None:
            return smem
        if config.comm_sms >= target.num_sms:
            return f"comm_sms: {config.comm_sms} leaves no SM for the GEMM ({target.num_sms} SMs)"
        if key["gather_dim"] not in (0, 1) or (k if key["gather_dim"] else m) % ws:
            return "shape: not divisible by the world size"
        ms, ks = shard_shape(key)
        geo = geometry(config, ms, ks)
        if geo.n_row < config.row_chunks:
            return f"row_chunks: {config.row_chunks} chunks of a {ms}-row shard repeat a smaller count"
        if geo.n_col < config.k_chunks:
            return f"k_chunks: {config.k_chunks} chunks of {ks} columns repeat a smaller count"
        return None

    # -- prepare / run ---------------------------------------------------------------------------
    def buffer_shape(self, key: ProblemKey) -> tuple[int, ...]:
        """Shape of the heap data buffer (two parity slots)."""
        raise NotImplementedError

    def launcher(self):
        """The kernel module's public launcher."""
        raise NotImplementedError

    def prepare(self, key: ProblemKey, params: Params, ctx: RunContext) -> Workspace:
        import torch

        from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, FusedConfig, flags_count, geometry

        AgGemm().validate(key)
        reason = self.check(key, ctx.target, params)
        if reason is not None:
            raise ValueError(f"{self.name} params {dict(params)}: {reason}")
        config = FusedConfig(**params)
        dtype = torch_dtype(key.dtype)
        shape = self.buffer_shape(key)
        need = 4 * 2 * ctx.world_size * 1024
        for s in (shape,):
            n = 1
            for d in s:
                n *= d
            need += n * _ELEM_BYTES[key.dtype]
        if need > ctx.heap_size:
            raise ValueError(
                f"heap_size: {self.name} needs {need} B of symmetric heap for {key.text}, "
                f"the context has {ctx.heap_size} B"
            )
        heap = ctx.iris()
        ms, ks = shard_shape(key)
        geo = geometry(config, ms, ks)
        buffers = {
            "data": heap.zeros(*shape, dtype=dtype),
            "flags": heap.zeros(flags_count(geo, ctx.world_size), dtype=torch.int32),
            "sync": torch.zeros(SYNC_WORDS, dtype=torch.int64, device=ctx.device),
            "heap_bases": heap.get_heap_bases(),
            "grid": _launch_grid(config, key["M"], key["N"], ctx.target.num_sms),
            "config": config,
            "launch": self.launcher(),
            "launch_cache": {},  # compiled launches of this workspace (see the launcher's ``cache``)
            "watch": ctx.watch_slot(key, self.name),  # bounds the kernel's waits on peers, names this site
        }
        # the launcher's arguments that every call of this workspace passes unchanged
        buffers["call"] = dict(
            inbox=buffers["data"], flags=buffers["flags"], sync=buffers["sync"],
            heap_bases=buffers["heap_bases"],
            rank=ctx.rank, world_size=ctx.world_size, gather_dim=key["gather_dim"], config=config,
            num_sms=ctx.target.num_sms, cache=buffers["launch_cache"], watch=buffers["watch"].tensor,
        )  # fmt: skip
        heap.barrier()  # every rank's flags are zero before any peer can signal into them
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        a_shard, b = inputs
        buf = ws.buffers
        if out is None:  # fresh from the caching allocator: no later call writes it
            out = torch.empty((ws.key["M"], ws.key["N"]), dtype=a_shard.dtype, device=a_shard.device)
        buf["launch"](a_shard=a_shard, b=b, out=out, **buf["call"])
        return out

    def run_for_backward(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext) -> Any:
        """``(C, gathered A)``: after the kernel, the peers' shards of this call are in the inbox's parity
        slot; it is copied out (with the local shard in its place) before the next call can reuse it."""
        out = self.run(ws, inputs, ctx)
        return out, inbox_gathered(ws, inputs[0], ctx.rank)


def _launch_grid(config: Any, m: int, n: int, num_sms: int) -> int:
    """Programs of the fused kernel's launch: the dedicated producers plus one consumer per SM left, at
    most one per tile (``kernels.ag_gemm.fused._launch_args``, phase ``all``)."""
    tiles = -(-m // config.block_m) * -(-n // config.block_n)
    return config.comm_sms + min(num_sms - config.comm_sms, tiles)


def inbox_gathered(ws: Workspace, a_shard: Any, rank: int) -> Any:
    """The gathered ``(M, K)`` A of the call that just ran on ``ws``, as a fresh tensor.

    Call ``e`` leaves ``e * grid`` arrivals in ``sync[0]`` and its data in inbox slot ``e % 2``; the
    slot is chosen on the device (no synchronisation, and right under CUDA-graph replay). Stream order
    puts this copy before this rank's next call, and no peer writes the slot again before that call
    has sent its own data, so the copy always sees this call's shards.
    """
    import torch

    buf, key = ws.buffers, ws.key
    slot = torch.div(buf["sync"][:1], buf["grid"], rounding_mode="floor").remainder_(2)
    shards = buf["data"].index_select(0, slot)[0]  # (world_size, Ms, Ks), a copy
    shards[rank].copy_(a_shard)  # push never writes its own slot
    if key["gather_dim"] == 0:
        return shards.view(key["M"], key["K"])
    return shards.permute(1, 0, 2).reshape(key["M"], key["K"])


class PullVariant(IrisFusedVariant):
    """Producer CTAs load the peers' staged shards into the local inbox; the GEMM reads locally."""

    name = "pull"
    pushes = False

    def buffer_shape(self, key: ProblemKey) -> tuple[int, ...]:
        from autotaxer.kernels.ag_gemm.fused import inbox_shape

        return inbox_shape(*shard_shape(key), key.world_size)

    def launcher(self):
        from autotaxer.kernels.ag_gemm.pull import ag_gemm_pull

        return ag_gemm_pull


class PushVariant(IrisFusedVariant):
    """Producer CTAs store the local shard into the peers' inboxes; the GEMM reads locally."""

    name = "push"

    def buffer_shape(self, key: ProblemKey) -> tuple[int, ...]:
        from autotaxer.kernels.ag_gemm.fused import inbox_shape

        return inbox_shape(*shard_shape(key), key.world_size)

    def launcher(self):
        from autotaxer.kernels.ag_gemm.push import ag_gemm_push

        return ag_gemm_push


VARIANTS = [PullVariant(), PushVariant()]
