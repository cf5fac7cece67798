"""``torch_fused`` (PyTorch's own fused all-gather-matmul and matmul-reduce-scatter) on GPUs, for both
ops: right against fp32 in every layout with two results kept, the gathered A it hands to autograd equal
to the gathered shards, and unavailable, with the reason, once NCCL's symmetric-memory backend is chosen."""

from __future__ import annotations

from _factories import kept_errors, kept_results, layout_keys, on_gpus

from autotaxer.testing import run_ranks

CASES = [
    ("ag_gemm", {"M": 512, "N": 640, "K": 512}, "gather_dim"),
    ("gemm_rs", {"M": 512, "N": 768, "K": 1024}, "scatter_dim"),
]


def _check(ctx) -> dict:
    import torch

    from autotaxer.ops import _symm_backend, get_op, relative_error

    found = {}
    for op_name, shape, dim_field in CASES:
        op = get_op(op_name)
        variant = op.variants["torch_fused"]
        assert variant.unavailable_reason(ctx.target) is None
        for dim, layout, key in layout_keys(ctx, op_name, shape, dim_field):
            ws = variant.prepare(key, {}, ctx)
            results = kept_results(op, variant, ws, key, ctx)
            inputs = op.make_inputs(key, ctx.rank, ctx.device, 3)
            c, saved = variant.run_for_backward(ws, inputs, ctx)
            errs, distinct = kept_errors(op, key, ctx, results)  # after the third call: both still right
            errs.append(relative_error(c, op.reference(key, ctx.rank, ctx.device, 3)))
            if op_name == "ag_gemm":  # the gathered A: every rank's shard in place
                shards = [op.make_inputs(key, r, ctx.device, 3)[0] for r in range(ctx.world_size)]
                errs.append(relative_error(saved, torch.cat(shards, dim=dim)))
            found[(op_name, dim, layout)] = (max(errs), distinct)
    _symm_backend.select("nccl")
    found["nccl"] = get_op("ag_gemm").variants["torch_fused"].unavailable_reason(ctx.target)
    return found


def _assert(results: list[dict]) -> None:
    for per_rank in results:
        assert "AUTOTAXER_SYMM_MEM=nccl" in per_rank.pop("nccl")
        for case, (err, distinct) in per_rank.items():
            assert err < 1e-2, (case, err)
            assert distinct == 2, case


@on_gpus(1, 2)
def test_torch_fused_on_gpus(world_size: int) -> None:
    _assert(run_ranks(_check, world_size, "cuda", timeout=300))


def _graph_then_growth(ctx) -> dict:
    """A call of a small ``ag_gemm`` key captured in a CUDA graph, then a larger ``gemm_rs`` key prepared and
    run (torch's workspace grows past the one the graph addresses), then the graph replayed on new inputs."""
    import weakref

    import torch
    import torch.distributed._symmetric_memory as symm_mem

    from autotaxer._problem import ProblemKey
    from autotaxer.ops import _torch_symm, get_op, relative_error

    gpu, ws_n = ctx.target.gpu_model, ctx.world_size
    small = ProblemKey.make(
        "ag_gemm", gpu, ws_n, "bf16", {"M": 256, "N": 512, "K": 512}, {"gather_dim": 0, "b_layout": "nk"}
    )
    large = ProblemKey.make(
        "gemm_rs", gpu, ws_n, "bf16", {"M": 2048, "N": 4096, "K": 512}, {"scatter_dim": 0, "b_layout": "nk"}
    )
    ag, rs = get_op("ag_gemm"), get_op("gemm_rs")
    ag_v, rs_v = ag.variants["torch_fused"], rs.variants["torch_fused"]
    ws = ag_v.prepare(small, {}, ctx)
    static = [t.clone() for t in ag.make_inputs(small, ctx.rank, ctx.device, 1)]
    ag_v.run(ws, tuple(static), ctx)  # torch's side streams and the workspace exist before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ag_v.run(ws, tuple(static), ctx)
    before = symm_mem._group_name_to_workspace_tensor[ws.buffers["group_name"]]
    before_n, before = before.numel(), weakref.ref(before)  # no reference of the test's own keeps it alive
    big = rs_v.prepare(large, {}, ctx)
    big_out = rs_v.run(big, rs.make_inputs(large, ctx.rank, ctx.device, 2), ctx)
    after = symm_mem._group_name_to_workspace_tensor[ws.buffers["group_name"]]
    for t, fresh in zip(static, ag.make_inputs(small, ctx.rank, ctx.device, 3), strict=True):
        t.copy_(fresh)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return {
        "grew": after.numel() > before_n and after.numel() >= _torch_symm.workspace_bytes(large),
        "kept": before() is not None and any(t is before() for t in _torch_symm.RETIRED_WORKSPACES),
        "replay_err": relative_error(out, ag.reference(small, ctx.rank, ctx.device, 3)),
        "large_err": relative_error(big_out, rs.reference(large, ctx.rank, ctx.device, 2)),
    }


