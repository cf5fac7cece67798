"""``ce_local_rest`` on N ranks emulated on CPU (the host transport of
:mod:`autotaxer.testing.ce_persistent`: copies by ``memmove``, memop tokens, streams as no-ops), through the
variant's own ``run``: the output of every rank against fp32 at 3, 4 and 8 ranks, two calls with every
result kept, outputs and inboxes poisoned with NaN (an inbox once its rank told the peers it is free, as a
peer's next call may overwrite it), both B layouts; the rotated inbox slots and the runs of ``out``; the
variant's pruning. Calls run in phases (every rank's sends, then every rank's GEMMs). (The copies on the
copy engine need GPUs: ``tests/ops/test_ag_gemm_gpu.py``.)"""

from __future__ import annotations

import contextlib

import pytest
import torch

from autotaxer import ProblemKey
from autotaxer._target import Target
from autotaxer.ops import get_op, iter_grid, relative_error
from autotaxer.testing.ce_persistent import HostChannel, host_transport, host_workspaces

H200 = Target(gpu_model="nvidia-h200", arch="sm_90", num_sms=132, device_type="cuda")
N = 24


def _key(ws: int, m: int, k: int, gd: int = 0, b_layout: str = "kn") -> ProblemKey:
    return ProblemKey.make("ag_gemm", "nvidia-h200", ws, "bf16", {"M": m, "N": N, "K": k},
                           {"gather_dim": gd, "b_layout": b_layout})  # fmt: skip


@contextlib.contextmanager
def _phases(inboxes: list[torch.Tensor]):
    """Sends are made by the test before the calls (the module's ``_send`` a no-op inside them);
    ``join_lanes`` then poisons the rank's inbox, which its peers may overwrite from that point on."""
    import autotaxer.kernels.ag_gemm.experimental.ce_local_rest as lr

    send, join = lr._send, lr.join_lanes

    def join_then_poison(ch, remote_done, main, lanes):
        join(ch, remote_done, main, lanes)
        inboxes[ch.rank].fill_(float("nan"))

    lr._send = lambda *args: None
    lr.join_lanes = join_then_poison
    try:
        yield send
    finally:
        lr._send, lr.join_lanes = send, join


def _calls(ws: int, streams: int, b_layout: str = "kn", calls: int = 2) -> list[str]:
    """``calls`` calls on ``ws`` emulated ranks; the failures found (empty: every output right, after the
    last call too)."""
    from autotaxer.kernels.ag_gemm.experimental.ce_local_rest import make_rest_plan

    variant = get_op("ag_gemm").variants["ce_local_rest"]
    rows, k = 8, 16
    m = rows * ws
    key = _key(ws, m, k, b_layout=b_layout)
    params = {"streams": streams, "signal": "memop"}
    valid = {**params, "signal": "triton"}  # memop's check asks for a GPU; the host transport emulates it
    assert variant.check(key, H200, valid) is None, variant.check(key, H200, valid)
    dtype = torch.bfloat16
    ranks: list[HostChannel] = []
    ranks.extend(HostChannel(r, ws, ranks, ws * rows * k * 2, "memop") for r in range(ws))
    plans = [make_rest_plan(ch, m=m, n=N, k=k, elem=2, dtype=dtype, streams=streams) for ch in ranks]
    workspaces = host_workspaces(key, params, ranks, plans, dtype)
    inboxes = [w.buffers["inbox"] for w in workspaces]
    gen = torch.Generator().manual_seed(ws * 10 + streams)
    kept, failures = [], []
    with host_transport(), _phases(inboxes) as send:
        for call in range(calls):
            shards = [torch.randn(rows, k, generator=gen).to(dtype) for _ in ranks]
            b_kn = torch.randn(k, N, generator=gen).to(dtype)
            b = b_kn if b_layout == "kn" else b_kn.t().contiguous().t()  # nk: the weight's transpose
            for ch, w, shard in zip(ranks, workspaces, shards, strict=True):
                plan = w.buffers["plan"]
                for lane in plan.lanes:
                    send(ch, plan, shard, lane, None)
            ref = torch.cat(shards).float() @ b_kn.float()
            for r, w in enumerate(workspaces):
                out = torch.full((m, N), float("nan"), dtype=dtype)
                c = variant.run(w, (shards[r], b), None, out=out)
                kept.append((call, r, ref, c))
    for call, r, ref, c in kept:
        if not relative_error(c, ref) < 1e-2:
            failures.append(f"call {call} rank {r}: output error {relative_error(c, ref)}")
    return failures


