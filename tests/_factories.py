"""Record and problem-key factories shared by the tests (not a test module)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from autotaxer import ProblemKey
from autotaxer.measure import TimingConfig
from autotaxer.records import WinnerRecord

ENV = {"autotaxer": "0.1.0", "torch": "2.13.0", "triton": "3.9.0", "iris": "0.0.1", "cuda_or_hip": "12.8"}


def make_key(m: int = 64, gpu: str = "nvidia-h200", ws: int = 2, op: str = "ag_gemm", gather_dim: int = 0):
    return ProblemKey.make(op, gpu, ws, "bf16", {"M": m, "N": 8192, "K": 8192}, {"gather_dim": gather_dim})


def rank_key(ctx, m: int, n: int, k: int, gather_dim: int, dtype: str = "fp32") -> ProblemKey:
    """An ``ag_gemm`` key on the GPU model and world size of the rank context ``ctx``."""
    return ProblemKey.make(
        "ag_gemm",
        ctx.target.gpu_model,
        ctx.world_size,
        dtype,
        {"M": m, "N": n, "K": k},
        {"gather_dim": gather_dim},
    )


def layout_keys(ctx, op: str, shape: dict[str, int], dim_field: str) -> Iterator[tuple[int, str, ProblemKey]]:
    """``(dim, b_layout, key)``: bf16 keys of ``op`` on ``ctx``'s GPU model and world size, for both values
    of the layout field ``dim_field`` (``gather_dim``, ``scatter_dim``) and both weight layouts."""
    for dim in (0, 1):
        for layout in ("kn", "nk"):
            layouts = {dim_field: dim, "b_layout": layout}
            key = ProblemKey.make(op, ctx.target.gpu_model, ctx.world_size, "bf16", shape, layouts)
            yield dim, layout, key


def on_gpus(*world_sizes: int) -> pytest.MarkDecorator:
    """Parametrize a test's ``world_size`` over ``world_sizes``, each case marked ``gpu`` for that many GPUs
    (skipped where fewer are visible), ids ``ws1``, ``ws2``, ..."""
    cases = [pytest.param(n, marks=pytest.mark.gpu(world_size=n), id=f"ws{n}") for n in world_sizes]
    return pytest.mark.parametrize("world_size", cases)


def kept_results(op, variant, ws, key: ProblemKey, ctx, seeds: tuple[int, ...] = (1, 2)) -> list[tuple]:
    """``(seed, output)`` of one call of ``variant`` (workspace ``ws``) per seed's fresh inputs, every
    output kept alive (so that a variant handing out one buffer twice shows in :func:`kept_errors`)."""
    return [(s, variant.run(ws, op.make_inputs(key, ctx.rank, ctx.device, s), ctx)) for s in seeds]


def kept_errors(op, key: ProblemKey, ctx, results: list[tuple]) -> tuple[list[float], int]:
    """After a device synchronisation: each of :func:`kept_results`' outputs' relative error against the
    op's fp32 reference of its seed, and how many distinct buffers the outputs are."""
    import torch

    from autotaxer.ops import relative_error

    torch.cuda.synchronize()
    errs = [relative_error(c, op.reference(key, ctx.rank, ctx.device, s)) for s, c in results]
    return errs, len({c.data_ptr() for _, c in results})


def attempt(fn) -> str:
    """``fn()``'s error as ``"Type: message"``, or ``"no error"`` (a misuse test compares it per rank)."""
    try:
        fn()
    except Exception as exc:  # every error is what the test looks at
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def make_record(
    m: int = 64,
    median_us: float = 10.0,
    bsp_us: float = 15.0,
    variant: str = "push",
    confirmed: bool = False,
    **key_kw,
):
    """A record of ``make_key(m, **key_kw)``; ``confirmed``: its times from a tuner's confirmation."""
    env = {**ENV, "confirmed": "interleaved"} if confirmed else dict(ENV)
    return WinnerRecord(
        key=make_key(m, **key_kw),
        variant=variant,
        params={"BLOCK_M": 128, "num_warps": 8, "local_first": True, "order": "rotated"},
        median_us=median_us,
        bsp_us=bsp_us,
        trials=40,
        arch="sm_90",
        num_sms=132,
        env=env,
        kernel_hash="abc123",
        measured_at=datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=timezone.utc),
        device_type="cuda",
    )


