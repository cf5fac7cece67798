"""What the Iris-fused variants (``pull``, ``push``) share: search space, pruning, prepare and launch.

The launchers are ``autotaxer.kernels.ag_gemm.pull`` / ``ag_gemm_push`` (one kernel); both take a
:class:`~autotaxer.kernels.ag_gemm.fused.FusedConfig` built from the trial's parameters.
"""

from __future__ import annotations

from typing import Any

from ..._problem import ProblemKey, Target, torch_dtype
from .._base import Params, RunContext, Variant, Workspace
from .._iris_heap import iris_unavailable
from ._op import AgGemm, shard_shape

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
        small = key["M"] <= 256  # bound by reading B: many narrow tiles, K chunks to start early
        return {
            "block_m": (128, 64, 32, 16),
            "block_n": (64, 128, 256) if small else (256, 128, 64),
            "block_k": (64, 128, 256) if small else (64, 128),
            "group_m": (8, 4),
            "num_warps": (8, 4),
            # deeper pipelines at small M (B-bound: bytes in flight): 128x128x64 on 4 warps, one H100 at
            # one rank, M=256: 62.6 against 58.3 us with 4 and 5 stages in one call, 59.0 against 56.9
            # with 5 and 6 in the next (bench/results/2026-11-25_gemm_core_h100/)
            "num_stages": (3, 4, 2, 5, 6) if small else (3, 4, 2),
            "comm_sms": (16, 8, 32, 4, 0),  # 0: every program moves its share, then computes
            # many row chunks per producer (large M): the first wave's rows land first
            "row_chunks": (4, 1, 8, 16) if small else (4, 1, 8, 16, 32, 64),
            "k_chunks": (4, 2, 1, 8) if small else (1, 2, 4, 8),
            "prefetch_k": (0, 1024) if small and key["gather_dim"] == 0 else (0,),
            # many peers (one value at 2 ranks, where the orders coincide and a chunk has one peer):
            # gather_dim=0 groups over the gathered M; push's peer order and per-peer flag release
            "group_across": (0, 1) if key["gather_dim"] == 0 and key.world_size > 2 else (0,),
            "push_order": (0, 1) if self.pushes and key.world_size > 2 else (0,),
            "release_each": (0, 1) if self.pushes and key.world_size > 2 else (0,),
        }

    def complete_params(self, params: Params) -> dict[str, Any]:
        """``params`` with the fields added since it was tuned at their defaults (the kernel it ran)."""
        from autotaxer.kernels.ag_gemm.fused import FusedConfig

        defaults = {f: v.default for f, v in FusedConfig.__dataclass_fields__.items()}
        return {**{f: defaults[f] for f in ("group_across", "push_order", "release_each")}, **params}

    def seed_configs(self, key: ProblemKey, target: Target) -> list[dict[str, Any]]:
        """Good starting points by regime (2xH200 sweeps, best first: the tuner may run only the first
        few): one row tile over all of M at small M (64 wide at gather_dim=0, where deeper searches
        found narrow tiles best), 128x128 tiles above (they beat 128x256 in the fused kernel at
        M=1024-4096 on 2xH200). Up to M=256 first the one with no dedicated producers (``comm_sms=0``,
        its shard cut fine enough that many programs move a piece each), last the same with six pipeline
        stages (one H100, one rank, M=256: a GEMM core 9% faster than with four); from M=512, where the
        grid runs more than one wave, first 8-16 dedicated producers that join the GEMM when done, the
        shard cut in many row chunks so the rows of the first wave land first (2xH200, N=K=8192:
        1.05-1.14x faster than ``comm_sms=0`` at M=1024-4096)."""
        m, gd = key["M"], key["gather_dim"]

        def cfg(bm, bn, bk, warps, stages, comm, rc, kc, pf=0):
            return dict(
                block_m=bm, block_n=bn, block_k=bk, group_m=8, num_warps=warps, num_stages=stages,
                comm_sms=comm, row_chunks=rc, k_chunks=kc, prefetch_k=pf, group_across=0, push_order=0,
                release_each=0,
            )  # fmt: skip

        if m <= 64:  # one row tile covering every row: B is read once
            bm = 16 if m <= 16 else 32 if m <= 32 else 64
            prefetch = gd == 0 and not target.is_amd  # only gather_dim=0 tiles wait first
            shard_rows = m // key.world_size if gd == 0 else m
            return self._many_peers(key, [
                cfg(bm, 64 if gd == 0 else 128, 128, 4, 4, 0, 4 if shard_rows >= 4 else 1, 8),
                cfg(bm, 128, 128, 4, 4, 8, 4, 1),
                cfg(bm, 128, 128, 4, 4, 8, 4, 1, 1024) if prefetch else cfg(bm, 128, 128, 4, 4, 8, 1, 2),
            ])  # fmt: skip
        if m <= 256:
            return self._many_peers(key, [
                cfg(128, 128, 64, 4, 4, 0, 16, 8),
                cfg(128, 128, 64, 4, 4, 4, 4, 2),
                cfg(128, 128, 64, 4, 4, 4, 4, 4),
                cfg(128, 128, 64, 4, 6, 0, 16, 8),
            ])  # fmt: skip
        if m <= 512:
            return self._many_peers(key, [
                cfg(128, 128, 64, 4, 4, 16, 16, 1),
                cfg(128, 128, 64, 4, 4, 0, 16, 8),
                cfg(128, 128, 64, 4, 4, 4, 4, 2),
            ])  # fmt: skip
        return self._many_peers(key, [
            cfg(128, 128, 64, 4, 4, 16, 64, 1),
            cfg(128, 128, 64, 4, 4, 8, 64, 1),
            cfg(128, 256, 64, 8, 3, 16, 64, 1),
        ])  # fmt: skip

    def _many_peers(self, key: ProblemKey, seeds: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """At 3+ ranks, after the first seed: the same with the many-peer schedule (push in the order the
        peers read, each peer's flag released after its copy, gather_dim=0 tiles grouped over the whole
        M) and, where producers are dedicated, twice as many of them (8 ranks: 16 -> 8 producers cost
        47-94 µs on 8xH200, and each chunk goes to 7 peers)."""
        if key.world_size <= 2 or not seeds:
            return seeds
        first = seeds[0]
        wide = dict(first, group_across=int(key["gather_dim"] == 0))
        if self.pushes:
            wide.update(push_order=1, release_each=1)
        extra = [wide]
        if first["comm_sms"]:
            extra.append(dict(wide, comm_sms=min(2 * first["comm_sms"], 32)))
        return [first, *extra, *seeds[1:]]

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
        heap.barrier()  # every rank's flags are zero before any peer can signal into them
        return Workspace(key, dict(params), buffers)

    def run(self, ws: Workspace, inputs: tuple[Any, ...], ctx: RunContext, out: Any = None) -> Any:
        import torch

        a_shard, b = inputs
        buf = ws.buffers
        if out is None:  # fresh from the caching allocator: no later call writes it
            out = torch.empty((ws.key["M"], ws.key["N"]), dtype=a_shard.dtype, device=a_shard.device)
        buf["launch"](
            a_shard=a_shard,
            b=b,
            out=out,
            flags=buf["flags"],
            sync=buf["sync"],
            heap_bases=buf["heap_bases"],
            rank=ctx.rank,
            world_size=ctx.world_size,
            gather_dim=ws.key["gather_dim"],
            config=buf["config"],
            num_sms=ctx.target.num_sms,
            cache=buf["launch_cache"],
            inbox=buf["data"],
            watch=buf["watch"].tensor,
        )
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
