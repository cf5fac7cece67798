"""flash_decode on CPU: reference math, the op's contract, BSP on gloo, and the Triton kernels in the
interpreter (split-KV partials, combine, the fused push/flag/combine protocol on an emulated 2- or
3-rank heap, and the fused variant's prepare/run on one emulated rank).

The kernels run in the tests' interpreter process (``TRITON_INTERPRET=1``), which runs a launch's programs
one after another, so the fused test launches every rank's producers before the consumers (same kernel,
split grid); one check runs a consumer in a thread to see that it waits for a missing peer.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from autotaxer._problem import ProblemKey, Target
from autotaxer._target import cpu_target
from autotaxer.ops import get_op, relative_error
from autotaxer.ops.flash_decode import global_lengths, shard_lengths
from autotaxer.ops.flash_decode._op import combine_torch, partials_torch
from autotaxer.shapes import load_shapes
from autotaxer.testing import run_ranks, run_world_sizes

_INTERPRETER_SCRIPT = r"""
import sys
import threading

import torch

from autotaxer._problem import ProblemKey
from autotaxer.kernels.flash_decode.partials import DecodeConfig, combine_partials, decode_partials
from autotaxer.kernels.flash_decode.fused import flag_shape, flash_decode_fused, inbox_shapes
from autotaxer.ops import get_op, relative_error
from autotaxer.ops.flash_decode._op import combine_torch, partials_torch

op = get_op("flash_decode")
B, H, HKV, D, S, DT, SPLITS, BN, WS = (int(x) if x.isdigit() else x for x in sys.argv[1:10])
cfg = DecodeConfig(block_n=BN, splits=SPLITS, num_warps=4, num_stages=1)
key = ProblemKey.make("flash_decode", "cpu", WS, DT, {"B": B, "H": H, "Hkv": HKV, "D": D, "S": S})
tol = op.tolerance(key)

# 1. split-KV partials match torch math split by split (uneven rows, empty splits included)
q, k, v, lens = op.make_inputs(key, 1, "cpu", 3, lengths="uneven")
o = torch.full((B, H, SPLITS, D), float("nan"))
lse = torch.full((B, H, SPLITS), float("nan"))
decode_partials(q, k, v, lens, o, lse, config=cfg)
o_ref, lse_ref = partials_torch(q, k, v, lens, SPLITS, block=BN)
assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)), (lse, lse_ref)
assert torch.isinf(lse_ref).any(), "expected at least one empty split"
fin = torch.isfinite(lse_ref)
assert (lse[fin] - lse_ref[fin]).abs().max() < 1e-2, (lse - lse_ref).abs().max()
assert relative_error(o, o_ref) < tol, relative_error(o, o_ref)
assert (o[~fin] == 0).all()
print("partials ok")

# 2. combine of (ws, B, H, splits) partials, some all-empty rows -> 0, others match torch
g = torch.Generator().manual_seed(5)
n_o = B * H * SPLITS * D
flat = torch.randn((WS, n_o + B * H * SPLITS), generator=g)
lse_all = flat[:, n_o:].view(WS, B, H, SPLITS)
lse_all.mul_(4.0)
lse_all[torch.rand(lse_all.shape, generator=g) < 0.3] = float("-inf")
lse_all[:, 0, 0] = float("-inf")  # an (row, head) whose every partial is empty
out = torch.full((B, H, D), float("nan"), dtype=q.dtype)
combine_partials(flat, flat.view(-1)[n_o:], out, world_size=WS, splits=SPLITS, stride_rank=flat.shape[1])
o_all = flat[:, :n_o].view(WS, B, H, SPLITS, D).permute(1, 2, 0, 3, 4).reshape(B, H, WS * SPLITS, D)
want = combine_torch(o_all, lse_all.permute(1, 2, 0, 3).reshape(B, H, WS * SPLITS))
assert (out[0, 0] == 0).all(), out[0, 0]
assert relative_error(out, want) < tol, relative_error(out, want)
print("combine ok")

# 3. BSP composition on emulated ranks equals the reference on uneven rows
seed = 11
outs = []
send = torch.empty((WS, n_o + B * H * SPLITS))
for r in range(WS):
    q, k, v, lens = op.make_inputs(key, r, "cpu", seed, lengths="uneven")
    decode_partials(q, k, v, lens, send[r, :n_o], send[r, n_o:], config=cfg)
