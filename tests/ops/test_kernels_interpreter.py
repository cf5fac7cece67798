"""The pull and push kernels (and the persistent GEMM) under Triton's interpreter, on CPU. The checks run in
one process with ``TRITON_INTERPRET=1`` set before Triton is imported (the ``interpreter_worker`` fixture).
Ranks are emulated in one process (``autotaxer.tools.emulated_ranks``): one byte buffer per rank is its
symmetric heap (``heap_bases`` = their addresses), buffers carved at the same offsets on every rank. Programs
run one after another, so every rank's producers are launched before any rank's consumers. Several calls run
on one set of flags with fresh inputs and NaN-poisoned outputs and no reset: a consumer that read the wrong
parity slot, or a device epoch that did not advance, gives a wrong result or fails the arrival check."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import pytest

from autotaxer.testing.interpreter import InterpreterWorker

_PRELUDE = textwrap.dedent(
    """
    import torch

    from autotaxer.kernels.ag_gemm.fused import FusedConfig
    from autotaxer.kernels.ag_gemm.push_tma import tma_ready
    from autotaxer.ops.ag_gemm._emulated import check_ag_gemm, grid_and_tiles


    def check(*args, **kwargs):
        print(check_ag_gemm(*args, **kwargs))


    def tiles_and_grid(m, n, cfg, num_sms=4):
        return grid_and_tiles(m, n, cfg, num_sms)
    """
)


@pytest.fixture
def interpret(interpreter_worker: InterpreterWorker) -> Callable[..., str]:
    """``interpret(body, timeout=...)``: what ``body`` (after the prelude) printed in the interpreter."""
    return lambda body, timeout=240.0: interpreter_worker.run(
        _PRELUDE + textwrap.dedent(body), timeout=timeout
    )


SMALL = (
    "FusedConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2, comm_sms=2,"
    " row_chunks={rc}, k_chunks={kc})"
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pull", "push"])
@pytest.mark.parametrize("gather_dim", [0, 1])
def test_two_ranks_several_calls(kind: str, gather_dim: int, interpret: Callable[..., str]) -> None:
    # gather_dim=0: 12-row shards straddle 16-row tiles; K=40 is not a multiple of BLOCK_K.
    # gather_dim=1: Ks=20 is not a multiple of BLOCK_K; N=40 not a multiple of BLOCK_N.
    m, k = (24, 40) if gather_dim == 0 else (20, 40)
    out = interpret(
        f"""
        check({kind!r}, 2, {gather_dim}, {m}, 40, {k}, {SMALL.format(rc=2, kc=2)})
        cfg = {SMALL.format(rc=1, kc=1)}
        check({kind!r}, 2, {gather_dim}, {m}, 40, {k}, cfg, calls=2, dtype=torch.float16)
        """
    )
    assert out.count("OK") == 2


@pytest.mark.parametrize("kind", ["pull", "push"])
def test_counters_past_32_bits(kind: str, interpret: Callable[..., str]) -> None:
    # The sync words only grow. One dedicated producer: 4 tiles + 1 producer = 5 queue draws per call,
    # started one draw short of 2**32, so the low 32 bits wrap in the first call, with 3.4e9 arrivals
    # (past int32). Every program producing: no draws, 2**32 arrivals and more.
    out = interpret(
        f"""
        cfg = FusedConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2,
                          comm_sms=1, row_chunks=2, k_chunks=2)
        grid, tiles = tiles_and_grid(24, 40, cfg)
        per_call = tiles + cfg.comm_sms
        first = (-pow(per_call, -1, 2**32)) % 2**32 + 1  # (first - 1) * per_call = 2**32 - 1 (mod 2**32)
        assert per_call == 5 and first < 2**31 and (first - 1) * grid > 2**31, (per_call, first)
        check({kind!r}, 2, 0, 24, 40, 40, cfg, calls=2, first_epoch=first)
        cfg0 = FusedConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2,
                           comm_sms=0, row_chunks=2, k_chunks=2)
        check({kind!r}, 2, 1, 20, 40, 40, cfg0, calls=2, first_epoch=2**30 + 3)
        """
    )
    assert out.count("OK") == 2


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pull", "push"])
def test_three_ranks_both_layouts(kind: str, interpret: Callable[..., str]) -> None:
    out = interpret(
        f"""
        check({kind!r}, 3, 0, 36, 40, 48, {SMALL.format(rc=2, kc=2)}, calls=2)
        check({kind!r}, 3, 1, 20, 40, 48, {SMALL.format(rc=1, kc=2)}, calls=2)
        """
    )
    assert out.count("OK") == 2


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pull", "push"])
@pytest.mark.emulated
@pytest.mark.parametrize("world_size", [4, 8], ids=lambda ws: f"ws{ws}")
def test_four_and_eight_ranks_both_layouts(kind: str, world_size: int, interpret: Callable[..., str]) -> None:
    """The flag layout (one slot per source rank and chunk), the inbox (one slot per rank) and the
    producer loop over peers at the world sizes of issue 6; gather_dim=0 shards of 5 rows straddle the
    16-row tiles, gather_dim=1 K shards of 8 columns are half a K block."""
    ws = world_size
    out = interpret(
        f"""
        check({kind!r}, {ws}, 0, {5 * ws}, 40, 24, {SMALL.format(rc=2, kc=2)}, calls=2)
        check({kind!r}, {ws}, 1, 20, 40, {8 * ws}, {SMALL.format(rc=1, kc=2)}, calls=2)
        """,
        timeout=600.0,
    )
    assert out.count("OK") == 2


@pytest.mark.slow
@pytest.mark.emulated
@pytest.mark.parametrize("world_size", [4, 8], ids=lambda ws: f"ws{ws}")
@pytest.mark.parametrize("schedule", ["push_order", "release_each", "all"])
def test_many_peer_schedules(world_size: int, schedule: str, interpret: Callable[..., str]) -> None:
    """push's many-peer schedule (issue 26): peers in the order they read the shard (``push_order``), each
    peer's flag released after its copy (``release_each``), gather_dim=0 tiles grouped over the gathered M
    (``group_across``; 16-row shards, one tile row each, grouped 4 at a time across ranks), dedicated
    producers and every program producing; right results, the flag and inbox contents of every call."""
    ws = world_size
    extra = {"push_order": "push_order=1", "release_each": "release_each=1"}.get(
        schedule, "push_order=1, release_each=1"
    )
    cfg = SMALL.format(rc=1, kc=2).replace("group_m=2", "group_m=4").rstrip(")") + f", {extra})"
    across = cfg.rstrip(")") + ", group_across=1)"
    out = interpret(
        f"""
        check("push", {ws}, 0, {16 * ws}, 40, 24, {across}, calls=2)
        check("push", {ws}, 1, 20, 40, {8 * ws}, {cfg}, calls=2)
        check("push", {ws}, 0, {5 * ws}, 40, 24, {across.replace("comm_sms=2", "comm_sms=0")}, calls=2)
        """,
        timeout=600.0,
    )
    assert out.count("OK") == 3


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pull", "push"])
def test_every_program_produces_its_share(kind: str, interpret: Callable[..., str]) -> None:
    """comm_sms=0: no dedicated producers; each program of the GEMM's grid (here 4) moves chunks
    ``i % grid`` (6 chunks: some programs move two), then runs its tiles, each waiting for every K
    chunk of the peers' rows before one K loop (K=40 is not a multiple of BLOCK_K)."""
    cfg = SMALL.format(rc=2, kc=3).replace("comm_sms=2", "comm_sms=0")
    out = interpret(
        f"""
        cfg = {cfg}
        check({kind!r}, 2, 0, 24, 40, 40, cfg)
        check({kind!r}, 2, 1, 20, 40, 96, cfg, calls=2, dtype=torch.float16)
        check({kind!r}, 3, 0, 36, 40, 40, cfg, calls=2)
        """
    )
    assert out.count("OK") == 3


