"""The fused ``gemm_rs`` kernel (``push``): each rank's GEMM tiles go to their owner as they finish, and
the owner reduces them.

Rank ``r`` holds ``A_r (M, Ks)`` and ``B_r (Ks, N)``; the output is ``sum_r A_r B_r`` scattered along
``FORM.SCATTER_DIM`` (rank ``o`` owns rows ``[o Mo, (o+1) Mo)``, or columns ``[o No, (o+1) No)``). One
persistent launch, two steps per program:

1. **GEMM and push.** The tiles of the partial product in owner order: the next rank's slice first,
   this rank's own last (``rank + 1, rank + 2, ...``), so every peer's slice is finished and sent while
   the rest is computed. Each tile (fp32 accumulator, stored in the input's dtype, as BSP's partial
   product is) goes to slot ``rank`` of its owner's inbox (``2 parity x WORLD_SIZE x Mo x No`` in the
   symmetric heap), then, after a CTA barrier, one release at system scope of its flag
   ``[parity, rank, tile]`` on the owner. Nothing in this step waits.
2. **Reduce.** The owner's tiles: for each source (the one that sends it first, ``rank - 1``, first;
   its own last), spin on the flag with acquire loads until it holds this call's epoch, then add the
   partial in fp32; store the sum in the output's dtype.

Every wait gives up after the bound of the watch slot ``bufs.watch`` (``kernels/common/watch.py``), recorded
there; a program that gave up polls its later flags once, so the kernel always ends.

Every program finishes its step 1 before it waits in step 2, and the grid is at most one program per SM
(all resident), so every wait ends. Epoch and parity as in ``ag_gemm``'s protocol (``common.sync``):
``sync[0]`` counts arrivals, flags hold epochs, inbox and flags have two parity slots, a rank is at
most one call ahead of any peer (a call's reduce waits for every peer's tiles of that call). ``FORM.STEPS``
(bit 1: GEMM and push, bit 2: reduce) splits a call for the interpreter, whose programs run one after
another: every rank's step 1, then every rank's step 2 (which counts the arrivals).
"""

from __future__ import annotations

import iris
import triton
import triton.language as tl

from ..common.gemm import mma_k_range
from ..common.sync import epoch_begin, heap_delta
from ..common.tiles import grouped_tile
from ..common.tma import b_descriptor, tma_k_range
from ..common.watch import spin_one


