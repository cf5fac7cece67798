"""What is served is what was tuned, on every call path (issue 46): a winner that cannot hand out the
gathered A (``cpu_chunked`` here, as ``ce_fanout`` on GPUs) serves every call that does not need it
(``return_A=False``, ``no_grad``, only A requiring grad), eager and under ``torch.compile``; calls that
need it (``return_A=True``, B requiring grad) get the fastest form that can; :func:`autotaxer.served`
says which variant served how many calls per key and path; gradients stay plain PyTorch's."""

from __future__ import annotations

import pytest

from autotaxer import ProblemKey
from autotaxer.records import WinnerRecord
from autotaxer.testing import run_ranks

WS, ROWS, N, K = 2, 8, 12, 8  # the shard's rows; the tuned key is M = ROWS * WS, N, K, nk (W.t())


def _runs(variant_cls, method: str, counter: dict) -> None:
    """Count the runs of ``variant_cls.method`` in this rank process (independent of served())."""
    original = getattr(variant_cls, method)

    def counted(self, *args, **kwargs):
        counter[method] = counter.get(method, 0) + 1
        return original(self, *args, **kwargs)

    setattr(variant_cls, method, counted)


def _checks(ctx, table: str) -> dict:
    import torch
    import torch.distributed as dist

    import autotaxer
    from autotaxer.ops.ag_gemm.bsp import BspVariant
    from autotaxer.ops.ag_gemm.cpu_chunked import CpuChunkedVariant

    chunked: dict = {}
    bsp: dict = {}
    _runs(CpuChunkedVariant, "run", chunked)
    _runs(BspVariant, "run_for_backward", bsp)
    autotaxer.init(
        autotaxer.RuntimeConfig(tables=(table,), env_tables=False, shipped_tables=False, persist_misses=False)
    )
    r, name = ctx.rank, dist.group.WORLD.group_name
    gen = torch.Generator().manual_seed(0)
    w_full = torch.randn(N, K, generator=gen)
    x_full = torch.randn(ROWS * WS, K, generator=gen)
    w_down_full = torch.randn(K, N * WS, generator=gen)
    out: dict = {}

    def runs() -> tuple[int, int]:
        return chunked.get("run", 0), bsp.get("run_for_backward", 0)

    def case(label: str, fn) -> None:
        before, n0 = autotaxer.served(), runs()
        result = fn()
        rows = autotaxer.served(since=before)
        n1 = runs()
        out[label] = {
            "rows": [(s.path, s.variant, s.calls, s.status) for s in rows],
            "chunked_runs": n1[0] - n0[0],
            "bsp_saving_runs": n1[1] - n0[1],
            **(result or {}),
        }

    x = x_full.chunk(WS)[r].clone()

    def f(xa, w, return_a=False):
        return autotaxer.fused_all_gather_matmul(xa, [w.t()], 0, name, return_A=return_a)

    def grad_errors(xa, w=None) -> dict:
        """The largest error of ``xa``'s gradient (and ``w``'s, when given) after a backward of
        ``(y * y).sum()``, against plain PyTorch's on the full inputs."""
        xr, wr = x_full.clone().requires_grad_(), w_full.clone().requires_grad_()
        ((xr @ wr.t()) ** 2).sum().backward()
        errs = {"grad_a": (xa.grad - xr.grad.chunk(WS)[r] * WS).abs().max().item()}
        if w is not None:
            errs["grad_w"] = (w.grad - wr.grad).abs().max().item()
        return errs

    # 1. eager, no_grad, return_A=False, A requiring grad only: the winner serves
    def eager_no_grad():
        with torch.no_grad():
            a, (y,) = f(x.clone().requires_grad_(), w_full)
        return {"error": (y - x_full @ w_full.t()).abs().max().item(), "A": a is None}

    case("eager_no_grad", eager_no_grad)

    def eager_inference():
        with torch.inference_mode():
            a, (y,) = f(x, w_full)
        return {"error": (y - x_full @ w_full.t()).abs().max().item(), "A": a is None}

    case("eager_inference", eager_inference)

    # 2. eager, grad on, only A requires grad: the winner serves; gradients are plain PyTorch's
    def eager_grad_a():
        xa = x.clone().requires_grad_()
        _, (y,) = f(xa, w_full)
        (y * y).sum().backward()
        return grad_errors(xa)

    case("eager_grad_a", eager_grad_a)

    # 3. eager, W requires grad: the gathered A is saved for W's gradient: the fastest form that saves (bsp)
    def eager_grad_w():
        xa, w = x.clone().requires_grad_(), w_full.clone().requires_grad_()
        _, (y,) = f(xa, w)
        (y * y).sum().backward()
        return grad_errors(xa, w)

    case("eager_grad_w", eager_grad_w)

    # 4. eager, return_A=True under no_grad: the caller needs A: the fastest form that returns it
    def eager_return_a():
        with torch.no_grad():
            a, (y,) = f(x, w_full, return_a=True)
        return {"error": max((a - x_full).abs().max().item(), (y - x_full @ w_full.t()).abs().max().item())}

    case("eager_return_a", eager_return_a)

    # 5. eager fused_matmul_reduce_scatter (untuned: bsp), then dispatch itself (the hot path)
    def eager_rs():
        h = torch.randn(ROWS * WS, K, generator=torch.Generator().manual_seed(1 + r))
        with torch.no_grad():
            z = autotaxer.fused_matmul_reduce_scatter(h, w_down_full[:, :N], "sum", 0, name)
            autotaxer.dispatch("ag_gemm", x, w_full.t(), gather_dim=0)
        return {"rs_shape": tuple(z.shape)}

    case("eager_rs_and_dispatch", eager_rs)

    # 6. compiled (fullgraph), the same three calls
    def compiled(label: str, grad_w: bool, no_grad: bool) -> None:
        w = w_full.clone().requires_grad_(grad_w)
        xa = x.clone().requires_grad_()

        def layer(xin):
            _, (y,) = autotaxer.fused_all_gather_matmul(xin, [w.t()], 0, name, return_A=False)
            return y

        torch._dynamo.reset()
        breaks = torch._dynamo.explain(layer)(xa).graph_break_count
        torch._dynamo.reset()
        fn = torch.compile(layer, fullgraph=True)

        def run():
            if no_grad:
                with torch.no_grad():
                    y = fn(xa)
                return {"breaks": breaks, "error": (y - x_full @ w_full.t()).abs().max().item()}
            y = fn(xa)
            (y * y).sum().backward()
            return {"breaks": breaks, **grad_errors(xa, w if grad_w else None)}

        case(label, run)

    compiled("compiled_no_grad", grad_w=False, no_grad=True)
    compiled("compiled_grad_a", grad_w=False, no_grad=False)
    compiled("compiled_grad_w", grad_w=True, no_grad=False)

    # 7. the column-parallel layer (dispatch): a frozen weight gets the winner, a trained one the saving form
    from autotaxer.nn import ColumnParallelLinear

    layer = ColumnParallelLinear.from_linear(torch.nn.Linear(K, N, bias=False))
    with torch.no_grad():
        layer.weight.copy_(w_full)

    def layer_case(train_w: bool, compile_it: bool):
        layer.weight.requires_grad_(train_w)
        layer.weight.grad = None
        xa = x.clone().requires_grad_()
        torch._dynamo.reset()
        fn = torch.compile(layer, fullgraph=True) if compile_it else layer
        (fn(xa) ** 2).sum().backward()
        return grad_errors(xa, layer.weight if train_w else None)

    case("layer_frozen_eager", lambda: layer_case(False, False))
    case("layer_trained_eager", lambda: layer_case(True, False))
    case("layer_frozen_compiled", lambda: layer_case(False, True))

    # 8. the custom op called directly with W requiring grad: the winner serves, backward gathers A again
    def custom_op_direct():
        import autotaxer.integrations.compiled  # noqa: F401  (registers the ops)

        xa, w = x.clone().requires_grad_(), w_full.clone().requires_grad_()
        (torch.ops.autotaxer.ag_gemm(xa, w.t(), 0, name) ** 2).sum().backward()
        return grad_errors(xa, w)

    case("custom_op_direct", custom_op_direct)
    torch._dynamo.reset()
    return out


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory) -> list[dict]:
    from autotaxer.table_file import write_table

    key = ProblemKey.make(
        "ag_gemm", "cpu", WS, "fp32", {"M": ROWS * WS, "N": N, "K": K}, {"gather_dim": 0, "b_layout": "nk"}
    )
    rec = WinnerRecord(key, "cpu_chunked", {"chunks": 2, "order": "rotated"}, 5.0, 9.0, 4, device_type="cpu")
    table = tmp_path_factory.mktemp("tables") / "t.json"
    write_table([rec], table)
    return run_ranks(_checks, WS, "cpu", args=(str(table),), timeout=600)


