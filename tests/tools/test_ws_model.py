"""``push_ws_fwd``'s waits on two ranks modelled on CPU (:mod:`autotaxer.tools.ws_model`): the hang of issue
35 (M=256, N=640, K=512, gather_dim=1, the variant's first seed) reproduced with the forward warp's release
rule as it was, and gone with the kernel's rule; no configuration the launcher serves deadlocks."""

from __future__ import annotations

import itertools

import pytest
from autotaxer.kernels.ag_gemm.experimental.ws import WsConfig

from autotaxer.tools.ws_model import WsProblem, run_forward


def _old_rule(pending, pending_it, it, mine, peer_step, release_after):
    """The rule before issue 35, decided after the step's ``ready`` wait: before the next store or after
    ``release_after`` steps, never because the step reads a peer's data."""
    return (pending >= 0) & (mine | (it - pending_it >= release_after))


HANG = WsProblem(256, 640, 512, 1, WsConfig(block_n=128, stages=5, group_m=8))


@pytest.mark.emulated
def test_old_release_rule_deadlocks_at_the_two_gpu_hang() -> None:
    outcome = run_forward(HANG, release_due=_old_rule, after_wait=True)
    assert outcome.deadlock
    # both ranks' load warps wait for the other's first box, whose forward warp holds it
    assert any("rank 0" in s and "flags of rank 1" in s for s in outcome.stuck), outcome.stuck
    assert any("rank 1" in s and "flags of rank 0" in s for s in outcome.stuck), outcome.stuck
    assert any("holding box 0" in s for s in outcome.stuck), outcome.stuck


@pytest.mark.emulated
@pytest.mark.parametrize("seed", [None, 1, 2])
def test_push_ws_fwd_gather_dim_1_small_k_completes_with_the_kernels_rule(seed) -> None:
    """The reproduction of the 2-GPU hang, with the kernel's own ``_release_due``: every partition of
    every CTA on both ranks ends, whatever order they run in."""
    outcome = run_forward(HANG, seed=seed)
    assert not outcome.deadlock, str(outcome)


@pytest.mark.emulated
def test_old_rule_still_matches_what_ran_on_gpus() -> None:
    """The model agrees with the GPUs on the configurations that ran before the fix: the shipped 2xH200
    record (gather_dim=1, M=512, N=K=8192, 128x256 tiles) and the one-GPU test cases completed."""
    for problem in (
        WsProblem(512, 8192, 8192, 1, WsConfig(block_n=256, stages=4)),
        WsProblem(256, 4096, 8192, 1, num_sms=66),
        WsProblem(8, 4096, 4000, 1, WsConfig(block_n=128, stages=4, group_m=1), num_sms=66),
        WsProblem(256, 640, 512, 0),
    ):
        assert not run_forward(problem, release_due=_old_rule, after_wait=True).deadlock, problem


@pytest.mark.emulated
def test_no_served_configuration_deadlocks() -> None:
    """Small K slices (1-6 steps), ragged edges, both layouts, every seed tile shape and group size the
    variant's space holds, one and several waves: each call the launcher would forward completes."""
    served = 0
    shapes = [(256, 640, 512), (128, 384, 256), (200, 1000, 640), (512, 256, 128), (1024, 512, 768)]
    for (m, n, k), gd, bn, stages, group_m in itertools.product(shapes, (0, 1), (128, 256), (3, 5), (8, 1)):
        problem = WsProblem(m, n, k, gd, WsConfig(block_n=bn, stages=stages, group_m=group_m), num_sms=8)
        try:
            outcome = run_forward(problem)
        except ValueError:  # the launcher refuses it (gather_dim=1 over more than one wave)
            continue
        served += 1
        assert not outcome.deadlock, f"{problem}: {outcome}"
    assert served >= 40


def test_refuses_what_the_launcher_refuses() -> None:
    with pytest.raises(ValueError, match="one wave"):
        run_forward(WsProblem(512, 8192, 8192, 1))
