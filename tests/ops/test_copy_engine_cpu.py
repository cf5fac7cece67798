"""``copy_engine``'s schedule on N ranks emulated on CPU (the host transport of
:mod:`autotaxer.testing.ce_persistent`: copies by ``memmove``, memop tokens, streams as no-ops), through
the variant's own ``run`` and ``run_for_backward``: the output against fp32 and the gathered A it hands
out against the shards, for both gather dims, chunked, reversed and ``gather_first``, every rank, two
calls with every result kept (fp32 accumulation: GPU only). Calls run in phases (every rank's sends,
then every rank's GEMMs). Once a rank tells its peers its inbox is free, the stand-in overwrites that
inbox with NaN, as a peer's next call may: a hand-out copied after that point fails. (The copies on the
copy engine need GPUs: ``tests/ops/test_copy_engine_gpu.py``.)"""

from __future__ import annotations

import contextlib

import pytest
import torch

from autotaxer import ProblemKey
from autotaxer._target import Target
from autotaxer.ops import get_op, relative_error
from autotaxer.testing.ce_persistent import HostChannel, host_transport, host_workspaces

H200 = Target(gpu_model="nvidia-h200", arch="sm_90", num_sms=132, device_type="cuda")
N = 24


def _key(ws: int, gd: int, m: int, k: int) -> ProblemKey:
    return ProblemKey.make("ag_gemm", "nvidia-h200", ws, "bf16", {"M": m, "N": N, "K": k},
                           {"gather_dim": gd, "b_layout": "kn"})  # fmt: skip


@contextlib.contextmanager
def _phases(inboxes: list[torch.Tensor], late: list):
    """Sends are made by the test before the calls (``_send`` a no-op inside them); ``join_lanes`` then
    poisons the rank's inbox, which its peers may overwrite from that point on, and runs what ``late``
    holds (the planted bug's hand-outs)."""
    import autotaxer.kernels.ag_gemm.copy_engine as ce

    send, join = ce._send, ce.join_lanes

    def join_then_poison(ch, remote_done, main, lanes):
        join(ch, remote_done, main, lanes)
        inboxes[ch.rank].fill_(float("nan"))
        while late:
            late.pop()()

    ce._send = lambda ch, plan, a_shard: None
    ce.join_lanes = join_then_poison
    try:
        yield send
    finally:
        ce._send, ce.join_lanes = send, join


def _calls(
    ws: int, gd: int, params: dict, saving: bool, calls: int = 2, late: list | None = None
) -> list[str]:
    """``calls`` calls on ``ws`` emulated ranks; the failures found (empty: every output and gathered A
    right, after the last call too)."""
    from autotaxer.kernels.ag_gemm.copy_engine import make_plan

    variant = get_op("ag_gemm").variants["copy_engine"]
    m, k = (8 * ws, 16) if gd == 0 else (12, 8 * ws)
    key = _key(ws, gd, m, k)
    valid = {**params, "signal": "triton"}  # memop's check asks for a GPU; the host transport emulates it
    assert variant.check(key, H200, valid) is None, variant.check(key, H200, valid)
    rows, ks = (m // ws, k) if gd == 0 else (m, k // ws)
    dtype = torch.bfloat16
    ranks: list[HostChannel] = []
    ranks.extend(HostChannel(r, ws, ranks, ws * rows * ks * 2, "memop") for r in range(ws))
    plans = [
        make_plan(
            ch,
            m=m,
            k=k,
            gather_dim=gd,
            elem=2,
            chunks=params["chunks"],
            order=params["order"],
            gather_first=params["gather_first"],
            fp32_accumulate=params["accumulate"] == "fp32",
        )  # fmt: skip
        for ch in ranks
    ]
    workspaces = host_workspaces(key, params, ranks, plans, dtype)
    for w in workspaces:
        if params["accumulate"] == "fp32":
            w.buffers["acc"] = torch.empty((m, N), dtype=torch.float32)
    inboxes = [w.buffers["inbox"] for w in workspaces]
    gen = torch.Generator().manual_seed(ws * 10 + gd)
    kept, failures = [], []
    with host_transport(), _phases(inboxes, late if late is not None else []) as send:
        for call in range(calls):
            shards = [torch.randn(rows, ks, generator=gen).to(dtype) for _ in ranks]
            b = torch.randn(k, N, generator=gen).to(dtype)
            for ch, w, shard in zip(ranks, workspaces, shards, strict=True):
                send(ch, w.buffers["plan"], shard)
            full = torch.cat(shards, dim=gd)
            for r, w in enumerate(workspaces):
                if saving:
                    c, gathered = variant.run_for_backward(w, (shards[r], b), None)
                else:
                    c, gathered = variant.run(w, (shards[r], b), None), None
                kept.append((call, r, full, full.float() @ b.float(), c, gathered))
    for call, r, full, ref, c, gathered in kept:
        if not relative_error(c, ref) < 1e-2:
            failures.append(f"call {call} rank {r}: output error {relative_error(c, ref)}")
        if saving and not torch.equal(gathered, full):
            failures.append(f"call {call} rank {r}: gathered A differs (NaN: {bool(gathered.isnan().any())})")
    return failures


_BASE = {"signal": "memop", "order": "rotated", "gather_first": False, "accumulate": "out", "chunks": 1}
CASES = [
    (0, _BASE),
    (0, {**_BASE, "chunks": 3}),
    (0, {**_BASE, "gather_first": True}),
    (0, {**_BASE, "order": "reverse", "chunks": 2}),
    (1, _BASE),
    (1, {**_BASE, "chunks": 3}),
]  # accumulate=fp32 calls torch.mm(out_dtype=): CUDA only (the GPU test covers it)


@pytest.mark.parametrize("ws", [2, 4])
@pytest.mark.parametrize(("gd", "params"), CASES)
def test_run_for_backward_hands_out_the_gathered_a_before_the_inbox_is_freed(ws: int, gd: int, params: dict):
    assert _calls(ws, gd, params, saving=True) == []


@pytest.mark.parametrize(("gd", "params"), CASES[:1] + CASES[4:5])
def test_run_alone_is_the_schedule_it_always_was(gd: int, params: dict):
    """Without the hand-out the output is the same product (and nothing is copied out of the inbox)."""
    assert _calls(3, gd, params, saving=False) == []


def test_the_hand_out_caught_after_the_inbox_is_freed_fails(monkeypatch):
    """The check can fail: a hand-out made after the peers were told the inbox is free."""
    import autotaxer.kernels.ag_gemm.copy_engine as ce

    hand_out, late = ce.hand_out, []
    monkeypatch.setattr(ce, "hand_out", lambda *args: late.append(lambda: hand_out(*args)))
    failures = _calls(2, 0, _BASE, saving=True, calls=1, late=late)
    assert len(failures) == 2 and all("gathered A differs (NaN: True)" in f for f in failures)


def test_only_the_copy_engine_schedule_hands_out_the_gathered_a():
    op = get_op("ag_gemm")
    assert op.variants["copy_engine"].saves_for_backward()
    for name in ("ce_fanout", "ce_grouped"):  # their own launchers take no gathered=
        assert not op.variants[name].saves_for_backward()
        assert op.variants[name].run_for_backward(None, (), None) is None
