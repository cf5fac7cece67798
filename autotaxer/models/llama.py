"""A Llama-3-class decoder layer with sequence-parallel tensor parallelism, three ways to communicate.

The layer every model-level claim of autotaxer is measured on (``bench/layer.py``). Pre-norm, RMSNorm,
rotary positions, grouped-query attention (``heads`` query heads, ``kv_heads`` key/value heads of
``head_dim``), a SwiGLU MLP of width ``ffn``; sharded as Megatron's sequence-parallel TP does: each rank
holds ``s / world_size`` positions of the input ``(s / ws, batch, hidden)``; the fused q/k/v projection
and the MLP's fused gate/up projection are column-parallel (all-gather of the sequence, then the GEMM,
``ag_gemm``), the attention output and the MLP's down projection are row-parallel (the GEMM, then a
reduce-scatter back to the sequence shard, ``gemm_rs``). ``comm`` chooses how:

* ``"autotaxer"``: :class:`autotaxer.nn.ColumnParallelLinear` / :class:`~autotaxer.nn.RowParallelLinear`
  (``autotaxer.dispatch``: the tuned variant, or the fastest BSP form);
* ``"functions"``: autotaxer's torch-signature functions as code written for PyTorch's async TP calls
  them: ``fused_all_gather_matmul(x, [W.t()], 0, group_name, return_A=False)`` and
  ``fused_matmul_reduce_scatter(x, W.t(), "sum", 0, group_name)`` (``autotaxer.dispatch`` underneath);
* ``"plain"``: what users write today, PyTorch's functional collectives and ``F.linear`` (traceable, so
  ``torch.compile`` and its async-TP pass see them);
* ``"none"``: the same GEMMs with the communication removed (a local copy stands for the all-gather, a
  slice for the reduce-scatter): the ceiling, not a correct layer.

The parameters are the same tensors whatever ``comm`` is (:meth:`TPLlamaLayer.set_comm`), so the three
ways can be compared on one set of weights. :class:`LlamaLayer` is the unsharded layer in plain PyTorch,
and :meth:`TPLlamaLayer.from_reference` takes this rank's shards of its weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..integrations._signature import group_world_size, resolve_group
from ..nn import ColumnParallelLinear, RowParallelLinear
from ..runtime._groups import functional_collective

#: The ways a :class:`TPLlamaLayer` communicates.
COMMS = ("autotaxer", "functions", "plain", "none")


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of one decoder layer; the defaults are Llama-3-70B's. ``heads``, ``kv_heads`` and ``ffn`` are
    split over the ranks (:meth:`validate` checks they divide); ``hidden`` and ``head_dim`` stay whole."""

    hidden: int = 8192
    """The model width (the residual stream), whole on every rank."""
    heads: int = 64
    """Query heads, split over the ranks."""
    kv_heads: int = 8
    """Key/value heads (grouped-query attention), split over the ranks."""
    head_dim: int = 128
    """The size of one head (even: rotary positions pair its halves)."""
    ffn: int = 28672
    """The SwiGLU MLP's inner width, split over the ranks."""
    eps: float = 1e-5
    """RMSNorm's epsilon."""
    rope_theta: float = 500000.0
    """The rotary embedding's base."""

    def validate(self, world_size: int = 1) -> None:
        """Raise ``ValueError`` naming the field that cannot be sharded over ``world_size`` ranks."""
        for name in ("hidden", "heads", "kv_heads", "head_dim", "ffn"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads: {self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: rotary positions need an even size, got {self.head_dim}")
        for name in ("heads", "kv_heads", "ffn"):
            if getattr(self, name) % world_size:
                raise ValueError(
                    f"{name}: {getattr(self, name)} is not divisible by the world size {world_size}"
                )


def rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of ``x`` ``(s, batch, heads, head_dim)``, positions ``0 .. s-1``."""
    s, d = x.shape[0], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angle = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)[:, None, None, :]
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, theta: float) -> torch.Tensor:
    """Causal grouped-query attention of ``(s, batch, heads, head_dim)`` tensors; ``(s, batch, heads *
    head_dim)`` out."""
    q, k = rotary(q, theta), rotary(k, theta)
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # (batch, heads, s, head_dim)
    if k.shape[1] != q.shape[1]:  # each key/value head serves heads / kv_heads query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.permute(2, 0, 1, 3).flatten(2)


def layer_problems(cfg: LlamaConfig, world_size: int, seq: int, train: bool) -> list[dict[str, Any]]:
    """The problems a :class:`TPLlamaLayer` step at global sequence length ``seq`` (times the batch)
    dispatches, as shapes-file rows: the forward's two ``ag_gemm`` (q/k/v, gate/up; ``nk``) and two
    ``gemm_rs`` (attention output, down; ``nk``), and with ``train`` their backward's (an ``ag_gemm`` of
    each row-parallel output's gradient, a ``gemm_rs`` of each column-parallel one's; ``kn``)."""
    ws = world_size
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    column = [(q + 2 * kv) // ws, 2 * cfg.ffn // ws]  # N of each column-parallel projection on a rank
    row = [q, cfg.ffn]  # K (contracted, before sharding) of each row-parallel projection
    rows = [dict(op="ag_gemm", M=seq, N=n, K=cfg.hidden, gather_dim=0, b_layout="nk") for n in column]
    rows += [dict(op="gemm_rs", M=seq, N=cfg.hidden, K=k, scatter_dim=0, b_layout="nk") for k in row]
    if train:
        rows += [dict(op="ag_gemm", M=seq, N=k // ws, K=cfg.hidden, gather_dim=0, b_layout="kn") for k in row]
        rows += [
            dict(op="gemm_rs", M=seq, N=cfg.hidden, K=n * ws, scatter_dim=0, b_layout="kn") for n in column
        ]
    return rows


class LlamaLayer(nn.Module):
    """The unsharded layer in plain PyTorch: ``(s, batch, hidden)`` in and out."""

    def __init__(self, cfg: LlamaConfig, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        kw = {"device": device, "dtype": dtype}
        q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.attn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.eps, **kw)
        self.wq = nn.Linear(cfg.hidden, q, bias=False, **kw)
        self.wk = nn.Linear(cfg.hidden, kv, bias=False, **kw)
        self.wv = nn.Linear(cfg.hidden, kv, bias=False, **kw)
        self.wo = nn.Linear(q, cfg.hidden, bias=False, **kw)
        self.mlp_norm = nn.RMSNorm(cfg.hidden, eps=cfg.eps, **kw)
        self.w_gate = nn.Linear(cfg.hidden, cfg.ffn, bias=False, **kw)
        self.w_up = nn.Linear(cfg.hidden, cfg.ffn, bias=False, **kw)
        self.w_down = nn.Linear(cfg.ffn, cfg.hidden, bias=False, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        h = self.attn_norm(x)
        q = self.wq(h).unflatten(-1, (cfg.heads, cfg.head_dim))
        k = self.wk(h).unflatten(-1, (cfg.kv_heads, cfg.head_dim))
        v = self.wv(h).unflatten(-1, (cfg.kv_heads, cfg.head_dim))
        x = x + self.wo(attention(q, k, v, cfg.rope_theta))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class TPLlamaLayer(nn.Module):
    """This rank's shard of the layer: ``(s / ws, batch, hidden)`` in and out; collective over ``group``.

    Its projections are :mod:`autotaxer.nn` layers holding nn.Linear shards (``qkv``: this rank's query,
    key and value heads in one weight; ``gate_up``: its gate and up columns in one weight), so
    ``comm="autotaxer"`` runs one ``ag_gemm`` per column-parallel and one ``gemm_rs`` per row-parallel
    projection, and ``"plain"`` the same GEMMs after ``all_gather_tensor`` / before
    ``reduce_scatter_tensor``. The norms' weights are replicated: sum their gradients over the group
    (:meth:`replicated_parameters`), as sequence-parallel training does.
    """

    def __init__(
        self,
        cfg: LlamaConfig,
        comm: str = "autotaxer",
        group: Any = None,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.group = resolve_group(group)
        ws = self.world_size = group_world_size(self.group)
        cfg.validate(ws)
        self.cfg = cfg
        self.set_comm(comm)
        kw = {"device": device, "dtype": dtype}
        q, kv = cfg.heads * cfg.head_dim // ws, cfg.kv_heads * cfg.head_dim // ws
        self.attn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.eps, **kw)
        self.qkv = ColumnParallelLinear.from_linear(
            nn.Linear(cfg.hidden, q + 2 * kv, bias=False, **kw), self.group
        )
        self.wo = RowParallelLinear.from_linear(nn.Linear(q, cfg.hidden, bias=False, **kw), self.group)
        self.mlp_norm = nn.RMSNorm(cfg.hidden, eps=cfg.eps, **kw)
        ffn = cfg.ffn // ws
        self.gate_up = ColumnParallelLinear.from_linear(
            nn.Linear(cfg.hidden, 2 * ffn, bias=False, **kw), self.group
        )
        self.w_down = RowParallelLinear.from_linear(nn.Linear(ffn, cfg.hidden, bias=False, **kw), self.group)

    def set_comm(self, comm: str) -> TPLlamaLayer:
        """Communicate as ``comm`` (one of :data:`COMMS`) from the next forward on."""
        if comm not in COMMS:
            raise ValueError(f"comm: expected one of {COMMS}, got {comm!r}")
        self.comm = comm
        return self

    @classmethod
    def from_reference(
        cls, ref: LlamaLayer, rank: int, world_size: int, comm: str = "autotaxer", group: Any = None
    ) -> TPLlamaLayer:
        """This rank's shards of ``ref``'s weights (copied), in a layer that communicates as ``comm``."""
        w = ref.wq.weight
        layer = cls(ref.cfg, comm, group, device=w.device, dtype=w.dtype)
        if layer.world_size != world_size:
            raise ValueError(f"world_size: {world_size}, but the group has {layer.world_size} ranks")
        mine = lambda t, dim: t.chunk(world_size, dim)[rank]  # noqa: E731
        with torch.no_grad():
            layer.attn_norm.weight.copy_(ref.attn_norm.weight)
            layer.mlp_norm.weight.copy_(ref.mlp_norm.weight)
            layer.qkv.weight.copy_(torch.cat([mine(lin.weight, 0) for lin in (ref.wq, ref.wk, ref.wv)]))
            layer.wo.weight.copy_(mine(ref.wo.weight, 1))
            layer.gate_up.weight.copy_(torch.cat([mine(ref.w_gate.weight, 0), mine(ref.w_up.weight, 0)]))
            layer.w_down.weight.copy_(mine(ref.w_down.weight, 1))
        return layer

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every rank holds whole (the norms): their gradients are summed over the group."""
        return [self.attn_norm.weight, self.mlp_norm.weight]

    # -- the two kinds of projection, three ways ---------------------------------------------------
    def _column(self, x: torch.Tensor, layer: ColumnParallelLinear) -> torch.Tensor:
        if self.comm == "autotaxer":
            return layer(x)
        if self.comm == "functions":
            from ..functional import fused_all_gather_matmul

            _, (y,) = fused_all_gather_matmul(x, [layer.weight.t()], 0, self._group_name(), return_A=False)
            return y
        if self.comm == "plain":
            return F.linear(functional_collective("all_gather")(x, 0, self._group()), layer.weight)
        return F.linear(x.repeat(self.world_size, *([1] * (x.dim() - 1))), layer.weight)

    def _row(self, x: torch.Tensor, layer: RowParallelLinear) -> torch.Tensor:
        if self.comm == "autotaxer":
            return layer(x)
        if self.comm == "functions":
            from ..functional import fused_matmul_reduce_scatter

            return fused_matmul_reduce_scatter(x, layer.weight.t(), "sum", 0, self._group_name())
        y = F.linear(x, layer.weight)
        if self.comm == "plain":
            return functional_collective("reduce_scatter")(y, "sum", 0, self._group())
        return y[: y.shape[0] // self.world_size]

    def _group(self) -> Any:
        import torch.distributed as dist

        return self.group if self.group is not None else dist.group.WORLD

    def _group_name(self) -> str:
        """The group's name, as code written for PyTorch's async TP passes it."""
        return self._group().group_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, ws = self.cfg, self.world_size
        heads, kv = cfg.heads // ws, cfg.kv_heads // ws
        qkv = self._column(self.attn_norm(x), self.qkv)
        q, k, v = qkv.split([heads * cfg.head_dim, kv * cfg.head_dim, kv * cfg.head_dim], dim=-1)
        q = q.unflatten(-1, (heads, cfg.head_dim))
        k, v = (t.unflatten(-1, (kv, cfg.head_dim)) for t in (k, v))
        x = x + self._row(attention(q, k, v, cfg.rope_theta), self.wo)
        gate, up = self._column(self.mlp_norm(x), self.gate_up).chunk(2, dim=-1)
        return x + self._row(F.silu(gate) * up, self.w_down)