@triton.jit
def owner_tiles(M, N, Mo, No, SCATTER_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(tile rows, tile columns)`` of one owner's slice (``Mo x N`` or ``M x No``)."""
    if SCATTER_DIM == 0:
        tm = tl.cdiv(Mo, BLOCK_M)
        tn = tl.cdiv(N, BLOCK_N)
    else:
        tm = tl.cdiv(M, BLOCK_M)
        tn = tl.cdiv(No, BLOCK_N)
    return tm, tn


@triton.jit
def gemm_rs_push_kernel(
    io,
    bufs,
    rank,
    sizes,
    strides,
    num_programs,
    FORM: tl.constexpr,
    TILES: tl.constexpr,
):
    """One rank's slice of ``sum_r A_r @ B_r`` (module docstring). The arguments are the groups of
    :mod:`.args`: ``io`` the call's tensors (``io.c`` the ``Mo x N`` or ``M x No`` output), ``bufs`` the
    workspace (``bufs.inbox`` and ``bufs.flags`` this rank's heap buffers), ``sizes``, ``strides``;
    constexpr ``FORM`` and ``TILES``. ``TILES.TMA``: the tiles' K loop by TMA loads (A K-contiguous, B
    row-major or, ``FORM.B_ROW_MAJOR`` false, column-major; 16-byte aligned), rows past the slice read
    from the next one and never stored."""
    BLOCK_M: tl.constexpr = TILES.BLOCK_M  # shapes take constexprs (a group's field is a plain value)
    BLOCK_N: tl.constexpr = TILES.BLOCK_N
    pid = tl.program_id(0)
    epoch = epoch_begin(bufs.sync, num_programs, (FORM.STEPS & 2) != 0)
    parity = epoch % 2
    tm, tn = owner_tiles(sizes.M, sizes.N, sizes.Mo, sizes.No, FORM.SCATTER_DIM, TILES.BLOCK_M, TILES.BLOCK_N)
    per_owner = tm * tn
    slot = tl.cast(sizes.Mo, tl.int64) * sizes.No
    flags = bufs.flags + parity * (FORM.WORLD_SIZE * per_owner)
    inbox = bufs.inbox + parity.to(tl.int64) * FORM.WORLD_SIZE * slot
    offs_m = tl.arange(0, TILES.BLOCK_M)
    offs_n = tl.arange(0, TILES.BLOCK_N)
    offs_k = tl.arange(0, TILES.BLOCK_K)
    if FORM.STEPS & 1:
        if TILES.TMA:
            a_desc = tl.make_tensor_descriptor(
                io.a, [sizes.M, sizes.K], [strides.am, 1], [TILES.BLOCK_M, TILES.BLOCK_K]
            )
            b_desc = b_descriptor(
                io.b, sizes.K, sizes.N, strides.bk, strides.bn, TILES.BLOCK_K, TILES.BLOCK_N, FORM.B_ROW_MAJOR
            )
        for t in range(pid, FORM.WORLD_SIZE * per_owner, num_programs):
            owner = (rank + 1 + t // per_owner) % FORM.WORLD_SIZE
            tile = t % per_owner
            pm, pn = grouped_tile(tile, tm, tn, TILES.GROUP_M)
            lr = pm * TILES.BLOCK_M + offs_m  # rows and columns inside the owner's slice
            lc = pn * TILES.BLOCK_N + offs_n
            if FORM.SCATTER_DIM == 0:  # the tile's first row and column in the partial product
                row0 = owner * sizes.Mo + pm * TILES.BLOCK_M
                col0 = pn * TILES.BLOCK_N
                live_r = lr < sizes.Mo
                live_c = lc < sizes.N
            else:
                row0 = pm * TILES.BLOCK_M
                col0 = owner * sizes.No + pn * TILES.BLOCK_N
                live_r = lr < sizes.M
                live_c = lc < sizes.No
            rows = row0 + offs_m
            cols = col0 + offs_n
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            if TILES.TMA:
                acc = tma_k_range(
                    acc, a_desc, row0, b_desc, 0, col0, 0, sizes.K, TILES.BLOCK_K, FORM.B_ROW_MAJOR
                )
            else:
                # rows past the slice read row 0 (never stored); columns stay contiguous (B's loads
                # vectorise along N where B is row-major) and are masked instead
                safe_rows = tl.where(live_r, rows, 0).to(tl.int64)
                cols = tl.max_contiguous(cols, BLOCK_N)  # (its alignment follows from No, specialised)
                a_ptrs = io.a + safe_rows[:, None] * strides.am + offs_k[None, :] * strides.ak
                b_ptrs = io.b + offs_k[:, None] * strides.bk + cols.to(tl.int64)[None, :] * strides.bn
                acc = mma_k_range(
                    acc,
                    a_ptrs,
                    b_ptrs,
                    0,
                    sizes.K,
                    strides.ak,
                    strides.bk,
                    live_c,
                    TILES.BLOCK_K,
                    FORM.EVEN_K,
                    False,
                )
            # into this rank's slot of the owner's inbox
            dst = inbox + rank * slot + heap_delta(bufs.inbox, rank, owner, bufs.heap_bases)
            ptrs = dst + lr.to(tl.int64)[:, None] * sizes.No + lc[None, :]
            tl.store(ptrs, acc.to(bufs.inbox.dtype.element_ty), mask=live_r[:, None] & live_c[None, :])
            tl.debug_barrier()  # every thread's stores precede the single release below
            flag = flags + rank * per_owner + tile
            iris.atomic_xchg(flag, epoch, rank, owner, bufs.heap_bases, sem="release", scope="sys")
    if FORM.STEPS & 2:
        ok = 1  # 0 once a wait of this program gave up
        for tile in range(pid, per_owner, num_programs):
            pm, pn = grouped_tile(tile, tm, tn, TILES.GROUP_M)
            lr = pm * TILES.BLOCK_M + offs_m
            lc = pn * TILES.BLOCK_N + offs_n
            live = (lr < sizes.Mo)[:, None] & (lc < sizes.No)[None, :]
            at = lr.to(tl.int64)[:, None] * sizes.No + lc[None, :]
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(FORM.WORLD_SIZE):
                src = (rank + FORM.WORLD_SIZE - 1 - s) % FORM.WORLD_SIZE  # in the order the partials are made
                index = src * per_owner + tile
                flag = flags + index
                part_ptrs = inbox + src * slot + at
                ok = spin_one(flag, epoch, bufs.watch, src, index, ok)
                tl.debug_barrier()  # the acquiring thread's observation precedes every thread's loads
                part = tl.load(part_ptrs, mask=live, other=0.0, cache_modifier=".cg")
                total += part.to(tl.float32)
            c_ptrs = io.c + lr.to(tl.int64)[:, None] * strides.cm + lc[None, :] * strides.cn
            tl.store(c_ptrs, total.to(io.c.dtype.element_ty), mask=live)