TUNED = ("cpu_chunked", "tuned")
FELL_BACK = ("bsp", "fell back")


def _only(got: dict, path: str) -> list[tuple]:
    return [(v, c, s) for p, v, c, s in got["rows"] if p == path]


def test_a_winner_that_cannot_save_serves_fused_all_gather_matmul_where_a_is_not_needed(per_rank) -> None:
    for got in per_rank:
        for case in ("eager_no_grad", "eager_inference", "eager_grad_a"):
            c = got[case]
            assert c["chunked_runs"] == 1 and c["bsp_saving_runs"] == 0, (case, c)  # fails before issue 46
            assert _only(c, "function") == [("cpu_chunked", 1, "tuned")], (case, c)
        for case in ("eager_no_grad", "eager_inference"):
            assert got[case]["error"] < 1e-4 and got[case]["A"], (case, got[case])
        assert got["eager_grad_a"]["grad_a"] < 1e-4


def test_calls_that_need_the_gathered_a_get_a_form_that_returns_it(per_rank) -> None:
    for got in per_rank:
        for case in ("eager_grad_w", "eager_return_a"):
            c = got[case]
            assert c["chunked_runs"] == 0 and c["bsp_saving_runs"] == 1, (case, c)
            assert _only(c, "function") == [("bsp", 1, "fell back")], (case, c)
        assert max(got["eager_grad_w"]["grad_a"], got["eager_grad_w"]["grad_w"]) < 1e-4
        assert got["eager_return_a"]["error"] < 1e-5


