"""Dispatch's plan cache on one CPU process: a call reuses a plan only when op, every shape, every dtype
and the layout are equal; the hot index agrees with the full signature, between ``Runtime.dispatch``
and module ``dispatch``, after LRU eviction, and when two layouts share shapes."""

from __future__ import annotations

import pytest
import torch

import autotaxer
from autotaxer.runtime.dispatch import shutdown


@pytest.fixture
def rt():
    runtime = autotaxer.init(
        autotaxer.RuntimeConfig(
            env_tables=False, shipped_tables=False, persist_misses=False, workspace_cache=8
        )
    )
    yield runtime
    shutdown()


def _inputs(m: int = 8, k: int = 16, n: int = 12, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    return torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)


def _close(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    want = a.float() @ b.float()
    tol = 1e-5 if a.dtype == torch.float32 else 3e-2
    same_kind = got.dtype == a.dtype and got.shape == want.shape
    return same_kind and torch.allclose(got.float(), want, atol=tol, rtol=tol)


CASES = {
    "base": (dict(), 0),
    "dtype": (dict(dtype=torch.bfloat16), 0),
    "layout": (dict(), 1),  # world size 1: gather_dim 0 and 1 take the same shapes
    "m": (dict(m=10), 0),
    "k": (dict(k=20), 0),
    "n": (dict(n=14), 0),
}


def test_calls_differing_in_one_dtype_layout_or_dimension_get_their_own_plan(rt) -> None:
    plans = {}
    for name, (shape, gd) in CASES.items():
        a, b = _inputs(**shape)
        plans[name] = rt.plan("ag_gemm", a, b, gather_dim=gd)
    assert len({id(p) for p in plans.values()}) == len(CASES)
    base = plans["base"].key
    assert plans["dtype"].key.dtype == "bf16" and base.dtype == "fp32"
    assert plans["layout"].key["gather_dim"] == 1 and base["gather_dim"] == 0
    assert (plans["m"].key["M"], plans["k"].key["K"], plans["n"].key["N"]) == (10, 20, 14)
    # interleaved calls (hot path, both entry points): each lands on its own plan, results stay right
    rounds = 3
    for i in range(rounds):
        for name, (shape, gd) in CASES.items():
            a, b = _inputs(**shape)
            call = autotaxer.dispatch if i % 2 else rt.dispatch
            assert _close(call("ag_gemm", a, b, gather_dim=gd), a, b), name
    assert {name: p.calls for name, p in plans.items()} == {name: rounds for name in CASES}


def test_mismatched_inputs_are_rejected_even_when_shapes_match_a_cached_plan(rt) -> None:
    a, b = _inputs()
    rt.dispatch("ag_gemm", a, b, gather_dim=0)
    with pytest.raises(ValueError, match="dtype"):
        rt.dispatch("ag_gemm", a, b.to(torch.bfloat16), gather_dim=0)
    with pytest.raises(ValueError, match="not a layout field"):
        autotaxer.dispatch("ag_gemm", a, b, gather_dim=0, gather=1)
    with pytest.raises(ValueError, match="gather_dim"):
        autotaxer.dispatch("ag_gemm", a, b, gather_dim=2)
    with pytest.raises(KeyError):
        rt.dispatch("no_such_op", a, b, gather_dim=0)


def test_two_layouts_with_the_same_shapes_alternate_without_mixing(rt) -> None:
    a, b = _inputs()
    p0 = rt.plan("ag_gemm", a, b, gather_dim=0)
    p1 = rt.plan("ag_gemm", a, b, gather_dim=1)
    for _ in range(4):
        assert _close(autotaxer.dispatch("ag_gemm", a, b, gather_dim=1), a, b)
        assert _close(rt.dispatch("ag_gemm", a, b, gather_dim=0), a, b)
        assert _close(autotaxer.dispatch("ag_gemm", a, b, gather_dim=0), a, b)
    assert (p0.calls, p1.calls) == (8, 4)
    assert (p0.key["gather_dim"], p1.key["gather_dim"]) == (0, 1)
    assert rt.plan("ag_gemm", a, b) is not p0  # defaults spelled out or not: separate plans, same problem
    assert rt.plan("ag_gemm", a, b).key == p0.key


def test_an_evicted_plan_is_never_served_again_and_its_calls_are_kept() -> None:
    rt = autotaxer.init(
        autotaxer.RuntimeConfig(
            env_tables=False, shipped_tables=False, persist_misses=False, workspace_cache=2
        )
    )
    try:
        shapes = [8, 10, 12]
        first = rt.plan("ag_gemm", *_inputs(m=8), gather_dim=0)
        for m in shapes:
            a, b = _inputs(m=m)
            for _ in range(2):
                assert _close(autotaxer.dispatch("ag_gemm", a, b, gather_dim=0), a, b)
        assert len(rt.decisions()) == 2 and first.key not in rt.decisions()  # M=8 was least recent
        a, b = _inputs(m=8)
        assert _close(autotaxer.dispatch("ag_gemm", a, b, gather_dim=0), a, b)
        again = rt.plan("ag_gemm", a, b, gather_dim=0)
        assert again is not first and first.calls == 0 and again.calls == 1
        assert {m.key["M"]: m.calls for m in rt.misses()} == {8: 3, 10: 2, 12: 2}
        # the most recently used plan survives the next eviction, the least recent goes
        rt.dispatch("ag_gemm", *_inputs(m=12), gather_dim=0)
        rt.dispatch("ag_gemm", *_inputs(m=14), gather_dim=0)
        assert sorted(k["M"] for k in rt.decisions()) == [12, 14]
    finally:
        shutdown()


def test_other_ops_take_the_full_signature_path(rt) -> None:
    """Calls with more than two tensors never use the two-tensor hot index."""
    from autotaxer import ProblemKey
    from autotaxer.ops import get_op, op_names

    if "flash_decode" not in op_names():
        pytest.skip("flash_decode op not registered")
    op = get_op("flash_decode")
    key = ProblemKey.make("flash_decode", "cpu", 1, "fp32", {"B": 2, "H": 4, "Hkv": 2, "D": 64, "S": 64})
    inputs = op.make_inputs(key, 0, torch.device("cpu"), 3)
    p = rt.plan("flash_decode", *inputs)
    for _ in range(2):
        autotaxer.dispatch("flash_decode", *inputs)
    assert p.calls == 2


def test_the_runtime_serves_the_hot_path_and_dispatch_routes_differentiable_calls(rt) -> None:
    """``Runtime.dispatch`` is the hot path alone: a call whose input requires grad is refused there, naming
    ``autotaxer.dispatch``, which routes it through the op's autograd (the integration layer above)."""
    a, b = _inputs()
    a.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="autotaxer.dispatch differentiates"):
        rt.dispatch("ag_gemm", a, b, gather_dim=0)
    c = autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
    c.sum().backward()
    assert c.grad_fn is not None and torch.allclose(a.grad, b.sum(1).expand_as(a), atol=1e-5)
    with torch.no_grad():
        assert _close(rt.dispatch("ag_gemm", a, b, gather_dim=0), a.detach(), b)