out = op.empty_output(key, "cpu")
combine_partials(send, send.view(-1)[n_o:], out, world_size=WS, splits=SPLITS, stride_rank=send.shape[1])
ref = op.reference(key, 0, "cpu", seed, lengths="uneven")
assert relative_error(out, ref) < tol, relative_error(out, ref)
print("bsp composition ok")

# 4. fused: emulated heap per rank (one buffer each, heap_bases = their addresses), producers first
o_shape, lse_shape = inbox_shapes(B, H, D, WS, SPLITS)
f_shape = flag_shape(B, HKV, WS, SPLITS)
numel = lambda s: int(torch.tensor(s).prod())
sizes = [numel(o_shape) * 4, numel(lse_shape) * 4, numel(f_shape) * 8]
heaps = [torch.zeros(sum(sizes) + 1024, dtype=torch.uint8) for _ in range(WS)]
bases = torch.tensor([h.data_ptr() for h in heaps], dtype=torch.int64)


def carve(h):
    # the same offsets in every rank's heap: inbox O, inbox LSE, flags
    a, b, c = sizes[0], sizes[0] + sizes[1], sum(sizes)
    return (h[:a].view(torch.float32).view(o_shape), h[a:b].view(torch.float32).view(lse_shape),
            h[b:c].view(torch.int64).view(f_shape))


bufs = [carve(h) for h in heaps]
tickets = [torch.zeros(1, dtype=torch.int64) for _ in range(WS)]
grid = B * HKV * SPLITS + B * HKV


def launch(r, inputs, out, phase, heap=None):
    q, k, v, lens = inputs
    heap_bufs, heap_bases = heap if heap is not None else (bufs, bases)
    io, il, fl = heap_bufs[r]
    flash_decode_fused(q, k, v, lens, out, inbox_o=io, inbox_lse=il, flags=fl, ticket=tickets[r],
                       heap_bases=heap_bases, rank=r, world_size=WS, config=cfg, phase=phase)


for call in range(1, 5):
    seed = 100 + call
    mode = "uneven" if call % 2 else "full"
    inputs = [op.make_inputs(key, r, "cpu", seed, lengths=mode) for r in range(WS)]
    outs = [op.empty_output(key, "cpu") for _ in range(WS)]
    if call == 3 and WS > 1:
        # rank 0's consumers must wait while a peer's partials of this call are missing, even though
        # that peer's slot still holds flags of call 1 (same parity)
        launch(0, inputs[0], outs[0], "produce")
        # The interpreter is not thread-safe (it patches triton.language while a kernel runs), so only
        # the consumer thread interprets while it spins: the peers produce beforehand into a shadow copy
        # of every heap, and their pushes reach the real heaps later as plain copies, data before flags.
        shadow = [h.clone() for h in heaps]
        shadow_heap = ([carve(h) for h in shadow], torch.tensor([h.data_ptr() for h in shadow]))
        for r in range(1, WS):
            launch(r, inputs[r], outs[r], "produce", heap=shadow_heap)
        done = threading.Event()

        def consumer():
            launch(0, inputs[0], outs[0], "consume")
            done.set()

        t = threading.Thread(target=consumer, daemon=True)
        t.start()
        t.join(timeout=3.0)
        assert not done.is_set(), "consumer finished before the peer pushed its partials"
        flags_at = sizes[0] + sizes[1]
        for r in range(WS):  # the peers' pushes arrive: partials first, then the flags that publish them
            heaps[r][:flags_at].copy_(shadow[r][:flags_at])
        for r in range(WS):
            heaps[r][flags_at:].copy_(shadow[r][flags_at:])
        t.join(timeout=120.0)
        assert done.is_set(), "consumer did not finish after every peer pushed"
        for r in range(1, WS):
            launch(r, inputs[r], outs[r], "consume")
    else:
        for r in range(WS):
            launch(r, inputs[r], outs[r], "produce")
        for r in range(WS):
            launch(r, inputs[r], outs[r], "consume")
    ref = op.reference(key, 0, "cpu", seed, lengths=mode)
    for r in range(WS):
        err = relative_error(outs[r], ref)
        assert err < tol, (call, r, err)
        assert tickets[r].item() == call * grid, (tickets[r], call * grid)
        slot = call % 2
        assert (bufs[r][2][slot] == call).all(), bufs[r][2][slot]
        assert (bufs[r][2][1 - slot] == (call - 1 if call > 1 else 0)).all()
print("fused ok")

# 5. the fused variant end to end (prepare + several runs, one launch each) on one emulated rank
from autotaxer._target import cpu_target
from autotaxer.ops import RunContext