# -- several checks in one spawned group of CPU ranks (spawning one costs seconds) ---------------------
def by_check(per_rank: list[dict]) -> dict[str, list]:
    """``{check: results in rank order}`` from every rank's ``{check: result}``."""
    return {name: [r[name] for r in per_rank] for name in per_rank[0]}


def at_world_size(request, world_size: int, check: str, fn, args: tuple = ()) -> list:
    """Results in rank order of ``fn(ctx, *args)`` on ``world_size`` CPU ranks: at 2 ranks the ``check``
    entry of the test module's ``two_ranks`` fixture (one group that ran every check), else a new group."""
    from autotaxer.testing import run_ranks

    if world_size == 2:
        return request.getfixturevalue("two_ranks")[check]
    return run_ranks(fn, world_size, "cpu", args=args, timeout=300)


# -- the tuner in one process (tests/tuner, tests/storage) -------------------------------------------
FAST = TimingConfig(mode="eager", warmup=0, iters=1, samples=1)
KEY = ProblemKey.make("ag_gemm", "cpu", 1, "fp32", {"M": 8, "N": 4, "K": 4}, {"gather_dim": 0})


class InlineExecutor:
    """Runs each trial in this process on a world of one rank; ``requests`` lists the trials sent,
    ``confirmations`` the end-of-search confirmations (:class:`autotaxer.tuner.worker.ConfirmRequest`)."""

    launches = 0
    launch_s = 0.0

    def __init__(self) -> None:
        import torch

        from autotaxer._target import cpu_target
        from autotaxer.ops import RunContext
        from autotaxer.tuner.worker import WorkerState

        # warmed_up: these tests check the tuner's bookkeeping, not times (the process warm-up costs 0.2 s)
        cpu = torch.device("cpu")
        ctx = RunContext(rank=0, world_size=1, device=cpu, target=cpu_target(), warmed_up=True)
        self.state = WorkerState(ctx)
        self.requests: list = []
        self.confirmations: list = []

    def ensure_started(self) -> None:
        pass

    def run(self, req, timeout_s: float, on_wait=None) -> list:
        from autotaxer.tuner.worker import ConfirmRequest, execute_trial

        (self.confirmations if isinstance(req, ConfirmRequest) else self.requests).append(req)
        return [execute_trial(self.state, req)]


# -- claims raced by processes (tests/storage/test_claims.py, tests/tuner/test_tuner_postgres.py) -------
def _claim_at(url: str, key_text: str, owner: str, abandoned_owner: str, start_at: float, out) -> None:
    """One process's claim on ``key_text`` at ``start_at``, put to ``out``: ``("ok", owner, holder)``."""
    import time

    from autotaxer.storage import open_database

    try:
        db = open_database(url)
        time.sleep(max(0.0, start_at - time.time()))
        claim = db.claim(ProblemKey.from_text(key_text), owner, lambda c: c.owner == abandoned_owner)
        db.close()
        out.put(("ok", owner, claim.owner))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        out.put(("error", owner, f"{type(e).__name__}: {e}"))


def race_for_claim(url: str, key: ProblemKey, owners: list[str], abandoned_owner: str = "") -> list[tuple]:
    """Processes, one per owner, claiming ``key`` at the same moment (an owner named ``abandoned_owner``
    counts as gone): ``(status, owner, the holder it was told)`` of each."""
    import multiprocessing as mp
    import time

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0
    args = [(url, key.text, o, abandoned_owner, start_at, out) for o in owners]
    procs = [ctx.Process(target=_claim_at, args=a) for a in args]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return results
