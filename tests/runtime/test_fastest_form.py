"""The forms users have without autotaxer: torch's fused ops are searched beside the BSP forms on NVIDIA
GPUs (never on CPU, never with NCCL's symmetric-memory backend chosen), and an untuned key is served the
fastest form measured at its nearest tuned key, never a slower one by default."""

from __future__ import annotations

import pytest

from autotaxer import ProblemKey
from autotaxer._target import Target, cpu_target
from autotaxer.ops import _nccl_window, _symm_backend, _torch_symm, get_op
from autotaxer.records import WinnerRecord
from autotaxer.runtime.lookup import FALLBACK, decide
from autotaxer.tuner.study import SearchSpace, enqueue_baseline

H200 = Target("nvidia-h200", "sm_90", 132)


@pytest.fixture
def symm_mem_here(monkeypatch):
    """torch's fused ops and NCCL's windows as a CUDA build with NCCL 2.28 has them (CPU here)."""
    monkeypatch.setattr(_torch_symm, "unavailable_reason", lambda: None)
    monkeypatch.setattr(_nccl_window, "unavailable_reason", lambda: None)
    monkeypatch.delenv(_symm_backend.ENV, raising=False)
    return monkeypatch


def _key(op: str, m: int, gpu: str = "nvidia-h200", layout: str = "nk") -> ProblemKey:
    dim = "gather_dim" if op == "ag_gemm" else "scatter_dim"
    return ProblemKey.make(op, gpu, 2, "bf16", {"M": m, "N": 8192, "K": 8192}, {dim: 0, "b_layout": layout})


def _record(key: ProblemKey, variant: str, fastest: str | None) -> WinnerRecord:
    env = {"timing": "eager", **({"fastest_form": fastest} if fastest else {})}
    params = {"BLOCK_M": 128} if variant == "push" else {}
    return WinnerRecord(key, variant, params, 50.0, 60.0, 20, arch="sm_90", num_sms=132, env=env)


@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs"])
def test_torch_fused_is_searched_and_measured_first_on_nvidia_with_cudas_backend(symm_mem_here, op) -> None:
    o = get_op(op)
    space = SearchSpace.build(o, _key(op, 4096), H200, None)
    assert "torch_fused" in space.names and "bsp_symm" not in space.names  # one backend a process
    assert space.params_of("torch_fused") == {}
    queued = []

    class Study:
        def enqueue_trial(self, params, skip_if_exists):
            queued.append(params["variant"])

    enqueue_baseline(Study(), o, space)
    assert queued == ["bsp", "torch_fused"]  # measured before any fused variant
    symm_mem_here.setenv(_symm_backend.ENV, "nccl")
    space = SearchSpace.build(o, _key(op, 4096), H200, None)
    assert "bsp_symm" in space.names and "torch_fused" not in space.names
    reason = o.variants["torch_fused"].unavailable_reason(H200)
    assert "AUTOTAXER_SYMM_MEM=nccl" in reason and "symm_mem='cuda'" in reason
    assert "torch_fused" not in SearchSpace.build(o, _key(op, 64, "cpu"), cpu_target(), None).names


def test_a_bad_backend_choice_names_the_variable(monkeypatch) -> None:
    monkeypatch.setenv(_symm_backend.ENV, "nvshmem")
    with pytest.raises(ValueError, match="AUTOTAXER_SYMM_MEM"):
        _symm_backend.selected()
    with pytest.raises(ValueError, match="symm_mem"):
        _symm_backend.select("nvshmem")


