"""Tile scheduling shared by the persistent GEMM and the fused ag_gemm kernels.

Device helpers: grouped ("super-grouped") tile order, so CTAs running at the same time share rows of A
and columns of B in L2; rank rotation, so each rank starts on the rows or K-slice it already holds.
Host helper: the chunk geometry that producers (who raise one flag per chunk) and consumers (who wait
per chunk) must agree on.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl


@triton.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, group_m):
    """``(pid_m, pid_n)`` of ``tile_id`` in grouped order: ``group_m`` row tiles sweep N together."""
    width = group_m * num_pid_n
    group_id = tile_id // width
    first_m = group_id * group_m
    group_size = tl.minimum(num_pid_m - first_m, group_m)
    pid_m = first_m + (tile_id % width) % group_size
    pid_n = (tile_id % width) // group_size
    return pid_m, pid_n


@triton.jit
def rotate(index, shift, count):
    """``(index + shift) % count``: rank rotation of a tile or segment index."""
    return (index + shift) % count


@dataclass(frozen=True)
class ChunkGeometry:
    """How a ``(rows, cols)`` shard is cut into flag-guarded chunks.

    ``row_width`` rows by ``col_width`` columns per chunk; ``col_width`` is a multiple of the GEMM's
    ``BLOCK_K`` so a consumer's K loop never straddles two column chunks.
    """

    row_width: int
    n_row: int
    col_width: int
    n_col: int

    @property
    def count(self) -> int:
        return self.n_row * self.n_col


def chunk_geometry(rows: int, cols: int, row_chunks: int, col_chunks: int, block_k: int) -> ChunkGeometry:
    """Cut a ``rows x cols`` shard into at most ``row_chunks x col_chunks`` non-empty chunks."""
    if rows <= 0 or cols <= 0:
        raise ValueError(f"shard: rows and cols must be positive, got {rows}x{cols}")
    if row_chunks <= 0 or col_chunks <= 0:
        raise ValueError(f"chunks: row_chunks and k_chunks must be positive, got {row_chunks}, {col_chunks}")
    row_width = triton.cdiv(rows, row_chunks)
    col_width = triton.cdiv(triton.cdiv(cols, col_chunks), block_k) * block_k
    return ChunkGeometry(row_width, triton.cdiv(rows, row_width), col_width, triton.cdiv(cols, col_width))
