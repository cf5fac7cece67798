"""The layer benchmark's model on gloo ranks (CPU, fp32): the sharded layer through autotaxer's layers,
through its torch-signature functions and through PyTorch's functional collectives against the unsharded
layer (output, loss, every gradient), eager and under ``torch.compile(fullgraph=True)`` with no graph
break; where dispatch serves BSP, the compiled layer runs the kernels the compiled plain layer runs."""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks

SMALL = {"hidden": 32, "heads": 4, "kv_heads": 2, "head_dim": 8, "ffn": 64}


def _layer_against_reference(ctx, comm: str, compiled: bool) -> dict:
    import torch
    import torch.distributed as dist

    import autotaxer
    from autotaxer.models import LlamaConfig, LlamaLayer, TPLlamaLayer

    autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    ws, r = ctx.world_size, ctx.rank
    torch.manual_seed(0)  # the same reference weights and data on every rank
    ref = LlamaLayer(LlamaConfig(**SMALL))
    with torch.no_grad():  # RMSNorm weights start at 1: make their gradients and effect visible
        for norm in (ref.attn_norm, ref.mlp_norm):
            norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(8 * ws, 2, SMALL["hidden"])
    grad_y = torch.randn_like(x)
    layer = TPLlamaLayer.from_reference(ref, r, ws, comm)

    x_ref = x.clone().requires_grad_()
    y_ref = ref(x_ref)
    (y_ref * grad_y).sum().backward()

    x_shard = x.chunk(ws)[r].clone().requires_grad_()
    if compiled:
        explain = torch._dynamo.explain(layer)(x_shard)
        breaks = explain.graph_break_count
        torch._dynamo.reset()
        fn = torch.compile(layer, fullgraph=True)
    else:
        breaks, fn = 0, layer
    y = fn(x_shard)
    (y * grad_y.chunk(ws)[r]).sum().backward()
    for p in layer.replicated_parameters():
        dist.all_reduce(p.grad)

    mine = lambda t, dim: t.chunk(ws, dim)[r]  # noqa: E731
    want = {
        "y": mine(y_ref, 0),
        "grad_x": mine(x_ref.grad, 0),
        "qkv": torch.cat([mine(lin.weight.grad, 0) for lin in (ref.wq, ref.wk, ref.wv)]),
        "wo": mine(ref.wo.weight.grad, 1),
        "gate_up": torch.cat([mine(ref.w_gate.weight.grad, 0), mine(ref.w_up.weight.grad, 0)]),
        "w_down": mine(ref.w_down.weight.grad, 1),
        "attn_norm": ref.attn_norm.weight.grad,
        "mlp_norm": ref.mlp_norm.weight.grad,
    }
    got = {
        "y": y,
        "grad_x": x_shard.grad,
        **{name: getattr(layer, name).weight.grad for name in want if name not in ("y", "grad_x")},
    }
    errors = {
        name: ((got[name] - w).norm() / w.norm()).item() if got[name] is not None else float("inf")
        for name, w in want.items()
    }
    from autotaxer import ProblemKey
    from autotaxer.models import layer_problems
    from autotaxer.runtime.dispatch import get_runtime

    called = sorted(k.text for k in get_runtime().decisions())
    listed = sorted(
        ProblemKey.make(
            p["op"], "cpu", ws, "fp32", {f: p[f] for f in "MNK"}, {f: p[f] for f in p if f not in "opMNK"}
        ).text
        for p in layer_problems(layer.cfg, ws, x.shape[0] * x.shape[1], train=True)
    )
    return {"errors": errors, "breaks": breaks, "problems": (called, listed)}


def _every_case(ctx) -> dict:
    """Every (comm, compiled) case in turn, in one spawned group (spawning one costs seconds)."""
    return {(comm, compiled): _layer_against_reference(ctx, comm, compiled)
            for comm in ("autotaxer", "functions", "plain") for compiled in (False, True)}  # fmt: skip


