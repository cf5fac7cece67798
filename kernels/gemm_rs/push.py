"""Host side of the fused ``gemm_rs`` kernel (``push`` and ``push_tma``): config, buffers'
shapes, launch.

The kernel and its synchronisation are in :mod:`.push_kernel`; its arguments are the groups of
:mod:`.args`, which :func:`gemm_rs_push` fills.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import triton

from ..common.gemm import GemmConfig
from ..common.tma import Scratch, scratch_allocator
from ..common.watch import unnamed_slot
from .args import Buffers, Form, Io, Sizes, Strides, Tiles
from .push_kernel import gemm_rs_push_kernel

if TYPE_CHECKING:
    import torch

KERNEL = gemm_rs_push_kernel
#: The kernel's parameters, in order (the groups of :mod:`.args`): :func:`gemm_rs_push` passes them so.
PARAMETERS = ("io", "bufs", "rank", "sizes", "strides", "num_programs", "FORM", "TILES")
_group = tuple.__new__  # ``_group(Group, fields)``: a group of :mod:`.args` from its fields, in order
if tuple(KERNEL.arg_names) != PARAMETERS:
    raise TypeError(f"{KERNEL.__name__}: parameters {KERNEL.arg_names}, the launcher passes {PARAMETERS}")
#: int64 words of a rank's ``sync`` buffer: the program arrivals (only grow).
SYNC_WORDS = 1
#: Launch phase -> steps run (bit 1: GEMM and push, bit 2: reduce).
PHASES = {"all": 3, "push": 1, "reduce": 2}


#: Tiles and grid of the fused ``gemm_rs`` kernel: the persistent GEMM's (``num_programs`` 0: one per SM).
RsConfig = GemmConfig


def out_dims(m: int, n: int, world_size: int, scatter_dim: int) -> tuple[int, int]:
    """``(Mo, No)``: one rank's output slice."""
    return (m // world_size, n) if scatter_dim == 0 else (m, n // world_size)


def inbox_shape(mo: int, no: int, world_size: int) -> tuple[int, int, int, int]:
    """A rank's inbox: two parity slots of every rank's partial slice."""
    return (2, world_size, mo, no)


def flags_count(m: int, n: int, world_size: int, scatter_dim: int, config: RsConfig) -> int:
    """int32 flags a rank needs: two parity slots of ``world_size x`` one owner's tiles."""
    mo, no = out_dims(m, n, world_size, scatter_dim)
    return 2 * world_size * triton.cdiv(mo, config.block_m) * triton.cdiv(no, config.block_n)


def grid_of(config: RsConfig, num_sms: int) -> int:
    """Programs of a launch: all resident (at most one per SM), so every wait in the reduce step ends."""
    return min(config.num_programs or num_sms, num_sms)


def tma_ready(a: Any, b: Any) -> str | None:
    """Why TMA cannot address ``a`` and ``b`` (None when it can): A K-contiguous, B row- or column-major,
    bases and leading strides on 16 bytes."""
    elem = a.element_size()
    if a.stride(1) != 1:
        return "a: its K dimension is not contiguous"
    if b.stride(1) != 1 and b.stride(0) != 1:
        return "b: neither stride is 1"
    b_lead = b.stride(0) if b.stride(1) == 1 else b.stride(1)
    for what, value in (("a's base", a.data_ptr()), ("a's row stride", a.stride(0) * elem),
                        ("b's base", b.data_ptr()), ("b's leading stride", b_lead * elem)):  # fmt: skip
        if value % 16:
            return f"{what} is not a multiple of 16 bytes"
    return None


def gemm_rs_push(
    *,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    inbox: torch.Tensor,
    flags: torch.Tensor,
    sync: torch.Tensor,
    heap_bases: torch.Tensor,
    scratch: Scratch | None = None,
    watch: torch.Tensor | None = None,
    rank: int,
    world_size: int,
    scatter_dim: int,
    tma: bool = False,
    config: RsConfig,
    num_sms: int,
    phase: str = "all",
) -> torch.Tensor:
    """``out`` = this rank's slice of ``sum_r a_r @ b_r`` along ``scatter_dim``; collective over
    ``world_size`` ranks. ``inbox`` (:func:`inbox_shape`, a's dtype) and ``flags`` (int32,
    :func:`flags_count`, zeroed once) live in the symmetric heap; ``sync`` (int64, zeroed once) counts the
    arrivals. Nothing is reset between calls; ``phase`` other than ``"all"`` is for the interpreter.
    ``tma``: the GEMM's K loop by TMA loads where :func:`tma_ready` allows (else the plain one, same
    buffers and protocol), its descriptors' scratch from ``scratch`` (kept by the caller: one per
    workspace). ``watch``: the watch slot bounding the waits on peers (``kernels/common/watch.py``; None: the
    process's slot for unnamed launches)."""
    config.validate()
    if scatter_dim not in (0, 1):
        raise ValueError(f"scatter_dim: must be 0 or 1, got {scatter_dim}")
    if phase not in PHASES:
        raise ValueError(f"phase: must be one of {', '.join(PHASES)}, got {phase!r}")
    m, k = a.shape
    n = b.shape[1]
    mo, no = out_dims(m, n, world_size, scatter_dim)
    if b.shape[0] != k or (m, n)[scatter_dim] % world_size or tuple(out.shape) != (mo, no):
        raise ValueError(
            f"shapes: a {tuple(a.shape)}, b {tuple(b.shape)}, out {tuple(out.shape)} do not form "
            f"gemm_rs(scatter_dim={scatter_dim}) over {world_size} ranks"
        )
    want = inbox_shape(mo, no, world_size)
    if tuple(inbox.shape) != want or inbox.dtype != a.dtype:
        raise ValueError(f"inbox: expected {want} {a.dtype}, got {tuple(inbox.shape)} {inbox.dtype}")
    needed = flags_count(m, n, world_size, scatter_dim, config)
    if flags.numel() < needed:
        raise ValueError(f"flags: {flags.numel()} flags, {needed} needed")
    grid = grid_of(config, num_sms)
    use_tma = tma and tma_ready(a, b) is None
    if watch is None:
        watch = unnamed_slot(sync.device)
    # in the order of PARAMETERS; each group made as the tuple it is (``_group``: half the time of
    # ``Group(...)``, a microsecond a call over the six), its fields in the order :mod:`.args` lists them
    args = (
        _group(Io, (a, b, out)),
        _group(Buffers, (inbox, flags, sync, heap_bases, watch)),
        rank,
        _group(Sizes, (m, n, k, mo, no)),
        _group(Strides, (a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))),
        grid,
        # WORLD_SIZE, SCATTER_DIM, B_ROW_MAJOR, EVEN_K, STEPS
        _group(Form, (world_size, scatter_dim, b.stride(1) == 1, k % config.block_k == 0, PHASES[phase])),
        # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, TMA
        _group(Tiles, (config.block_m, config.block_n, config.block_k, config.group_m, use_tma)),
    )
    with scratch_allocator((scratch or Scratch()) if use_tma else None):
        KERNEL[(grid,)](*args, num_warps=config.num_warps, num_stages=config.num_stages)
    return out