@pytest.mark.parametrize("op", ["ag_gemm", "gemm_rs"])
def test_an_untuned_key_gets_the_fastest_form_of_its_nearest_tuned_key(symm_mem_here, op) -> None:
    o = get_op(op)
    near, far = _key(op, 4096), _key(op, 256)
    table = {near: _record(near, "push", "torch_fused"), far: _record(far, "bsp", None)}
    d = decide(
        table, _key(op, 2048), o, H200
    )  # nearest: M=4096 (push won; torch's fused op the fastest form)
    assert (d.variant, d.source, d.tuned_key) == ("torch_fused", FALLBACK, near)
    d = decide(table, _key(op, 384), o, H200)  # nearest: M=256, whose winner is a form itself
    assert (d.variant, d.tuned_key) == ("bsp", far)
    d = decide(table, _key(op, 64), o, H200)  # M=256 is 4x away: too far to tell, the baseline
    assert (d.variant, d.source, d.tuned_key) == ("bsp", FALLBACK, None)
    d = decide(table, _key(op, 2048, layout="kn"), o, H200)  # no record of this layout: the baseline
    assert (d.variant, d.source, d.tuned_key) == ("bsp", FALLBACK, None)
    near_bsp = _key(op, 1024)
    table[near_bsp] = _record(near_bsp, "bsp", None)
    symm_mem_here.setenv(_symm_backend.ENV, "nccl")  # torch's op cannot run here: the next nearest form
    d = decide(table, _key(op, 2048), o, H200)
    assert (d.variant, d.tuned_key) == ("bsp", near_bsp)


def test_a_record_that_names_no_form_is_passed_over(symm_mem_here) -> None:
    o = get_op("ag_gemm")
    near, far = _key("ag_gemm", 4096), _key("ag_gemm", 1536)
    table = {near: _record(near, "push", None), far: _record(far, "bsp_symm", None)}
    symm_mem_here.setenv(_symm_backend.ENV, "nccl")
    d = decide(table, _key("ag_gemm", 2560), o, H200)  # M=4096 says nothing of its forms: M=1536's winner
    assert (d.variant, d.tuned_key) == ("bsp_symm", far)


def test_a_call_needing_the_gathered_a_gets_the_fastest_form_that_hands_it_out(symm_mem_here) -> None:
    """A winner that cannot hand out the gathered A (ce_fanout) is replaced, for calls that need it, by
    the fastest form its record (else the nearest record) measured that can; with nothing known, BSP."""
    from autotaxer.runtime.lookup import EXACT, Decision, saving_decision

    o = get_op("ag_gemm")
    assert not any(o.variants[name].saves_for_backward() for name in ("ce_fanout", "ce_grouped"))
    assert o.variants["torch_fused"].saves_for_backward() and o.variants["push"].saves_for_backward()
    tuned, near, alone = _key("ag_gemm", 4096), _key("ag_gemm", 2048), _key("ag_gemm", 64)
    table = {
        tuned: _record(tuned, "ce_fanout", "torch_fused"),
        near: _record(near, "ce_fanout", None),
        alone: _record(alone, "ce_fanout", None),
    }

    def saving(key: ProblemKey) -> Decision:
        return saving_decision(table, key, Decision("ce_fanout", {}, EXACT, 0.0, key), o, H200)

    d = saving(tuned)  # its own record measured torch's fused op the fastest form
    assert (d.variant, d.source, d.tuned_key) == ("torch_fused", FALLBACK, tuned)
    d = saving(near)  # its record names no form: the nearest record's (M=4096)
    assert (d.variant, d.tuned_key) == ("torch_fused", tuned)
    d = saving(alone)  # nothing known near it: the baseline
    assert (d.variant, d.source, d.tuned_key) == ("bsp", FALLBACK, None)
    symm_mem_here.setenv(_symm_backend.ENV, "nccl")  # torch's op cannot run here: the baseline
    assert saving(tuned).variant == "bsp"
    push = Decision("push", {"BLOCK_M": 128}, EXACT, 0.0, tuned)
    assert saving_decision(table, tuned, push, o, H200) is push  # a winner that saves serves every call
    ce = Decision("copy_engine", {}, EXACT, 0.0, tuned)
    assert o.variants["copy_engine"].saves_for_backward()  # its inbox holds every shard: it hands A out
    assert saving_decision(table, tuned, ce, o, H200) is ce
