"""The first shape of a run is timed like every other: BSP's time at a shape does not depend on where
the shape stands in the shapes file (issue: the first shape's BSP read 22-38 ms, 1.0 ms when third)."""

from __future__ import annotations

import statistics

from autotaxer import ProblemKey
from autotaxer.measure import TimingConfig
from autotaxer.tuner.group import SpawnedGroup
from autotaxer.tuner.worker import TrialRequest

#: A warm-up-inflated first measurement read 17-40x the later ones (the issue: 22-38x); on a 2-core
#: machine shared with other jobs the medians of one shape move up to ~3.5x between trials.
TOLERANCE = 6.0


def _bsp(m: int, n: int, k: int) -> TrialRequest:
    key = ProblemKey.make("ag_gemm", "cpu", 2, "fp32", {"M": m, "N": n, "K": k}, {"gather_dim": 0})
    # ~100 calls: a trial outlasts a hiccup of the machine
    timing = TimingConfig(mode="eager", warmup=1, iters=5, samples=15)
    return TrialRequest("ag_gemm", key, "bsp", {}, seed=0, timing=timing)


def test_bsp_time_does_not_depend_on_the_shape_position() -> None:
    """The shapes of ``examples/shapes_cpu.csv`` on the tuner's worker group, M=64 first, then after the
    others three more times: the first time is within TOLERANCE of the later ones' median."""
    first_shape, others = _bsp(64, 256, 256), [_bsp(512, 256, 512), _bsp(256, 512, 256)]
    with SpawnedGroup(2, "cpu") as group:
        times = []
        for req in [first_shape, *others, first_shape, first_shape, first_shape]:
            replies = group.run(req, timeout_s=120)
            assert all(r.error is None for r in replies), [r.error for r in replies]
            times.append(replies[0].median_us)
    first, later = times[0], statistics.median(times[-3:])
    assert first < TOLERANCE * later, f"first {first:.0f} µs, later {times[-3:]} µs"