@pytest.mark.parametrize(("ws", "streams"), [(3, 2), (3, 1), (4, 4), (4, 2), (8, 8), (8, 1)])
def test_every_rank_gets_the_product_over_two_calls(ws: int, streams: int) -> None:
    assert _calls(ws, streams) == []


def test_the_weights_transpose_is_multiplied_too() -> None:
    assert _calls(4, 2, b_layout="nk") == []


def test_a_shard_written_to_its_natural_slot_fails_on_the_middle_ranks(monkeypatch) -> None:
    """The check can fail: with the sender's own rank as the slot (``copy_engine``'s inboxes) the peers'
    rows are no longer in arrival order, and the middle ranks' products come out wrong."""
    import autotaxer.kernels.ag_gemm.experimental.ce_local_rest as lr

    monkeypatch.setattr(lr, "rotated_slot", lambda sender, receiver, ws: sender)
    failures = _calls(4, 2, calls=1)
    assert {f.split(":")[0] for f in failures} >= {"call 0 rank 1", "call 0 rank 2"}


@pytest.mark.parametrize("ws", [3, 4, 5, 8])
def test_each_inbox_holds_its_peers_in_arrival_order_and_the_runs_cover_their_rows(ws: int) -> None:
    from autotaxer.kernels.ag_gemm.experimental.ce_local_rest import out_runs, rotated_slot
    from autotaxer.kernels.common.channel import peer_order

    rows = 4
    for receiver in range(ws):
        peers = peer_order(receiver, ws, "rotated")
        assert [rotated_slot(p, receiver, ws) for p in peers] == list(range(ws - 1))
        runs = out_runs(receiver, ws, rows)
        assert len(runs) == (1 if receiver in (0, ws - 1) else 2)
        covered = [row for first, count in runs for row in range(first, first + count)]
        assert covered == [row for p in peers for row in range(p * rows, (p + 1) * rows)]


def test_only_the_middle_ranks_get_a_scratch() -> None:
    from autotaxer.kernels.ag_gemm.experimental.ce_local_rest import make_rest_plan

    ranks: list[HostChannel] = []
    ranks.extend(HostChannel(r, 4, ranks, 4 * 8 * 16 * 2, "memop") for r in range(4))
    plans = [make_rest_plan(ch, m=32, n=N, k=16, elem=2, dtype=torch.bfloat16, streams=2) for ch in ranks]
    assert [p.scratch is not None for p in plans] == [False, True, True, False]
    assert all(tuple(p.scratch.shape) == (24, N) for p in plans[1:3])
    assert [len(p.lanes) for p in plans] == [2, 2, 2, 2]


def test_the_variant_prunes_what_it_cannot_run() -> None:
    variant = get_op("ag_gemm").variants["ce_local_rest"]
    assert variant.experimental
    ok = {"streams": 2, "signal": "triton"}
    assert "at least 3 ranks" in variant.check(_key(2, 16, 16), H200, ok)
    assert "gather_dim=0" in variant.check(_key(4, 16, 16, gd=1), H200, ok)
    assert "missing parameters: signal" in variant.check(_key(4, 32, 16), H200, {"streams": 2})
    assert variant.check(_key(4, 32, 16), H200, {**ok, "streams": 8}) is not None  # 3 peers: 4 streams do
    assert "fp32" in variant.check(
        ProblemKey.make("ag_gemm", "nvidia-h200", 4, "fp32", {"M": 32, "N": N, "K": 16},
                        {"gather_dim": 0, "b_layout": "kn"}), H200, ok)  # fmt: skip
    key = _key(8, 64, 16)
    valid = [p for p in iter_grid(variant.search_space(key, H200)) if variant.check(key, H200, p) is None]
    assert {p["streams"] for p in valid} == {1, 2, 4, 8}  # memop's check asks for a GPU: triton here
    seeds = variant.seed_configs(key, H200)
    assert [(s["streams"], s["signal"]) for s in seeds] == [(8, "memop"), (4, "memop"), (8, "triton")]
    assert all({**s, "signal": "triton"} in valid for s in seeds)
