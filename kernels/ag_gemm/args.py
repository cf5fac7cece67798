"""The fused ag_gemm kernel's arguments, grouped: each group is defined once here, the launcher
(:func:`.fused._launch_args`) fills it, and the kernel's helpers take the groups (or the fields) they use.

A group is a named tuple: Triton passes its fields to the compiled kernel as separate parameters, in
order, and specialises each field as it would a parameter of its own, so grouping changes neither the
compiled code nor the launch (the restamp tool compares both). Runtime groups hold pointers and
integers; the capitalised ones are ``tl.constexpr`` (compiled in). Light: no torch or Triton import.

``Io`` (this rank's shard of A, B, the output C) and ``Buffers`` (the inbox of every rank's shard in two
parity slots, the flags, the epoch and tile-queue words, the heap bases, the watch slot) are the groups
``gemm_rs``'s kernel takes too (:mod:`..common.args`).
"""

from __future__ import annotations

from typing import NamedTuple

from ..common.args import Buffers, Io

__all__ = ["Buffers", "Chunks", "Io", "Layout", "Moves", "Programs", "Sizes", "Strides", "Tiles"]


class Sizes(NamedTuple):
    """The gathered problem ``M x N x K`` and one rank's shard ``Ms x Ks``."""

    M: int
    N: int
    K: int
    Ms: int
    Ks: int


class Chunks(NamedTuple):
    """The shard's chunks, one flag each: ``n_rc`` row chunks of ``rcw`` rows by ``n_kc`` K chunks of
    ``kcw`` columns (:class:`~..common.tiles.ChunkGeometry`)."""

    rcw: int
    n_rc: int
    kcw: int
    n_kc: int


class Strides(NamedTuple):
    """Row stride of the shard (its columns are contiguous), both strides of B and of C."""

    am: int
    bk: int
    bn: int
    cm: int
    cn: int


class Programs(NamedTuple):
    """The grid's split: dedicated producers (program ids below ``producers``) and GEMM consumers."""

    producers: int
    consumers: int


class Layout(NamedTuple):
    """Constexpr: what the ranks and the call's tensors decide."""

    WORLD_SIZE: int
    GATHER_DIM: int
    B_ROW_MAJOR: bool
    EVEN_K: bool
    EVEN_N: bool
    ALIGNED: bool


class Tiles(NamedTuple):
    """Constexpr: the GEMM's tiles and schedule (``TMA``: the TMA consumer)."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int
    WHOLE_K: bool
    GROUP_ACROSS: bool
    PREFETCH_K: int
    TMA: bool


class Moves(NamedTuple):
    """Constexpr: how the producers move the shard (copy block ``P_ROWS x P_COLS``, the launch's steps,
    the transport and the many-peer orders)."""

    P_ROWS: int
    P_COLS: int
    STEPS: int
    PULL: bool
    PUSH_ORDER: int
    RELEASE_EACH: bool