@on_gpus(2)
def test_a_graph_captured_before_torchs_workspace_grows_replays_right_after(world_size: int) -> None:
    for per_rank in run_ranks(_graph_then_growth, world_size, "cuda", timeout=300):
        assert per_rank["grew"] and per_rank["kept"], per_rank
        assert per_rank["replay_err"] < 1e-2, per_rank
        assert per_rank["large_err"] < 1e-2, per_rank


def _replayed_calls(ctx) -> dict:
    """``torch_fused`` as a replayed run (what dispatch and the tuner launch for a variant its op lists in
    ``replayed``): the first call eager, then one CUDA graph per argument set (four sets of inputs, one
    ``out``), each graph's product from the run's one pool."""
    import torch

    from autotaxer._problem import ProblemKey
    from autotaxer.ops import get_op, relative_error
    from autotaxer.runtime import replay

    gpu, ws_n = ctx.target.gpu_model, ctx.world_size
    found = {}
    for op_name, dim in (("ag_gemm", "gather_dim"), ("gemm_rs", "scatter_dim")):
        shape = {"M": 1024, "N": 2048, "K": 1024}
        key = ProblemKey.make(op_name, gpu, ws_n, "bf16", shape, {dim: 0, "b_layout": "nk"})
        op = get_op(op_name)
        variant = op.variants["torch_fused"]
        spec = op.empty_output(key, "meta")
        run = replay.ReplayedRun(variant.run, tuple(spec.shape), spec.dtype, name="torch_fused")
        ws = variant.prepare(key, {}, ctx)
        inputs = [op.make_inputs(key, ctx.rank, ctx.device, s) for s in range(5)]
        # the references first: what they allocate (eagerly, cached after) is not the captures' growth
        refs = [op.reference(key, ctx.rank, ctx.device, s) for s in range(5)]
        run(ws, inputs[0], ctx)  # eager
        out = op.empty_output(key, ctx.device)
        errs, grew = [], 0
        for s in range(1, 5):
            out.fill_(float("nan"))
            torch.cuda.synchronize()
            before = torch.cuda.memory_reserved()
            got = run(ws, inputs[s], ctx, out)
            torch.cuda.synchronize()
            if s > 1:  # what the first capture left in the run's pool serves the later ones
                grew += torch.cuda.memory_reserved() - before
            errs.append(relative_error(got, refs[s]))
        again = run(ws, inputs[1], ctx, out)  # the first set's graph, replayed on its inputs
        errs.append(relative_error(again, refs[1]))
        product = 1024 // ws_n * 2048 * 2 if op_name == "gemm_rs" else 1024 * 2048 * 2
        found[op_name] = {
            "replayed": isinstance(run, replay.ReplayedRun), "stats": getattr(run, "stats", dict)(),
            "err": max(errs), "grew": grew, "product": product,
        }  # fmt: skip
    return found


@on_gpus(2)
def test_torch_fused_calls_are_graph_replays_sharing_one_pool(world_size: int) -> None:
    for per_rank in run_ranks(_replayed_calls, world_size, "cuda", timeout=300):
        for op_name, r in per_rank.items():
            assert r["replayed"] and r["stats"]["captures"] == 4 and r["stats"]["replays"] == 5, (op_name, r)
            assert r["stats"]["off"] is None, (op_name, r)
            assert r["err"] < 1e-2, (op_name, r)
            assert r["grew"] < r["product"], (op_name, r)  # captures 2-4 took no product of their own
