"""A two-layer sequence-parallel transformer block trained for a few steps through autotaxer.

Run under torchrun (CPU/gloo, or one GPU per rank with NCCL):

    torchrun --nproc-per-node 2 examples/tp_block.py --steps 5                 # CPU: BSP underneath
    torchrun --nproc-per-node 2 examples/tp_block.py --device cuda --seq 4096 --hidden 8192 --dtype bf16

Each rank holds 1/world_size of the sequence. Per layer: LayerNorm, the attention input projections
(q, k, v: three weights, one all-gather, ``autotaxer.fused_all_gather_matmul``), attention over the
rank's heads, the output projection (``autotaxer.nn.RowParallelLinear``: GEMM + reduce-scatter back to
the sequence shard), LayerNorm and an MLP: up-projection ``autotaxer.nn.ColumnParallelLinear``,
down-projection ``RowParallelLinear``. Everything else is plain PyTorch.

``--check`` (default on for fp32) also trains the unsharded model in plain PyTorch on rank 0's copy of
the full data and prints both loss curves; the run fails if they differ by more than 1e-3.
``--plain`` runs the same sharded block with all-gather + F.linear instead of autotaxer (the speed
comparison). The last line prints the time per step.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import autotaxer
import autotaxer.nn


# -- plain-PyTorch collectives with autograd (sequence dim 0) ------------------------------------------
def _gather_rows(x: torch.Tensor) -> torch.Tensor:
    ws = dist.get_world_size()
    out = x.new_empty((ws * x.shape[0], *x.shape[1:]))
    if x.is_cuda:
        dist.all_gather_into_tensor(out, x.contiguous())
    else:
        dist.all_gather(list(out.chunk(ws)), x.contiguous())
    return out


def _scatter_rows(x: torch.Tensor) -> torch.Tensor:
    ws = dist.get_world_size()
    if x.is_cuda:
        out = x.new_empty((x.shape[0] // ws, *x.shape[1:]))
        dist.reduce_scatter_tensor(out, x.contiguous())
        return out
    summed = x.contiguous().clone()
    dist.all_reduce(summed)  # gloo has no reduce-scatter
    return summed.chunk(ws)[dist.get_rank()].clone()


class _Collective(torch.autograd.Function):
    """``forward(x)``, whose gradient is ``backward(grad)``: all-gather and reduce-scatter are each
    other's adjoint."""

    @staticmethod
    def forward(ctx, x, forward, backward):
        ctx.backward_fn = backward
        return forward(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward_fn(grad), None, None


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """All-gather along dim 0; backward reduce-scatters."""
    return _Collective.apply(x, _gather_rows, _scatter_rows)


def scatter_rows(x: torch.Tensor) -> torch.Tensor:
    """Reduce-scatter along dim 0 (a row-parallel layer's output); backward all-gathers."""
    return _Collective.apply(x, _scatter_rows, _gather_rows)


# -- the model --------------------------------------------------------------------------------------
class Layer(nn.Module):
    """One pre-norm transformer layer, sharded over ``ws`` ranks (this rank's shards of ``reference``)."""

    def __init__(self, hidden: int, heads: int, ffn: int, ws: int, rank: int, reference: nn.Module | None,
                 plain: bool) -> None:  # fmt: skip
        super().__init__()
        self.heads, self.ws, self.plain = heads // ws, ws, plain
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        hs = hidden // ws
        self.qkv = nn.ModuleList(nn.Linear(hidden, hs, bias=False) for _ in range(3))
        self.proj = autotaxer.nn.RowParallelLinear(hidden, hidden, bias=False)
        self.up = autotaxer.nn.ColumnParallelLinear(hidden, ffn, bias=True)
        self.down = autotaxer.nn.RowParallelLinear(ffn, hidden, bias=False)
        if reference is not None:  # this rank's shards of the reference's weights
            with torch.no_grad():
                for mine, full in ((self.ln1, reference.ln1), (self.ln2, reference.ln2)):
                    mine.load_state_dict(full.state_dict())
                for mine, full in zip(self.qkv, reference.qkv, strict=True):
                    mine.weight.copy_(full.weight.chunk(ws, 0)[rank])
                self.proj.weight.copy_(reference.proj.weight.chunk(ws, 1)[rank])
                self.up.weight.copy_(reference.up.weight.chunk(ws, 0)[rank])
                self.up.bias.copy_(reference.up.bias.chunk(ws, 0)[rank])
                self.down.weight.copy_(reference.down.weight.chunk(ws, 1)[rank])

    def _column(self, x: torch.Tensor, weights: list[torch.Tensor]) -> list[torch.Tensor]:
        rows = x.reshape(-1, x.shape[-1])
        if self.plain:
            gathered = gather_rows(rows)
            outs = [F.linear(gathered, w) for w in weights]
        else:
            _, outs = autotaxer.fused_all_gather_matmul(rows, [w.t() for w in weights], 0)
        return [o.view(x.shape[0] * self.ws, *x.shape[1:-1], o.shape[-1]) for o in outs]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (s / ws, batch, hidden)
        q, k, v = self._column(self.ln1(x), [lin.weight for lin in self.qkv])
        s, b, hs = q.shape
        heads = [t.view(s, b, self.heads, hs // self.heads).permute(1, 2, 0, 3) for t in (q, k, v)]
        attn = F.scaled_dot_product_attention(*heads, is_causal=True)
        attn = attn.permute(2, 0, 1, 3).reshape(s, b, hs)
        x = x + self._row(attn, self.proj)
        if self.plain:
            h = self._column(self.ln2(x), [self.up.weight])[0] + self.up.bias
        else:
            h = self.up(self.ln2(x))
        return x + self._row(F.gelu(h), self.down)

    def _row(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        if self.plain:
            return scatter_rows(F.linear(x, layer.weight))
        return layer(x)


class ReferenceLayer(nn.Module):
    """The unsharded layer in plain PyTorch (the same parameters' names and shapes at world size 1)."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(3))
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        s, b, h = x.shape
        q, k, v = (lin(y).view(s, b, self.heads, h // self.heads).permute(1, 2, 0, 3) for lin in self.qkv)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(2, 0, 1, 3).reshape(s, b, h)
        x = x + self.proj(attn)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def _replicated(model: nn.Module) -> list[nn.Parameter]:
    """Parameters every rank holds whole (LayerNorms): their gradients are summed over the sequence
    shards, as sequence-parallel training does."""
    return [p for name, p in model.named_parameters() if ".ln" in f".{name}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq", type=int, default=64, help="global sequence length")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=0, help="MLP width (default 4 x hidden)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compare with the unsharded model in plain PyTorch (default: on for fp32)",
    )
    ap.add_argument("--plain", action="store_true", help="all-gather + F.linear instead of autotaxer")
    args = ap.parse_args(argv)
    check = args.dtype == "fp32" if args.check is None else args.check
    ffn = args.ffn or 4 * args.hidden

    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if local_rank >= visible:
            hint = "without GPUs, leave --device out: the block runs on CPU/gloo"
            need = f"rank {local_rank} needs GPU {local_rank}, {visible} visible"
            print(f"error: --device cuda: {need} ({hint})", file=sys.stderr)
            return 2
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    ws, rank = dist.get_world_size(), dist.get_rank()
    for name, n in (("seq", args.seq), ("hidden", args.hidden), ("heads", args.heads), ("ffn", ffn)):
        if n % ws:
            print(f"error: --{name} {n} is not divisible by the world size {ws}", file=sys.stderr)
            return 2
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16

    torch.manual_seed(0)  # the same reference weights and data on every rank
    reference = nn.Sequential(*(ReferenceLayer(args.hidden, args.heads, ffn) for _ in range(2)))
    model = nn.Sequential(
        *(Layer(args.hidden, args.heads, ffn, ws, rank, ref, args.plain) for ref in reference)
    )
    reference.to(device, dtype)
    model.to(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=args.lr)
    data = [torch.randn(args.seq, args.batch, args.hidden, device=device, dtype=dtype) for _ in range(2)]
    target = [torch.randn_like(d) for d in data]
    count = data[0].numel()

    losses, ref_losses, times = [], [], []
    for step in range(args.steps):
        x, y = data[step % 2], target[step % 2]
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model(x.chunk(ws)[rank])
        local = (out.float() - y.chunk(ws)[rank].float()).square().sum() / count  # this rank's share
        opt.zero_grad()
        local.backward()
        for p in _replicated(model):
            dist.all_reduce(p.grad)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        total = local.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
        if check:
            ref_loss = (reference(x).float() - y.float()).square().sum() / count
            ref_opt.zero_grad()
            ref_loss.backward()
            ref_opt.step()
            ref_losses.append(ref_loss.item())

    worst = max((abs(a - b) for a, b in zip(losses, ref_losses, strict=False)), default=0.0)
    per_step = sorted(times[1:] or times)[len(times[1:] or times) // 2] * 1e3
    if rank == 0:
        print("loss:          " + " ".join(f"{v:.6f}" for v in losses))
        if check:
            print("plain PyTorch: " + " ".join(f"{v:.6f}" for v in ref_losses))
            print(f"largest difference {worst:.2e} (limit 1e-3)")
        what = "all-gather + F.linear" if args.plain else "autotaxer"
        print(f"{what}: {per_step:.3f} ms per step (median after the first), world size {ws}")
    dist.destroy_process_group()
    return 1 if check and not (worst <= 1e-3 and all(map(math.isfinite, losses))) else 0


if __name__ == "__main__":
    raise SystemExit(main())