def test_persistent_gemm_in_interpreter(interpret: Callable[..., str]) -> None:
    out = interpret(
        """
        from autotaxer.kernels.common.gemm import GemmConfig, gemm

        for m, n, k in [(40, 72, 96), (33, 50, 70)]:
            a, b = torch.randn(m, k), torch.randn(k, n)
            o = torch.full((m, n), float("nan"))
            gemm(a, b, o, GemmConfig(block_m=16, block_n=32, block_k=32, group_m=2, num_programs=3))
            assert torch.allclose(o, a @ b, atol=1e-4, rtol=1e-4), (m, n, k)
        print("OK")
        """
    )
    assert "OK" in out


def test_pull_refuses_push_only_schedules(interpret: Callable[..., str]) -> None:
    out = interpret(
        """
        cfg = FusedConfig(block_m=16, block_n=32, block_k=16, comm_sms=2, push_order=1)
        try:
            check("pull", 4, 0, 64, 40, 24, cfg, calls=1)
        except ValueError as exc:
            print("refused:", exc)
        """
    )
    assert "refused: push_order, release_each: push's transport only" in out


def test_configs_reject_bad_fields() -> None:
    from autotaxer.kernels.ag_gemm.fused import FusedConfig
    from autotaxer.kernels.common.tiles import chunk_geometry

    with pytest.raises(ValueError, match="block_n"):
        FusedConfig(block_n=96).validate()
    with pytest.raises(ValueError, match="comm_sms"):
        FusedConfig(comm_sms=-1).validate()
    FusedConfig(comm_sms=0).validate()  # every program produces its share
    geo = chunk_geometry(10, 100, 4, 3, 16)
    assert (geo.row_width, geo.n_row, geo.col_width, geo.n_col) == (3, 4, 48, 3)


