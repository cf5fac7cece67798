"""Bounded waits on one GPU (world size 1, ranks emulated: ``autotaxer.tools.emulated_ranks``): rank 0 of two
emulated ranks runs a call whose peer never does; every kind of wait gives up after the bound, the kernel
ends, and ``autotaxer.check()`` names op, variant, key and rank 1. Then the same GPU still computes."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.emulated]


@pytest.mark.parametrize("kind", ["push", "pull", "gemm_rs", "flash_decode", "signal"])
def test_never_signal_on_one_gpu_ends_with_the_named_error(kind: str) -> None:
    import torch

    from autotaxer.tools.emulated_ranks import never_signal

    exc = never_signal(kind, device="cuda", timeout_s=0.5)
    f = exc.failure
    assert f.peer == 1 and f.site.rank == 0 and "rank 1, which never signalled" in str(exc), str(exc)
    assert f"{f.site.op} {f.site.variant} at {f.site.key}" in str(exc)
    x = torch.ones(64, device="cuda")
    assert float((x @ x).item()) == 64.0  # the device is fine after the kernel gave up


def test_never_signal_memop_token_wait_on_one_gpu() -> None:
    """The copy-engine ``memop`` back end's wait for a token (a bounded spin kernel, where
    ``cuStreamWaitValue32`` had no timeout)."""
    import torch
    from autotaxer.kernels.common import signal as sig

    import autotaxer
    from autotaxer import ProblemKey
    from autotaxer._target import cuda_target
    from autotaxer.ops import RunContext

    ctx = RunContext(rank=0, world_size=2, device=torch.device("cuda", 0), target=cuda_target(0),
                     peer_timeout_s=0.5, first_call_timeout_s=0.5)  # fmt: skip
    key = ProblemKey.make(
        "ag_gemm", ctx.target.gpu_model, 2, "bf16", {"M": 8, "N": 8, "K": 8}, {"gather_dim": 0}
    )
    slot = ctx.watch_slot(key, "copy_engine")
    flag = torch.zeros(4, dtype=torch.int32, device="cuda")
    sig.memop_wait_eq(flag[2:3].data_ptr(), 1, torch.cuda.current_stream(), slot.tensor, peer=1, index=2)
    with pytest.raises(
        autotaxer.PeerTimeoutError, match=r"copy_engine .* rank 1, which never signalled \(flag 2"
    ):
        autotaxer.check()
    flag[2] = 1  # a token that is there passes at once
    sig.memop_wait_eq(flag[2:3].data_ptr(), 1, torch.cuda.current_stream(), slot.tensor, peer=1, index=2)
    autotaxer.check()


@pytest.mark.parametrize("transport", ["sms", "forward"])
def test_never_signal_push_ws_load_warp_on_one_hopper(transport: str) -> None:
    """``push_ws``'s Gluon load warp: rank 0's consumer alone (rank 1's producers or forward warp never
    run), at the shape of the 2-GPU hang of issue 35."""
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("push_ws needs sm_90")
    from autotaxer.kernels.ag_gemm.experimental.push_ws import PushWsCall
    from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, FusedConfig, flags_count, geometry, inbox_shape
    from autotaxer.kernels.common.gemm import num_sms

    import autotaxer
    from autotaxer import ProblemKey
    from autotaxer._target import cuda_target
    from autotaxer.ops import RunContext

    m, n, k = 256, 640, 512
    ms, ks = m, k // 2
    comm = 0 if transport == "forward" else 4
    config = FusedConfig(128, 128, 64, 8, 8, 5, comm, 2, 4, 0)
    ctx = RunContext(rank=0, world_size=2, device=torch.device("cuda", 0), target=cuda_target(0),
                     peer_timeout_s=0.5, first_call_timeout_s=0.5)  # fmt: skip
    key = ProblemKey.make(
        "ag_gemm", ctx.target.gpu_model, 2, "bf16", {"M": m, "N": n, "K": k}, {"gather_dim": 1}
    )
    slot = ctx.watch_slot(key, "push_ws_fwd" if transport == "forward" else "push_ws")
    dt = torch.bfloat16
    heaps = [torch.zeros(1 << 22, dtype=torch.uint8, device="cuda") for _ in range(2)]
    elems = 2 * 2 * ms * ks
    inbox = heaps[0][: elems * 2].view(dt).view(inbox_shape(ms, ks, 2))
    flags = heaps[0][elems * 2 :].view(torch.int32)[: flags_count(geometry(config, ms, ks), 2)]
    bases = torch.tensor([h.data_ptr() for h in heaps], dtype=torch.int64, device="cuda")
    a, b = torch.randn(ms, ks, device="cuda", dtype=dt), torch.randn(k, n, device="cuda", dtype=dt)
    out = torch.empty(m, n, device="cuda", dtype=dt)
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int64, device="cuda")
    call = PushWsCall(a_shard=a, b=b, out=out, inbox=inbox, flags=flags, sync=sync, heap_bases=bases, rank=0,
                      world_size=2, gather_dim=1, config=config, num_sms=num_sms(torch.device("cuda")),
                      transport=transport, watch=slot.tensor)  # fmt: skip
    call.count_arrivals()
    call.consumer(a, b, out)  # rank 0 only: no producer of rank 1 ever raises a flag
    with pytest.raises(autotaxer.PeerTimeoutError, match="rank 1, which never signalled"):
        autotaxer.check()


_GIVE_UP_SCRIPT = """
import json, sys
from autotaxer import ProblemKey
from autotaxer._target import cuda_target
from autotaxer.tools.emulated_ranks import give_up_calls
variant, ws = sys.argv[1], int(sys.argv[2])
key = ProblemKey.make("ag_gemm", cuda_target(0).gpu_model, ws, "bf16", {"M": 1024, "N": 2560, "K": 8192},
                      {"gather_dim": 0, "b_layout": "nk"})
print(json.dumps(give_up_calls(variant, key, calls=12)), flush=True)
"""


@pytest.mark.parametrize("variant", ["push", "push_tma", "pull"])
def test_every_call_whose_waits_give_up_ends(variant: str) -> None:
    """Rank 0 of two emulated ranks at a TP layer's key (M=1024 N=2560 K=8192, ``nn.Linear``'s weight), its
    peer never running, 12 calls with the bound 0: every call's waits give up and every call ends. Before
    the CTA took one give-up decision (``kernels.common.watch.cta_uniform``), about one call in three of
    ``push`` and ``push_tma`` hung after its record was written (1xH200, 2026-11-29)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS="32")
    try:
        proc = subprocess.run(
            [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-c", _GIVE_UP_SCRIPT, variant, "2"],
            env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"{variant}: the process did not end in 240 s (a call whose waits gave up hung)")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    gave_up = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(gave_up) == 12 and all(n > 0 for n in gave_up), gave_up
