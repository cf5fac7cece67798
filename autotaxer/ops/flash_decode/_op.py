"""The ``flash_decode`` problem: shapes, inputs per rank, the fp32 reference and torch partial math.

Decoding one new token per batch row over a KV cache sharded along the sequence: rank r holds
positions ``[r * S/ws, (r + 1) * S/ws)`` of every row, as ``k_shard``/``v_shard (B, S/ws, Hkv, D)``.
Row ``b`` is valid up to global length ``L_b``; each rank receives ``lengths (B,)`` int32, the valid
prefix of its shard (:func:`shard_lengths`). Every rank holds the same ``q (B, H, D)`` and returns
the full ``softmax(q k^T / sqrt(D)) v`` of shape ``(B, H, D)``; query head ``h`` uses KV head
``h // (H // Hkv)``.

Partials (local part of BSP on CPU, and the interpreter tests' expectation) are normalised outputs
``O`` with their log-sum-exp in base 2, ``-inf`` for an empty piece.
"""

from __future__ import annotations

import math
from typing import Any

from ..._problem import ProblemKey, dtype_name, torch_dtype
from .._base import Op

HEAD_DIMS = (64, 128)  # = kernels.flash_decode.partials.HEAD_DIMS (kept light: no triton import)
LENGTH_MODES = ("full", "uneven")


def local_length(key: ProblemKey) -> int:
    """Positions per rank, ``S / world_size``."""
    return key["S"] // key.world_size


def shard_lengths(global_lengths: Any, rank: int, world_size: int, s_local: int) -> Any:
    """The valid prefix of ``rank``'s shard for global row lengths (int32, clamped to ``[0, s_local]``)."""
    import torch

    return (global_lengths.to(torch.int64) - rank * s_local).clamp(0, s_local).to(torch.int32)


def global_lengths(key: ProblemKey, seed: int, mode: str = "full") -> Any:
    """Row lengths (CPU int64): all ``S`` (``full``) or seeded, uneven lengths in ``[1, S]`` (``uneven``).

    ``uneven`` always has a full row and, with ``B >= 2``, a row that ends inside rank 0's shard (so
    later ranks hold nothing of it); the rest are uniform in ``[1, S]``.
    """
    import torch

    b, s = key["B"], key["S"]
    if mode == "full":
        return torch.full((b,), s, dtype=torch.int64)
    if mode != "uneven":
        raise ValueError(f"lengths: expected one of {LENGTH_MODES}, got {mode!r}")
    g = torch.Generator().manual_seed(seed * 7919 + 11)
    out = torch.randint(1, s + 1, (b,), generator=g, dtype=torch.int64)
    out[0] = s
    if b >= 2:
        out[1] = 1 + int(torch.randint(0, max(local_length(key), 1), (1,), generator=g))
    return out


def _generator(device: Any, seed: int):
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _query(key: ProblemKey, device: Any, seed: int):
    import torch

    g = _generator(device, seed * 1009 + 5)
    q = torch.randn((key["B"], key["H"], key["D"]), generator=g, device=device, dtype=torch.float32)
    return q.to(torch_dtype(key.dtype))


def _kv_row(key: ProblemKey, rank: int, b: int, device: Any, seed: int):
    """Row ``b`` of ``rank``'s ``(k, v)``, each ``(S/ws, Hkv, D)``: one generator per (seed, rank, row)."""
    import torch

    dtype = torch_dtype(key.dtype)
    shape = (local_length(key), key["Hkv"], key["D"])
    g = _generator(device, (seed * 1009 + 17 * (rank + 1)) * 4099 + b)
    k = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    v = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    return k, v