TMA = (
    "FusedConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2, comm_sms={c},"
    " row_chunks=2, k_chunks={kc})"
)


@pytest.mark.slow
def test_push_tma_both_layouts_and_schedules(interpret: Callable[..., str]) -> None:
    """``push_tma``'s kernel (TMA loads in the GEMM, descriptors made per tile on the device): gather_dim=0
    shards of 16 rows (tiles never straddle two ranks), K=40 and N=40 ragged (the descriptors zero-fill),
    gather_dim=1 slices of Ks=24 and 20 columns (a ragged slice must not read the next one's B rows);
    dedicated producers and every program producing; 2 and 3 ranks; B row- and column-major. (fp32 and
    fp16: the interpreter of triton 3.9 computes bf16 dots of descriptor loads wrongly.)"""
    out = interpret(
        f"""
        check("push_tma", 2, 0, 32, 40, 40, {TMA.format(c=2, kc=2)})
        check("push_tma", 2, 1, 20, 40, 48, {TMA.format(c=0, kc=2)}, calls=2, dtype=torch.float16)
        check("push_tma", 3, 0, 48, 40, 40, {TMA.format(c=0, kc=3)}, calls=2, b_t=True)
        check("push_tma", 3, 1, 20, 40, 60, {TMA.format(c=2, kc=1)}, calls=2, b_t=True)
        """,
        timeout=600.0,
    )
    assert out.count("OK") == 4


def test_push_tma_falls_back_to_push_where_tma_cannot_address(interpret: Callable[..., str]) -> None:
    """Tiles straddling two ranks' rows, or a shard off 16 bytes, run ``push``'s kernel (same buffers
    and protocol), correctly; the reasons name what TMA cannot do."""
    out = interpret(
        f"""
        cfg = {TMA.format(c=2, kc=2)}
        a, b, box = torch.empty(12, 40), torch.empty(40, 40), torch.empty(2, 2, 12, 40)
        assert "straddle" in tma_ready(a, b, box, 0, cfg)
        a, box = torch.empty(16, 41)[:, 1:], torch.empty(2, 2, 16, 40)
        assert "a_shard's base" in tma_ready(a, b, box, 0, cfg)
        assert "neither stride" in tma_ready(torch.empty(16, 40), b[::2, ::2], box, 0, cfg)
        assert tma_ready(torch.empty(16, 40), b, box, 0, cfg) is None
        check("push_tma", 2, 0, 24, 40, 40, cfg, calls=2, tma=False)
        """
    )
    assert "OK" in out
