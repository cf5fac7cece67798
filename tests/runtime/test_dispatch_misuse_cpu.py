"""Dispatch used the way users break it, on 2 gloo ranks: a missing tensor on one rank, ``requires_grad`` on
one rank only, a rank calling another shape of the same shard size after the shape was decided (caught by
``RuntimeConfig(check_calls=True)``); each ends with a clear error on every rank instead of a hang or a
silently wrong result. And a kernel wait that gave up (``planted_never_signal``, one rank): the next
dispatch names it, and the key is served by its baseline from then on."""

from __future__ import annotations

import pytest
from _factories import attempt as _attempt
from _factories import rank_key

from autotaxer.testing import run_ranks


def _runtime(tables: tuple[str, ...] = (), **config):
    import autotaxer

    return autotaxer.init(
        autotaxer.RuntimeConfig(
            tables=tables, env_tables=False, shipped_tables=False, persist_misses=False, **config
        )
    )


def _misuse(ctx) -> dict:
    import torch

    import autotaxer
    from autotaxer.ops import get_op

    op = get_op("ag_gemm")
    out = {}
    _runtime()
    key = rank_key(ctx, 8, 12, 6, 0)
    a, b = op.make_inputs(key, ctx.rank, ctx.device, 1)
    # 1. a missing tensor on rank 1 at a shape's first call: both ranks raise, rank 1's reason named
    out["none"] = _attempt(
        lambda: autotaxer.dispatch("ag_gemm", a if ctx.rank == 0 else None, b, gather_dim=0)
    )
    # 2. requires_grad on rank 0 only: the exchange of the first call says so on both ranks
    grad_a = a.clone().requires_grad_(ctx.rank == 0)
    out["grad"] = _attempt(lambda: autotaxer.dispatch("ag_gemm", grad_a, b, gather_dim=0))
    # the group is still usable: the same call, consistent, then the shape decided
    c = autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
    out["after"] = float((c.float() - op.reference(key, ctx.rank, ctx.device, 1)).abs().max())
    # 3. check_calls: rank 1 calls another shape with the same shard size (4x6 against 3x8) after the shape
    # was decided; without the check, rank 0's cached call and rank 1's new one pair wrongly
    _runtime(check_calls=True)
    autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
    other = torch.randn(3, 8) if ctx.rank == 1 else a
    b_other = torch.randn(8, 12) if ctx.rank == 1 else b
    out["shape"] = _attempt(lambda: autotaxer.dispatch("ag_gemm", other, b_other, gather_dim=0))
    # 4. check_calls: requires_grad on rank 1 only for a decided shape
    late = a.clone().requires_grad_(ctx.rank == 1)
    out["late_grad"] = _attempt(lambda: autotaxer.dispatch("ag_gemm", late, b, gather_dim=0))
    c = autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)  # and the group still works
    out["after_check"] = float((c.float() - op.reference(key, ctx.rank, ctx.device, 1)).abs().max())
    autotaxer.runtime.dispatch.shutdown()
    return out


@pytest.mark.slow
def test_misuse_ends_with_a_clear_error_on_every_rank() -> None:
    results = run_ranks(_misuse, 2, "cpu", timeout=240)
    for r in results:
        assert "ConsensusError" in r["none"] and "rank 1: TypeError" in r["none"], r["none"]
        assert "tensor argument 1: expected a torch.Tensor, got NoneType" in r["none"]
        assert "ConsensusError" in r["grad"], r["grad"]
        assert "rank 0: tensor arguments 1, rank 1: none" in r["grad"], r["grad"]
        assert "check_calls" in r["shape"] and "(4, 6)" in r["shape"] and "(3, 8)" in r["shape"], r["shape"]
        assert "check_calls" in r["late_grad"] and "requires_grad" in r["late_grad"], r["late_grad"]
        assert r["after"] < 1e-4 and r["after_check"] < 1e-4


def test_a_wait_that_gave_up_is_named_on_the_next_dispatch_and_its_key_served_by_bsp(tmp_path) -> None:
    import torch

    import autotaxer
    from autotaxer import ProblemKey
    from autotaxer.ops import get_op
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table
    from autotaxer.testing.planted import PlantedNeverSignal

    op = get_op("ag_gemm")
    op.register(PlantedNeverSignal())
    try:
        key = ProblemKey.make("ag_gemm", "cpu", 1, "fp32", {"M": 8, "N": 12, "K": 6}, {"gather_dim": 0})
        path = tmp_path / "t.json"
        write_table([WinnerRecord(key, "planted_never_signal", {}, 5.0, 9.0, 1, device_type="cpu")], path)
        rt = _runtime((str(path),), peer_timeout_s=0.5, first_call_timeout_s=0.5)
        a, b = op.make_inputs(key, 0, torch.device("cpu"), 1)
        autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)  # its (planted) kernel gives up waiting for rank 1
        assert rt.decisions()[key].variant == "planted_never_signal"
        with pytest.raises(autotaxer.PeerTimeoutError) as info:
            autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
        text = str(info.value)
        assert f"ag_gemm planted_never_signal at {key.text}" in text and "waited 0.5 s for rank 1" in text
        assert "never signalled" in text and "no longer serves this variant" in text
        c = autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
        assert rt.decisions()[key].variant == "bsp"
        assert torch.allclose(c, op.reference(key, 0, torch.device("cpu"), 1), atol=1e-4)
        autotaxer.check()  # nothing new
    finally:
        autotaxer.runtime.dispatch.shutdown()
        op._variants.pop("planted_never_signal", None)


def test_the_errors_ranks_raise_together_are_public() -> None:
    """What the README tells users to expect when ranks call differently can be caught by its public name."""
    import autotaxer
    from autotaxer.runtime.agreement import ConsensusError, OutOfStepError

    assert autotaxer.ConsensusError is ConsensusError and autotaxer.OutOfStepError is OutOfStepError
    assert issubclass(autotaxer.OutOfStepError, autotaxer.ConsensusError)
    assert {"ConsensusError", "OutOfStepError"} <= set(autotaxer.__all__)