def _kv_shard(key: ProblemKey, rank: int, device: Any, seed: int):
    """``(k, v)`` of ``rank``, generated row by row (bounded fp32 temporaries at long contexts)."""
    import torch

    shape = (key["B"], local_length(key), key["Hkv"], key["D"])
    k = torch.empty(shape, dtype=torch_dtype(key.dtype), device=device)
    v = torch.empty_like(k)
    for b in range(key["B"]):
        k[b], v[b] = _kv_row(key, rank, b, device, seed)
    return k, v


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def partials_torch(q: Any, k: Any, v: Any, lengths: Any, splits: int, block: int = 1) -> tuple[Any, Any]:
    """Partials of one shard in fp32 torch math: ``O (B, H, splits, D)``, ``LSE (B, H, splits)`` (base 2).

    Split ``s`` of a row with ``L`` valid positions covers ``[s * per, min((s + 1) * per, L))`` with
    ``per = ceil(ceil(L / splits) / block) * block``: the pieces of the Triton kernel when ``block`` is
    its ``BLOCK_N``.
    """
    import torch

    bsz, h, d = q.shape
    hkv = k.shape[2]
    group = h // hkv
    o = torch.zeros((bsz, h, splits, d), dtype=torch.float32, device=q.device)
    lse = torch.full((bsz, h, splits), -math.inf, dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(d)
    for b in range(bsz):
        n = int(lengths[b])
        per = _cdiv(_cdiv(n, splits), block) * block
        for s in range(splits):
            lo, hi = s * per, min((s + 1) * per, n)
            if lo >= hi:
                continue
            qf = q[b].float().view(hkv, group, d)
            kf = k[b, lo:hi].float()  # (n, Hkv, D)
            vf = v[b, lo:hi].float()
            scores = torch.einsum("kgd,nkd->kgn", qf, kf) * scale
            m = scores.amax(-1, keepdim=True)
            p = torch.exp(scores - m)
            den = p.sum(-1, keepdim=True)
            o[b, :, s] = (torch.einsum("kgn,nkd->kgd", p, vf) / den).reshape(h, d)
            lse[b, :, s] = ((m + torch.log(den)) / math.log(2.0)).reshape(h)
    return o, lse


def combine_torch(o: Any, lse: Any) -> Any:
    """Merge partials ``O (..., P, D)`` with base-2 ``LSE (..., P)`` into fp32 ``(..., D)``; all-empty: 0."""
    import torch

    m = lse.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(lse - m)
    den = w.sum(-1, keepdim=True)
    num = (w.unsqueeze(-1) * o).sum(-2)
    return torch.where(den > 0, num / den.clamp_min(1e-30), torch.zeros_like(num))


class FlashDecode(Op):
    name = "flash_decode"
    shape_fields = ("B", "H", "Hkv", "D", "S")
    layout_choices = {}

    def validate(self, key: ProblemKey) -> None:
        for f in self.shape_fields:
            if key.get(f) is None:
                raise ValueError(f"{f}: missing")
            if key[f] <= 0:
                raise ValueError(f"{f}: must be positive, got {key[f]}")
        if key.world_size <= 0:
            raise ValueError(f"world_size: must be positive, got {key.world_size}")
        if key["H"] % key["Hkv"]:
            raise ValueError(f"H: {key['H']} query heads are not a multiple of Hkv={key['Hkv']}")
        if key["D"] not in HEAD_DIMS:
            raise ValueError(f"D: head dim must be one of {HEAD_DIMS}, got {key['D']}")
        if key["S"] % key.world_size:
            raise ValueError(f"S: {key['S']} is not divisible by world size {key.world_size} (S is sharded)")

    def make_inputs(
        self, key: ProblemKey, rank: int, device: Any, seed: int, *, lengths: str = "full"
    ) -> tuple[Any, ...]:
        """``(q, k_shard, v_shard, lengths_shard)`` for ``rank``; ``lengths="uneven"`` for ragged rows."""
        lens = global_lengths(key, seed, lengths)
        k, v = _kv_shard(key, rank, device, seed)
        local = shard_lengths(lens, rank, key.world_size, local_length(key)).to(device)
        return _query(key, device, seed), k, v, local

    def reference(self, key: ProblemKey, rank: int, device: Any, seed: int, *, lengths: str = "full") -> Any:
        """fp32 attention of ``q`` over the gathered valid KV of every row (the same on every rank)."""
        import torch

        lens = global_lengths(key, seed, lengths)
        q = _query(key, device, seed).float()
        hkv, d, s_local = key["Hkv"], key["D"], local_length(key)
        group = key["H"] // hkv
        out = torch.empty((key["B"], key["H"], d), dtype=torch.float32, device=device)
        for b in range(key["B"]):  # row by row: at long contexts the shards of every rank would not fit
            n = int(lens[b])
            rows = [_kv_row(key, r, b, device, seed) for r in range(-(-n // s_local))]  # ranks holding row b
            k = torch.cat([kr.float() for kr, _ in rows], dim=0)[:n]  # (n, Hkv, D)
            v = torch.cat([vr.float() for _, vr in rows], dim=0)[:n]
            del rows
            scores = torch.einsum("kgd,nkd->kgn", q[b].view(hkv, group, d), k) / math.sqrt(d)
            out[b] = torch.einsum("kgn,nkd->kgd", torch.softmax(scores, dim=-1), v).reshape(key["H"], d)
        return out

    def empty_output(self, key: ProblemKey, device: Any) -> Any:
        import torch

        shape = (key["B"], key["H"], key["D"])
        return torch.full(shape, float("nan"), dtype=torch_dtype(key.dtype), device=device)

    def key_from_inputs(
        self, tensors: tuple, layout: dict[str, int], world_size: int, gpu_model: str
    ) -> ProblemKey:
        """The problem key of ``dispatch("flash_decode", q, k_shard, v_shard[, lengths])``."""
        if len(tensors) not in (3, 4):
            raise ValueError(
                f"flash_decode: expected 3 or 4 tensors (q, k, v[, lengths]), got {len(tensors)}"
            )
        q, k, v = tensors[:3]
        if q.dim() != 3 or k.dim() != 4 or tuple(v.shape) != tuple(k.shape):
            raise ValueError(
                f"flash_decode: q must be (B, H, D) and k, v (B, S/ws, Hkv, D); got {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}"
            )
        bsz, h, d = q.shape
        if k.shape[0] != bsz or k.shape[3] != d:
            raise ValueError(f"flash_decode: k {tuple(k.shape)} does not match q {tuple(q.shape)} in B or D")
        if not (q.dtype == k.dtype == v.dtype):
            raise ValueError(f"dtype: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        if not (q.device == k.device == v.device):
            raise ValueError(f"device: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
        if len(tensors) == 4:
            import torch

            lens = tensors[3]
            if lens.dtype != torch.int32 or tuple(lens.shape) != (bsz,) or lens.device != q.device:
                raise ValueError(
                    f"lengths: expected int32 ({bsz},) on {q.device}, got {lens.dtype} {tuple(lens.shape)} "
                    f"on {lens.device}"
                )
        shape = {"B": bsz, "H": h, "Hkv": k.shape[2], "D": d, "S": k.shape[1] * world_size}
        return ProblemKey.make(self.name, gpu_model, world_size, dtype_name(q.dtype), shape, layout)
