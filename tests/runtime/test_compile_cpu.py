"""autotaxer under ``torch.compile`` on gloo ranks (CPU, fp32): what the compiled graph holds.

Where dispatch serves plain ``bsp`` the traced graph holds PyTorch's functional collective and the matmul
(what plain PyTorch traces to, so inductor treats both alike); where a table names another variant it
holds autotaxer's custom op, unless the call needs the gathered A (B requires grad) and that variant
cannot hand it out: then the fastest form that can, here BSP, traced. Every public entry point compiles
with ``fullgraph=True`` and no graph break, the group given by name or as a group, and the values and
gradients are plain PyTorch's.
"""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks


def _graph_ops(ctx, table: str) -> dict:
    import torch
    import torch.distributed as dist

    import autotaxer

    autotaxer.init(
        autotaxer.RuntimeConfig(tables=(table,), env_tables=False, shipped_tables=False, persist_misses=False)
    )
    ws, r = ctx.world_size, ctx.rank
    name = dist.group.WORLD.group_name
    seen: list[str] = []

    def backend(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    gen = torch.Generator().manual_seed(0)
    w_up = torch.randn(12, 8, generator=gen, requires_grad=True)  # (out, in): passed as w.t(), nk
    w_down = torch.randn(8, 12 // ws, generator=gen, requires_grad=True)
    full = torch.randn(16 * ws, 8, generator=gen)  # tuned (cpu_chunked) at M = 16 ws; bsp at 64 ws (4x away)

    def layer(x):
        w = w_up if train_up else w_up.detach()
        _, (h,) = autotaxer.fused_all_gather_matmul(x, [w.t()], 0, name, return_A=False)
        h = torch.relu(h[:, r * (12 // ws) : (r + 1) * (12 // ws)])
        return autotaxer.fused_matmul_reduce_scatter(h, w_down.t(), "sum", 0, name)

    out = {}
    for rows, train_up in ((16 * ws, False), (16 * ws, True), (64 * ws, True)):
        x_full = torch.cat([full] * (rows // (16 * ws)))
        x = x_full.chunk(ws)[r].clone().requires_grad_()
        seen.clear()
        breaks = torch._dynamo.explain(layer)(x).graph_break_count
        torch._dynamo.reset()
        y = torch.compile(layer, backend=backend, fullgraph=True)(x)
        y.sum().backward()
        grads = (x.grad.clone(), w_down.grad.clone(), w_up.grad)
        x.grad = w_up.grad = w_down.grad = None
        torch._dynamo.reset()
        y_eager = layer(x)
        y_eager.sum().backward()
        pairs = [(grads[0], x.grad), (grads[1], w_down.grad)] + ([(grads[2], w_up.grad)] if train_up else [])
        errors = [(g - e).abs().max().item() for g, e in pairs]
        x.grad = w_up.grad = w_down.grad = None
        out[(rows, train_up)] = {
            "breaks": breaks,
            "custom_op": any("autotaxer" in s for s in seen),
            "funcol": any("all_gather" in s for s in seen) and any("reduce_scatter" in s for s in seen),
            "error": max([(y - y_eager).abs().max().item(), *errors]),
        }
    return out


@pytest.mark.slow
def test_compiled_graph_holds_the_collectives_where_bsp_is_served_else_the_custom_op(tmp_path) -> None:
    from autotaxer import ProblemKey
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table

    ws = 2
    key = ProblemKey.make(
        "ag_gemm", "cpu", ws, "fp32", {"M": 16 * ws, "N": 12, "K": 8}, {"gather_dim": 0, "b_layout": "nk"}
    )
    rec = WinnerRecord(key, "cpu_chunked", {"chunks": 2, "order": "rotated"}, 5.0, 9.0, 4, device_type="cpu")
    write_table([rec], tmp_path / "t.json")
    for per_rank in run_ranks(_graph_ops, ws, "cpu", args=(str(tmp_path / "t.json"),), timeout=600):
        tuned, saving = per_rank[(16 * ws, False)], per_rank[(16 * ws, True)]
        untuned = per_rank[(64 * ws, True)]
        assert tuned["breaks"] == saving["breaks"] == untuned["breaks"] == 0
        assert tuned["custom_op"], tuned  # ag_gemm tuned: autotaxer's op in the graph
        # W requires grad: the gathered A is needed, which cpu_chunked cannot hand out: BSP saves it, traced
        assert not saving["custom_op"] and saving["funcol"], saving
        assert not untuned["custom_op"] and untuned["funcol"], untuned  # every call bsp: plain PyTorch's
        assert max(tuned["error"], saving["error"], untuned["error"]) < 1e-4, per_rank


def _opchecks(ctx) -> dict:
    import torch

    import autotaxer
    import autotaxer.integrations.compiled  # noqa: F401  (registers the custom ops)

    autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    a = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(12, 16).t().requires_grad_()  # an nn.Linear weight's transpose
    checks = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_static")
    ops = torch.ops.autotaxer
    return {
        str(op): torch.library.opcheck(op, (a, b, 0, ""), test_utils=checks)
        for op in (ops.ag_gemm.default, ops.ag_gemm_saving.default, ops.gemm_rs.default)
    }


def test_the_custom_ops_pass_torchs_opcheck() -> None:
    """Each custom op's schema, fake kernel and autograd registration agree with what it computes, and
    AOTAutograd traces it (``torch.library.opcheck``): what compiled code relies on, however the ops are
    registered (``autotaxer/integrations/_library.py``)."""
    (got,) = run_ranks(_opchecks, 1, "cpu", timeout=300)
    assert len(got) == 3
    for op, result in got.items():
        assert set(result.values()) == {"SUCCESS"}, (op, result)
