"""Host side of the fused ag_gemm kernel (``push``, ``pull``, ``push_tma``): config, launch arithmetic,
the launch with its cache of compiled launches.

The kernel is :mod:`.fused_kernel`; the synchronisation contract it keeps is in :mod:`.protocol`. The
variants' modules (:mod:`.push`, :mod:`.pull`) are :func:`fused_launcher` of it; :mod:`.push_tma` calls
:func:`launch` with ``tma``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import triton

from ..common.gemm import TileConfig
from ..common.tiles import ChunkGeometry, chunk_geometry
from ..common.tma import Scratch, scratch_allocator
from ..common.watch import unnamed_slot
from .args import Buffers, Chunks, Io, Layout, Moves, Programs, Sizes, Strides, Tiles
from .fused_kernel import fused_ag_gemm_kernel

#: The one fused kernel; ``PULL`` (constexpr) picks the producers' transport, ``TMA`` the consumer.
KERNEL = fused_ag_gemm_kernel

#: int64 words of a rank's ``sync`` buffer: program arrivals, tiles drawn from the queue (both only grow).
SYNC_WORDS = 2


@dataclass(frozen=True)
class FusedConfig(TileConfig):
    """Tiles and schedule of a fused ag_gemm kernel: the GEMM's tiles (:class:`TileConfig`), then the
    producers' schedule.

    ``comm_sms`` producer CTAs move the local shard (push: into the peers' inboxes; pull: into the
    local staging buffer, then peers' chunks into the local inbox) in ``row_chunks x k_chunks`` chunks,
    one flag each, then join the GEMM; the rest of the grid (at most ``num_sms - comm_sms`` CTAs) runs
    the persistent GEMM from the start, all taking tiles from one queue. ``comm_sms=0``: no dedicated
    producers; every program of the GEMM's grid first moves its share of the chunks (chunk ``i`` by
    program ``i % grid``), then runs its tiles, each waiting for all the K chunks of the peers' rows it
    needs before one K loop (``WHOLE_K``). Small shards are then in flight on every SM at once within
    microseconds, instead of trickling through a few producers, and no SM is withheld from the GEMM.
    ``prefetch_k`` (NVIDIA, 0 = off):
    a gather_dim=0 tile that waits for peers' rows first prefetches that many rows of its B slab into L2.
    For many peers (each 0 = the kernel as first shipped): ``group_across`` 1 groups gather_dim=0 tiles
    over the gathered M instead of inside one shard; ``push_order`` 1 sends each chunk to the peers in
    the order they read it (``rank - 1`` first); ``release_each`` 1 releases each peer's flag right after
    its copy instead of after the copies to every peer.
    """

    comm_sms: int = 8
    row_chunks: int = 4
    k_chunks: int = 1
    prefetch_k: int = 0
    group_across: int = 0
    push_order: int = 0
    release_each: int = 0

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field."""
        super().validate()
        for name in ("row_chunks", "k_chunks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.comm_sms < 0:
            raise ValueError(f"comm_sms: must be >= 0, got {self.comm_sms}")
        for name in ("group_across", "push_order", "release_each"):
            if getattr(self, name) not in (0, 1):
                raise ValueError(f"{name}: must be 0 or 1, got {getattr(self, name)}")
        if self.prefetch_k and (self.prefetch_k < 128 or self.prefetch_k & (self.prefetch_k - 1)):
            raise ValueError(f"prefetch_k: must be 0 or a power of two >= 128, got {self.prefetch_k}")


def inbox_shape(ms: int, ks: int, world_size: int) -> tuple[int, int, int, int]:
    """Shape of a rank's inbox: two parity slots of every rank's shard."""
    return (2, world_size, ms, ks)


def flags_count(geo: ChunkGeometry, world_size: int) -> int:
    """Number of int32 flags a rank needs: two parity slots of ``world_size x chunks``."""
    return 2 * world_size * geo.count


def shard_dims(m: int, k: int, world_size: int, gather_dim: int) -> tuple[int, int]:
    """``(Ms, Ks)``: the shape of one rank's shard."""
    return (m // world_size, k) if gather_dim == 0 else (m, k // world_size)


def geometry(config: FusedConfig, ms: int, ks: int) -> ChunkGeometry:
    """The chunk geometry a config gives for a ``(Ms, Ks)`` shard."""
    return chunk_geometry(ms, ks, config.row_chunks, config.k_chunks, config.block_k)


#: Launch phase -> steps run (bit 1: stage / store the own shard, bit 2: fetch peers', bit 4: the GEMM).
_PHASES = {"all": 7, "producers": 3, "stage": 1, "fetch": 2, "consumers": 4}

#: Elements one producer step moves at most (16 KiB of bf16): its loads are in flight together.
_COPY_ELEMS = 8192


def _pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


#: The transports :func:`fused_launcher` builds launchers for (``PULL`` of the kernel).
TRANSPORTS = ("push", "pull")


def _launch_args(
    how: str,
    *,
    a_shard,
    b,
    out,
    inbox,
    flags,
    sync,
    heap_bases,
    rank: int,
    world_size: int,
    gather_dim: int,
    config: FusedConfig,
    num_sms: int,
    phase: str = "all",
    tma: bool = False,
    watch: Any = None,
) -> tuple[int, list[Any], dict[str, int]]:
    """Check shapes; ``(grid, every kernel argument in signature order, launch options)``.

    ``how`` is the transport (:data:`TRANSPORTS`). ``inbox`` is the rank's inbox
    (:func:`inbox_shape`),
    ``flags`` its :func:`flags_count` int32 flags, ``sync`` its :data:`SYNC_WORDS` int64 words.
    ``phase`` runs some of the kernel's steps, for the interpreter, where programs run one after
    another and nothing may spin on work that has not run yet: ``"stage"`` (the moving programs'
    first step: push stores into peers, pull stages its own shard), ``"fetch"`` (pull's loads of
    peers' chunks; nothing for push), ``"producers"`` (both), ``"consumers"`` (the GEMM, on every
    program: dedicated producers join it); ``"all"`` is the real launch. ``tma``: the TMA consumer
    (push only; the caller checks :func:`.push_tma.tma_ready`). ``watch``: the watch slot bounding the
    kernel's waits on peers (``kernels/common/watch.py``; None: the process's slot for unnamed launches).
    """
    if how not in TRANSPORTS:
        raise ValueError(f"how: must be one of {', '.join(TRANSPORTS)}, got {how!r}")
    config.validate()
    if how == "pull" and (config.push_order or config.release_each):
        raise ValueError("push_order, release_each: push's transport only (pull fetches in its own order)")
    if gather_dim not in (0, 1):
        raise ValueError(f"gather_dim: must be 0 or 1, got {gather_dim}")
    if phase not in _PHASES:
        raise ValueError(f"phase: must be one of {', '.join(_PHASES)}, got {phase!r}")
    ms, ks = a_shard.shape
    m, n = out.shape
    k = b.shape[0]
    if (ms, ks) != shard_dims(m, k, world_size, gather_dim) or b.shape[1] != n:
        raise ValueError(
            f"shapes: shard {tuple(a_shard.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)} do not "
            f"form ag_gemm(gather_dim={gather_dim}) over {world_size} ranks"
        )
    if a_shard.stride(1) != 1:
        raise ValueError("a_shard: the last dimension must be contiguous")
    if config.comm_sms >= num_sms:
        raise ValueError(f"comm_sms: {config.comm_sms} leaves no SM for the GEMM ({num_sms} SMs)")
    geo = geometry(config, ms, ks)
    if tuple(inbox.shape) != inbox_shape(ms, ks, world_size) or inbox.dtype != a_shard.dtype:
        raise ValueError(
            f"inbox: expected {inbox_shape(ms, ks, world_size)} {a_shard.dtype}, got "
            f"{tuple(inbox.shape)} {inbox.dtype}"
        )
    if flags.numel() < flags_count(geo, world_size):
        raise ValueError(f"flags: {flags.numel()} flags, {flags_count(geo, world_size)} needed")
    if sync.numel() < SYNC_WORDS or sync.element_size() != 8 or sync.dtype.is_floating_point:
        raise ValueError(f"sync: {sync.numel()} {sync.dtype} words, {SYNC_WORDS} int64 needed")
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    consumers = min(num_sms - config.comm_sms, tiles)
    producers = config.comm_sms
    if _PHASES[phase] & 4:  # the GEMM: every program (dedicated producers join it)
        grid = producers + consumers
    else:  # the producers' steps alone: the dedicated producers, else every program's share
        grid = producers or consumers
    p_rows = _pow2_at_most(geo.row_width, 16)
    elem = a_shard.element_size()
    aligned = (
        (ks * elem) % 16 == 0
        and (a_shard.stride(0) * elem) % 16 == 0
        and a_shard.data_ptr() % 16 == 0
        and inbox.data_ptr() % 16 == 0
    )
    if watch is None:
        watch = unnamed_slot(sync.device)
    values = dict(
        io=Io(a_shard, b, out),
        bufs=Buffers(inbox, flags, sync, heap_bases, watch),
        rank=rank,
        sizes=Sizes(m, n, k, ms, ks),
        chunks=Chunks(geo.row_width, geo.n_row, geo.col_width, geo.n_col),
        strides=Strides(a_shard.stride(0), b.stride(0), b.stride(1), out.stride(0), out.stride(1)),
        programs=Programs(producers, consumers),
        LAYOUT=Layout(
            WORLD_SIZE=world_size, GATHER_DIM=gather_dim, B_ROW_MAJOR=b.stride(1) == 1,
            EVEN_K=ks % config.block_k == 0, EVEN_N=n % config.block_n == 0, ALIGNED=aligned,
        ),
        TILES=Tiles(
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
            WHOLE_K=producers == 0, GROUP_ACROSS=bool(config.group_across), PREFETCH_K=config.prefetch_k,
            TMA=tma,
        ),
        MOVES=Moves(
            P_ROWS=p_rows, P_COLS=_pow2_at_most(max(geo.col_width, 16), _COPY_ELEMS // p_rows),
            STEPS=_PHASES[phase], PULL=how == "pull", PUSH_ORDER=config.push_order,
            RELEASE_EACH=bool(config.release_each),
        ),
    )  # fmt: skip
    names = KERNEL.arg_names
    if set(names) != set(values):
        raise TypeError(f"{KERNEL.__name__}: parameters {names} do not match the launcher's {sorted(values)}")
    return (
        grid,
        [values[name] for name in names],
        {"num_warps": config.num_warps, "num_stages": config.num_stages},
    )


def _specialization(a_shard, b, out) -> tuple:
    """What Triton specialises a compiled launch on, of the per-call tensors: shapes, strides, dtypes
    and 16-byte alignment (the workspace's buffers never change under one launch cache)."""
    return (
        a_shard.shape, a_shard.stride(), a_shard.dtype, a_shard.data_ptr() & 15,
        b.shape, b.stride(), b.dtype, b.data_ptr() & 15,
        out.shape, out.stride(), out.dtype, out.data_ptr() & 15,
    )  # fmt: skip


class _CompiledLaunch:
    """One compiled kernel with its grid and arguments; a call swaps in the per-call tensors (the first
    argument, :class:`.args.Io`) and launches through the compiled kernel's own launcher, skipping Triton's
    argument binding and specialisation (tens of microseconds for ~40 arguments). ``scratch``: the TMA
    consumer's allocator."""

    __slots__ = ("runner", "args", "scratch")

    def __init__(self, compiled: Any, grid: int, args: list[Any], scratch: Scratch | None = None) -> None:
        self.runner = compiled[(grid, 1, 1)]
        self.args = args
        self.scratch = scratch

    def __call__(self, a_shard: Any, b: Any, out: Any) -> None:
        args = self.args
        args[0] = (a_shard, b, out)  # the compiled launcher reads the group's fields in order
        try:
            if self.scratch is None:
                self.runner(*args)
            else:
                with scratch_allocator(self.scratch):
                    self.runner(*args)
        finally:
            args[0] = None  # hold no user tensor between calls


def launch(
    how: str,
    *,
    a_shard,
    b,
    out,
    inbox,
    flags,
    sync,
    heap_bases,
    rank: int,
    world_size: int,
    gather_dim: int,
    config: FusedConfig,
    num_sms: int,
    phase: str = "all",
    cache: dict | None = None,
    tma: Callable[[], bool] | None = None,
    watch: Any = None,
):
    """``out = all_gather(a_shard, gather_dim) @ b`` by transport ``how`` (:data:`TRANSPORTS`); collective
    over ``world_size`` ranks. Arguments as :func:`_launch_args`' (named here, not forwarded as ``**``:
    this is every call's path, where binding a dict costs about a microsecond). ``tma``: asked (only when a
    launch is not in ``cache``) whether this call runs the TMA consumer; its answer must follow from the
    tensors' specialisation and the workspace, like everything a compiled launch keeps."""
    fast = cache is not None and phase == "all"
    if fast:
        spec = _specialization(a_shard, b, out)
        compiled = cache.get(spec)
        if compiled is not None:
            compiled(a_shard, b, out)
            return out
    grid, args, options = _launch_args(
        how, a_shard=a_shard, b=b, out=out, inbox=inbox, flags=flags, sync=sync, heap_bases=heap_bases,
        rank=rank, world_size=world_size, gather_dim=gather_dim, config=config, num_sms=num_sms,
        phase=phase, tma=tma is not None and tma(), watch=watch,
    )  # fmt: skip
    scratch = None
    if args[
        KERNEL.arg_names.index("TILES")
    ].TMA:  # the device-made descriptors' scratch, kept with the launches
        scratch = cache.setdefault("tma_scratch", Scratch()) if cache is not None else Scratch()
    with scratch_allocator(scratch):
        handle = KERNEL[(grid,)](*args, **options)
    if fast and hasattr(handle, "run") and len(cache) < 64:  # a compiled kernel (not the interpreter)
        cache[spec] = _CompiledLaunch(handle, grid, [None, *args[1:]], scratch)
    return out


def fused_launcher(how: str) -> Callable[..., Any]:
    """The public launcher of the fused kernel with transport ``how`` (``ag_gemm_push``, ``ag_gemm_pull``)."""
    if how not in TRANSPORTS:
        raise ValueError(f"how: must be one of {', '.join(TRANSPORTS)}, got {how!r}")
    if KERNEL.arg_names[0] != "io":  # the per-call slot of _CompiledLaunch
        raise TypeError(f"{KERNEL.__name__}: the first parameter must be io (the call's tensors)")

    def ag_gemm(**kwargs: Any) -> Any:
        return launch(how, **kwargs)

    ag_gemm.__name__ = ag_gemm.__qualname__ = f"ag_gemm_{how}"
    ag_gemm.__module__ = f"{__package__}.{how}"
    ag_gemm.__doc__ = (
        f"``out = all_gather(a_shard, gather_dim) @ b`` by {how}; collective over ``world_size`` ranks.\n\n"
        "``inbox`` (:func:`inbox_shape`, A's dtype) and ``flags`` (int32, :func:`flags_count`, zeroed once)\n"
        f"live in the symmetric heap; ``sync`` (int64, {SYNC_WORDS}, zeroed once) holds the device-side "
        "epoch\nand tile queue. Nothing is reset between calls; ``phase`` as in :func:`_launch_args`. "
        "``cache``: a\n"
        "dict owned by one workspace (every call with it passes the same inbox, flags, sync, heap_bases,\n"
        "watch, rank, world_size, gather_dim, config and num_sms): compiled launches by the tensors'\n"
        "shapes, strides, dtypes and alignment, so repeated calls skip the checks and Triton's argument\n"
        "binding. "
        "``watch``: the watch slot bounding the waits on peers (None: the process's unnamed slot)."
    )
    return ag_gemm