class _Heap:
    # stands in for the Iris context: one CPU buffer, bump allocation, heap_bases = its address
    def __init__(self):
        self.buf = torch.zeros(1 << 22, dtype=torch.uint8)
        self.top = 0

    def zeros(self, *shape, dtype):
        n = int(torch.tensor(shape).prod()) * torch.empty((), dtype=dtype).element_size()
        t = self.buf[self.top:self.top + n].view(dtype).view(shape)
        self.top += (n + 255) // 256 * 256
        return t

    def get_heap_bases(self):
        return torch.tensor([self.buf.data_ptr()], dtype=torch.int64)

    def get_rank(self):
        return 0

    def get_num_ranks(self):
        return 1


key1 = ProblemKey.make("flash_decode", "cpu", 1, DT, {"B": B, "H": H, "Hkv": HKV, "D": D, "S": S // WS})
ctx1 = RunContext(rank=0, world_size=1, device=torch.device("cpu"), target=cpu_target(), _iris=_Heap())
fused = op.variants["fused"]
params = {"block_n": BN, "splits": SPLITS, "num_warps": 4, "num_stages": 1}
wsp = fused.prepare(key1, params, ctx1)
for call in range(3):
    mode = "uneven" if call != 1 else "full"
    inputs = op.make_inputs(key1, 0, "cpu", 200 + call, lengths=mode)
    out = op.empty_output(key1, "cpu")
    got = fused.run(wsp, inputs if call != 1 else inputs[:3], ctx1, out=out)
    assert got is out
    err = relative_error(out, op.reference(key1, 0, "cpu", 200 + call, lengths=mode))
    assert err < tol, (call, err)
print("fused variant ok")
"""


def _key(ws: int = 2, dtype: str = "fp32", b: int = 3, h: int = 8, hkv: int = 2, d: int = 64, s: int = 256):
    return ProblemKey.make("flash_decode", "cpu", ws, dtype, {"B": b, "H": h, "Hkv": hkv, "D": d, "S": s})


_H200 = Target("nvidia-h200", "sm_90", 132, "cuda")
_ISSUE_SHAPES = Path(__file__).resolve().parents[2] / "examples" / "shapes_flash_decode.csv"


def _h200_key(b: int, s: int) -> ProblemKey:
    shape = {"B": b, "H": 32, "Hkv": 8, "D": 128, "S": s}
    return ProblemKey.make("flash_decode", _H200.gpu_model, 2, "bf16", shape)


def _issue_keys() -> list[ProblemKey]:
    return [row.to_key(_H200.gpu_model, 2) for row in load_shapes(_ISSUE_SHAPES, 2)]


def _naive_attention(q, k, v):
    """Per-head softmax attention with repeat-interleaved KV heads (a path independent of the op's)."""
    group = q.shape[0] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1).transpose(0, 1)  # (H, n, D)
    vv = v.repeat_interleave(group, dim=1).transpose(0, 1)
    w = torch.softmax((kk @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(q.shape[-1]), dim=-1)
    return (w.unsqueeze(-1) * vv).sum(1)


def test_reference_is_attention_over_the_gathered_valid_prefix() -> None:
    op = get_op("flash_decode")
    key = _key(ws=2)
    ins = [op.make_inputs(key, r, "cpu", 4, lengths="uneven") for r in range(2)]
    lens = global_lengths(key, 4, "uneven")
    ref = op.reference(key, 1, "cpu", 4, lengths="uneven")
    assert ref.shape == (3, 8, 64) and ref.dtype == torch.float32
    for b in range(3):
        n = int(lens[b])
        k = torch.cat([i[1][b] for i in ins])[:n]
        v = torch.cat([i[2][b] for i in ins])[:n]
        want = _naive_attention(ins[0][0][b].double(), k.double(), v.double())
        assert torch.allclose(ref[b].double(), want, atol=1e-5), b


def test_inputs_shard_the_sequence_and_lengths() -> None:
    op = get_op("flash_decode")
    key = _key(ws=2, b=4, s=256)
    lens = global_lengths(key, 9, "uneven")
    assert lens[0] == 256 and 1 <= lens[1] <= 128 and ((lens >= 1) & (lens <= 256)).all()
    for r in range(2):
        q, k, v, local = op.make_inputs(key, r, "cpu", 9, lengths="uneven")
        assert q.shape == (4, 8, 64) and k.shape == v.shape == (4, 128, 2, 64)
        assert local.dtype == torch.int32
        assert torch.equal(local, shard_lengths(lens, r, 2, 128))
    assert shard_lengths(torch.tensor([0, 100, 128, 200, 256]), 1, 2, 128).tolist() == [0, 0, 0, 72, 128]
    full = op.make_inputs(key, 1, "cpu", 9)[3]
    assert full.tolist() == [128] * 4
    q0, k0 = op.make_inputs(key, 0, "cpu", 9)[:2]
    q1, k1 = op.make_inputs(key, 1, "cpu", 9)[:2]
    assert torch.equal(q0, q1) and not torch.equal(k0, k1)  # q replicated, KV sharded
    assert not torch.equal(k0, op.make_inputs(key, 0, "cpu", 10)[1])  # fresh seed, fresh inputs
    assert torch.isnan(op.empty_output(key, "cpu")).all()


def test_partials_and_combine_reproduce_the_reference() -> None:
    op = get_op("flash_decode")
    key = _key(ws=2)
    ref = op.reference(key, 0, "cpu", 5, lengths="uneven")
    for splits, block in ((1, 1), (3, 16), (8, 32)):
        parts = [
            partials_torch(*op.make_inputs(key, r, "cpu", 5, lengths="uneven"), splits, block)
            for r in range(2)
        ]
        out = combine_torch(torch.cat([p[0] for p in parts], 2), torch.cat([p[1] for p in parts], 2))
        assert relative_error(out, ref) < 1e-5, (splits, block)
    empty = combine_torch(torch.randn(2, 4, 8), torch.full((2, 4), -math.inf))
    assert (empty == 0).all()


@pytest.mark.parametrize(
    "shape, field",
    [
        ({"B": 1, "H": 30, "Hkv": 8, "D": 64, "S": 64}, "H"),
        ({"B": 1, "H": 32, "Hkv": 8, "D": 96, "S": 64}, "D"),
        ({"B": 1, "H": 32, "Hkv": 8, "D": 64, "S": 63}, "S"),
        ({"B": 0, "H": 32, "Hkv": 8, "D": 64, "S": 64}, "B"),
    ],
)
def test_validate_names_the_field(shape: dict, field: str) -> None:
    key = ProblemKey.make("flash_decode", "cpu", 2, "bf16", shape)
    with pytest.raises(ValueError, match=f"^{field}:"):
        get_op("flash_decode").validate(key)


def test_key_from_inputs() -> None:
    op = get_op("flash_decode")
    key = _key(ws=2, dtype="fp16")
    q, k, v, lens = op.make_inputs(key, 0, "cpu", 1)
    got = op.key_from_inputs((q, k, v, lens), {}, 2, "cpu")
    assert got == key and op.key_from_inputs((q, k, v), {}, 2, "cpu") == key
    with pytest.raises(ValueError, match="^lengths:"):
        op.key_from_inputs((q, k, v, lens.long()), {}, 2, "cpu")
    with pytest.raises(ValueError, match="^dtype:"):
        op.key_from_inputs((q.float(), k, v), {}, 2, "cpu")
    with pytest.raises(ValueError, match="flash_decode"):
        op.key_from_inputs((q, k), {}, 2, "cpu")


def test_search_spaces_and_pruning() -> None:
    from autotaxer.ops import iter_grid

    op = get_op("flash_decode")
    gpu = _h200_key(1, 8192)
    cuda = cpu_target().__class__("nvidia-h200", "sm_90", 132, "cuda")
    for name in ("bsp", "fused"):
        var = op.variants[name]
        space = var.search_space(gpu, cuda)
        assert set(space) == {"block_n", "splits", "num_warps", "num_stages"}
        assert var.check(gpu, cuda, var.default_params(gpu, cuda)) is None
        valid = [p for p in iter_grid(space) if var.check(gpu, cuda, p) is None]
        assert 0 < len(valid) < len(list(iter_grid(space)))
    bsp = op.variants["bsp"]
    base = {"block_n": 64, "splits": 16, "num_warps": 4, "num_stages": 2}
    tiny = _h200_key(1, 256)
    assert "splits" in bsp.check(tiny, cuda, base)  # 16 splits of 64 > 2 blocks of a 128-position shard
    fp32 = ProblemKey.make(
        "flash_decode", "nvidia-h200", 2, "fp32", {"B": 1, "H": 32, "Hkv": 8, "D": 128, "S": 8192}
    )
    assert "shared memory" in bsp.check(fp32, cuda, dict(base, block_n=128, num_stages=3))
    assert "missing" in bsp.check(gpu, cuda, {"splits": 2})
    assert op.variants["fused"].unavailable_reason(cpu_target()) is not None
    assert bsp.search_space(gpu, cpu_target()) == {"splits": (1, 2, 4)}


def test_issue_shapes_file_lists_the_twelve_shapes() -> None:
    keys = _issue_keys()
    got = {(k["B"], k["S"]) for k in keys}
    assert got == {(b, s) for b in (1, 8, 32) for s in (8192, 32768, 131072, 524288)} and len(keys) == 12
    assert {(k.op, k.dtype, k["H"], k["Hkv"], k["D"]) for k in keys} == {("flash_decode", "bf16", 32, 8, 128)}


def test_seeds_are_valid_points_of_the_space_and_the_default_is_the_first() -> None:
    op = get_op("flash_decode")
    for key in _issue_keys():
        for name in ("bsp", "fused"):
            var = op.variants[name]
            space = var.search_space(key, _H200)
            seeds = var.seed_configs(key, _H200)
            assert 3 <= len(seeds) <= 5, (key.text, seeds)
            assert len({tuple(sorted(p.items())) for p in seeds}) == len(seeds)
            for params in seeds:
                assert set(params) == set(space) and all(params[f] in space[f] for f in space), params
                assert var.check(key, _H200, params) is None, (key.text, params)
            assert var.default_params(key, _H200) == seeds[0]
    # a shard too short for the heuristic: seeds shrink to what fits, the default stays valid
    tiny = _h200_key(1, 256)
    bsp = op.variants["bsp"]
    assert [p["splits"] for p in bsp.seed_configs(tiny, _H200)] == [1, 2, 1]  # last: one more stage
    assert bsp.check(tiny, _H200, bsp.default_params(tiny, _H200)) is None
    # CPU: no seeds, the first point of the CPU space (what the CPU tuner and dispatch use)
    assert bsp.seed_configs(tiny, cpu_target()) == []
    assert bsp.default_params(_key(), cpu_target()) == {"splits": 1}


@pytest.mark.parametrize(
    ("b", "s", "first", "also"),
    [
        (1, 8192, 8, (16, 4)),  # short shard: at least 512 positions per split
        (1, 32768, 32, (64, 16)),
        (1, 524288, 64, (32,)),  # 64 is the most the space offers
        (32, 131072, 8, (16, 4)),  # 256 (row, KV head) programs already fill the SMs
        (32, 524288, 8, (16, 4, 32)),  # very long splits: 4x more is seeded too
    ],
)
def test_heuristic_split_counts(b: int, s: int, first: int, also: tuple[int, ...]) -> None:
    key = _h200_key(b, s)
    seeds = get_op("flash_decode").variants["fused"].seed_configs(key, _H200)
    assert seeds[0] == {"block_n": 64, "num_warps": 4, "num_stages": 2, "splits": first}
    assert [p["splits"] for p in seeds[1 : 1 + len(also)]] == list(also)


def test_dispatch_lookup_uses_the_tuned_winner_and_falls_back_to_bsp_otherwise() -> None:
    """What dispatch runs: the stored winner (the tuner's best over every trial, BSP's included, so never
    slower than the BSP it measured); for an untuned context length, BSP at its default (the tuner's
    baseline point); for an untuned batch within 2x of a tuned one, that shape's winner."""
    from autotaxer.records import WinnerRecord
    from autotaxer.runtime.lookup import EXACT, FALLBACK, NEAREST, decide

    op = get_op("flash_decode")
    tuned = _h200_key(8, 8192)
    params = {"block_n": 64, "splits": 16, "num_warps": 4, "num_stages": 2}
    rec = WinnerRecord(key=tuned, variant="fused", params=params, median_us=50.0, bsp_us=60.0, trials=10)
    table = {tuned: rec}
    exact = decide(table, tuned, op, _H200)
    assert (exact.source, exact.variant, dict(exact.params)) == (EXACT, "fused", params)
    other_s = _h200_key(8, 16384)
    miss = decide(table, other_s, op, _H200)
    assert (miss.source, miss.variant) == (FALLBACK, "bsp")
    assert dict(miss.params) == op.variants["bsp"].default_params(other_s, _H200)
    near = decide(table, _h200_key(16, 8192), op, _H200)
    assert (near.source, near.variant) == (NEAREST, "fused")
    far = decide(table, _h200_key(32, 8192), op, _H200)
    assert (far.source, far.variant) == (FALLBACK, "bsp")


def _check_bsp_gloo(ctx, dtype: str, seeds: tuple[int, ...], splits: int) -> list[float]:
    op = get_op("flash_decode")
    key = ProblemKey.make(
        "flash_decode",
        ctx.target.gpu_model,
        ctx.world_size,
        dtype,
        {"B": 3, "H": 8, "Hkv": 2, "D": 64, "S": 96},
    )
    var = op.variants["bsp"]
    ws = var.prepare(key, {"splits": splits}, ctx)
    errs = []
    for seed in seeds:  # consecutive calls on one workspace, fresh inputs and a poisoned output each time
        mode = "uneven" if seed % 2 else "full"
        inputs = op.make_inputs(key, ctx.rank, ctx.device, seed, lengths=mode)
        out = op.empty_output(key, ctx.device)
        got = var.run(ws, inputs if mode == "uneven" else inputs[:3], ctx, out=out)
        assert got is out
        errs.append(relative_error(out, op.reference(key, ctx.rank, ctx.device, seed, lengths=mode)))
    return errs


def _check_bsp_gloo_both(ctx) -> dict[str, list[float]]:
    """fp32 over three calls; bf16 (at 2 ranks) over one, with 4 splits."""
    errs = {"fp32": _check_bsp_gloo(ctx, "fp32", (1, 2, 3), 2)}
    if ctx.world_size == 2:
        errs["bf16"] = _check_bsp_gloo(ctx, "bf16", (7,), 4)
    return errs


@pytest.fixture(scope="module")
def bsp_gloo_errors() -> dict[int, list[dict[str, list[float]]]]:
    """``{world size: per rank {dtype: errors}}`` at 2, 3 and 4 ranks, from one spawned group."""
    return run_world_sizes(_check_bsp_gloo_both, (2, 3, 4))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_bsp_on_gloo_matches_reference_on_every_rank(world_size: int, bsp_gloo_errors) -> None:
    errs = [e["fp32"] for e in bsp_gloo_errors[world_size]]
    assert len(errs) == world_size and all(len(rank_errs) == 3 for rank_errs in errs)
    assert all(e < 1e-5 for rank_errs in errs for e in rank_errs), errs


def test_bsp_on_gloo_bf16(bsp_gloo_errors) -> None:
    errs = [e["bf16"] for e in bsp_gloo_errors[2]]
    assert len(errs) == 2 and all(e < 1e-2 for rank_errs in errs for e in rank_errs), errs


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ("3", "8", "2", "64", "256", "fp32", "3", "16", "2"),  # B H Hkv D S dtype splits block_n world_size
        ("2", "4", "4", "128", "192", "fp16", "2", "32", "3"),
        ("2", "4", "2", "64", "512", "fp32", "4", "16", "8"),  # issue 6's largest world size
    ],
    ids=["fp32-gqa4-ws2", "fp16-mha-ws3", "fp32-gqa4-ws8"],
)
def test_kernels_in_the_interpreter(args: tuple[str, ...], interpreter_worker) -> None:
    out = interpreter_worker.run(_INTERPRETER_SCRIPT, argv=args, timeout=600)
    for stage in ("partials ok", "combine ok", "bsp composition ok", "fused ok", "fused variant ok"):
        assert stage in out, out


def _check_dispatch_gloo(ctx, seeds: tuple[int, ...]) -> list[tuple[str, float]]:
    from autotaxer.runtime.dispatch import RuntimeConfig, init, shutdown

    op = get_op("flash_decode")
    key = _key(ws=ctx.world_size, s=128)
    rt = init(RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    try:
        results = []
        for seed in seeds:
            inputs = op.make_inputs(key, ctx.rank, ctx.device, seed, lengths="uneven")
            out = rt.dispatch("flash_decode", *inputs)
            err = relative_error(out, op.reference(key, ctx.rank, ctx.device, seed, lengths="uneven"))
            (decision,) = rt.decisions().values()
            results.append((decision.variant, err))
        return results
    finally:
        shutdown()


def test_dispatch_on_gloo_falls_back_to_bsp_and_matches_reference() -> None:
    per_rank = run_ranks(_check_dispatch_gloo, 2, "cpu", args=((3, 4),))
    rows = [row for rank_rows in per_rank for row in rank_rows]
    assert len(rows) == 4
    assert all(variant == "bsp" and err < 1e-5 for variant, err in rows), rows