def test_served_lists_each_path(per_rank) -> None:
    for got in per_rank:
        c = got["eager_rs_and_dispatch"]
        assert ("function", "bsp", 1, "untuned") in c["rows"], c  # fused_matmul_reduce_scatter, untuned
        assert ("dispatch", "cpu_chunked", 1, "tuned") in c["rows"], c  # the hot path, counted
        assert c["rs_shape"] == (ROWS, N)


def test_compiled_fullgraph_serves_the_winner_unless_w_requires_grad(per_rank) -> None:
    for got in per_rank:
        for case in ("compiled_no_grad", "compiled_grad_a"):
            c = got[case]
            assert c["breaks"] == 0, (case, c)
            assert c["chunked_runs"] == 1 and c["bsp_saving_runs"] == 0, (case, c)
            assert _only(c, "compiled") == [("cpu_chunked", 1, "tuned")], (case, c)
        assert got["compiled_no_grad"]["error"] < 1e-4
        assert got["compiled_grad_a"]["grad_a"] < 1e-4
        c = got["compiled_grad_w"]  # the fastest form that saves is bsp: traced into the graph
        assert c["breaks"] == 0 and c["chunked_runs"] == 0, c
        assert [(p, v, n) for p, v, n, _ in c["rows"]] == [("traced", "bsp", None)], c
        assert max(c["grad_a"], c["grad_w"]) < 1e-4, c


def test_the_layer_serves_the_winner_unless_its_weight_trains(per_rank) -> None:
    """... and ``autotaxer::ag_gemm`` called directly serves it too, gradients right either way."""
    for got in per_rank:
        for case, path, want in (
            ("layer_frozen_eager", "dispatch", ("cpu_chunked", 1, "tuned")),
            ("layer_trained_eager", "dispatch", ("bsp", 1, "fell back")),
            ("layer_frozen_compiled", "compiled", ("cpu_chunked", 1, "tuned")),
            ("custom_op_direct", "compiled", ("cpu_chunked", 1, "tuned")),
        ):
            c = got[case]
            assert _only(c, path) == [want], (case, c)
            assert max(v for k, v in c.items() if k.startswith("grad_")) < 1e-4, (case, c)
