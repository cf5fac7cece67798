"""The fused ``gemm_rs`` kernel's arguments, grouped as ``ag_gemm``'s are (:mod:`..ag_gemm.args`): each
group is defined once here, the launcher (:func:`.push._launch_args`) fills it and the kernel
(:mod:`.push_kernel`) reads its fields.

A group is a named tuple: Triton passes its fields to the compiled kernel as separate parameters, in
order, and specialises each field as it would a parameter of its own, so grouping changes neither the
compiled code nor the launch (the restamp tool compares both). The fields keep the order of the
kernel's flat parameters before grouping. Runtime groups hold pointers and integers; the capitalised
ones are ``tl.constexpr`` (compiled in). Light: no torch or Triton import.

``Io`` (this rank's A and B, its K slice, and its output slice C) and ``Buffers`` (the inbox of every
rank's partial slice in two parity slots, the flags, the arrivals word, the heap bases, the watch slot)
are ``ag_gemm``'s groups (:mod:`..common.args`).
"""

from __future__ import annotations

from typing import NamedTuple

from ..common.args import Buffers, Io

__all__ = ["Buffers", "Form", "Io", "Sizes", "Strides", "Tiles"]


class Sizes(NamedTuple):
    """The partial product ``M x N x K`` (K: this rank's slice) and one owner's slice ``Mo x No``."""

    M: int
    N: int
    K: int
    Mo: int
    No: int


class Strides(NamedTuple):
    """Both strides of A, B and C."""

    am: int
    ak: int
    bk: int
    bn: int
    cm: int
    cn: int


class Form(NamedTuple):
    """Constexpr: what the ranks, the call's tensors and the variant decide (``STEPS``: the launch's
    steps, bit 1 GEMM and push, bit 2 reduce)."""

    WORLD_SIZE: int
    SCATTER_DIM: int
    B_ROW_MAJOR: bool
    EVEN_K: bool
    STEPS: int


class Tiles(NamedTuple):
    """Constexpr: the GEMM's tiles and its K loop (``TMA``: by TMA loads)."""

    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int
    TMA: bool