@pytest.fixture(scope="module")
def layer_results() -> list[dict]:
    """Per rank, ``{(comm, compiled): results}`` of :func:`_layer_against_reference`."""
    return run_ranks(_every_case, 2, "cpu", timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("comm", ["autotaxer", "functions", "plain"])
def test_sharded_layer_matches_the_unsharded_layer(comm: str, compiled: bool, layer_results) -> None:
    for per_rank in (r[(comm, compiled)] for r in layer_results):
        assert max(per_rank["errors"].values()) < 1e-5, per_rank["errors"]
        assert per_rank["breaks"] == 0
        if comm != "plain" and not compiled:  # every problem the step dispatched, and only those
            called, listed = per_rank["problems"]
            assert called == listed


def test_config_names_the_field_that_cannot_be_sharded() -> None:
    from autotaxer.models import LlamaConfig

    with pytest.raises(ValueError, match="kv_heads"):
        LlamaConfig(**SMALL).validate(world_size=4)  # 2 key/value heads over 4 ranks
    with pytest.raises(ValueError, match="heads"):
        LlamaConfig(**{**SMALL, "heads": 6, "kv_heads": 4}).validate()


def _kernels(code: str) -> list[str]:
    """The calls of inductor's ``call`` in ``code``, in order: each fused kernel as ``fused``, each extern
    kernel or op by name with the sizes and strides of the strided views it is passed (a transposed
    weight is a different cuBLAS call)."""
    import re

    calls = []
    for line in code[code.index("def call(") :].splitlines():
        m = re.match(
            r"\s*(?:[\w, ]+ = )?((?:cpp_fused|triton_|extern_kernels\.|torch\.ops\.)[\w.]*)\((.*)", line
        )
        if m is None:
            continue
        name, rest = m.groups()
        if name.startswith(("cpp_fused", "triton_")):
            calls.append("fused")
            continue
        views = re.findall(r"reinterpret_tensor\(\w+, \(([^)]*)\), \(([^)]*)\)", rest)
        strided = [v for v in views if not _contiguous(*v)]  # a contiguous view is the buffer itself
        calls.append(f"{name} {strided}" if strided else name)
    return calls


def _contiguous(sizes: str, strides: str) -> bool:
    """Whether a view of these sizes and strides (inductor's text) is row-major contiguous."""
    dims = [int(d) for d in sizes.split(",") if d.strip()]
    want, step = [], 1
    for d in reversed(dims):
        want.append(step)
        step *= d
    got = [int(d) for d in strides.split(",") if d.strip()]
    return all(g == w or d == 1 for g, w, d in zip(got, reversed(want), dims, strict=True))


def _compiled_kernels(ctx) -> dict:
    """Per comm and step (forward under no_grad, forward and backward), the kernels inductor runs."""
    import torch

    import autotaxer
    from autotaxer.models import LlamaConfig, LlamaLayer, TPLlamaLayer

    autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    ref = LlamaLayer(LlamaConfig(**SMALL))
    out = {}
    for comm in ("plain", "autotaxer", "functions"):
        for train in (False, True):
            torch._dynamo.reset()
            fn = torch.compile(
                TPLlamaLayer.from_reference(ref, ctx.rank, ctx.world_size, comm), fullgraph=True
            )
            x = torch.randn(8, 2, SMALL["hidden"], requires_grad=train)

            def step(fn=fn, x=x, train=train) -> None:
                with torch.set_grad_enabled(train):
                    y = fn(x)
                    if train:
                        y.sum().backward()

            _, codes = run_and_get_code(step)
            out[(comm, train)] = [_kernels(code) for code in codes]
    return out


@pytest.mark.slow
def test_a_compiled_layer_served_bsp_runs_the_plain_layers_kernels() -> None:
    """No record: dispatch serves ``bsp``, which a compiled graph holds as the plain collective and matmul
    (:mod:`autotaxer.integrations.compiled`). Through autotaxer's layers and through the torch-signature
    functions the compiled layer then runs what the compiled plain layer runs: the same collectives and
    matmuls, on the same views, in the same order, and as many fused kernels (only views differ, which
    inductor folds into its kernels)."""
    results = run_ranks(_compiled_kernels, 2, "cpu", timeout=600)
    for per_rank in results:
        for train in (False, True):
            plain = per_rank[("plain", train)]
            assert any("all_gather_into_tensor" in c for code in plain for c in code)
            assert any("reduce_scatter_tensor" in c for code in plain for c in code)
            for comm in ("autotaxer", "functions"):
                assert per_rank[(comm, train)] == plain, (comm, train)
