"""``push_ws`` on one Hopper GPU: two ranks emulated
(``autotaxer.testing.push_ws_pair``), against fp32.

Rank 1's real ``push`` producers (on a side stream, optionally started late) fill rank 0's inbox while
rank 0's warp-specialised consumer runs; rank 0's output and inbox are NaN-poisoned before every call
and each call draws fresh shards, three calls in a row (epochs and both inbox parities), then a CUDA
graph of one call replayed on fresh shards. Both layouts, bf16 and fp16, ragged N and K, column-major
B, one and two MMA warpgroups. The 2-GPU run with Iris is ``test_ag_gemm_gpu.py`` (every variant).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

# ((M, N, K, gather_dim, dtype, column-major B, FusedConfig fields), transport)
ALL_CASES = [
    # push_ws: dedicated producer SMs
    ((256, 8192, 8192, 0, "bf16", False, (128, 128, 64, 8, 8, 5, 16, 4, 8, 0)), "sms"),
    ((1024, 8000, 4000, 0, "bf16", True, (128, 128, 64, 8, 4, 6, 8, 4, 2, 0)), "sms"),
    ((512, 4096, 8192, 0, "fp16", False, (128, 256, 64, 8, 8, 4, 16, 16, 8, 0)), "sms"),
    ((127, 8000, 8192, 1, "bf16", False, (128, 256, 64, 8, 8, 3, 16, 1, 4, 0)), "sms"),
    ((8, 4096, 4000, 1, "fp16", True, (128, 128, 64, 8, 4, 4, 4, 1, 2, 0)), "sms"),
    ((4096, 4096, 8192, 1, "bf16", False, (128, 128, 64, 8, 8, 5, 32, 16, 1, 0)), "sms"),
    # comm_sms=0: no producer kernel, each consumer CTA moves its share first
    ((256, 8192, 8192, 0, "bf16", False, (128, 128, 64, 8, 8, 5, 0, 16, 8, 0)), "sms"),
    ((1024, 8000, 4000, 1, "fp16", True, (128, 256, 64, 8, 8, 3, 0, 4, 4, 0)), "sms"),
    # push_ws_fwd (comm_sms=0, one flag per 128x64 box): each rank's forward warp sends the boxes its
    # local tiles load. gather_dim=0 in one wave (any tile order) and in several (local tiles first,
    # ragged N and K); gather_dim=1 in one wave (each rank's kernel has half the SMs here), ragged M, M=8,
    # a short K slice
    ((256, 4096, 8192, 0, "bf16", False, (128, 128, 64, 8, 8, 5, 0, 1, 128, 0)), "forward"),
    ((512, 4096, 8192, 0, "fp16", True, (128, 256, 64, 8, 8, 4, 0, 2, 128, 0)), "forward"),
    ((1024, 8000, 4000, 0, "bf16", True, (128, 128, 64, 8, 8, 5, 0, 4, 63, 0)), "forward"),
    ((256, 4096, 8192, 1, "bf16", False, (128, 128, 64, 8, 8, 5, 0, 2, 64, 0)), "forward"),
    ((127, 8000, 8192, 1, "bf16", True, (128, 256, 64, 8, 8, 4, 0, 1, 64, 0)), "forward"),
    ((8, 4096, 4000, 1, "fp16", False, (128, 128, 64, 1, 4, 4, 0, 1, 32, 0)), "forward"),
    # the 2-GPU hang of issue 35: a K slice of 4 steps, so each tile's last box was released only from a
    # peer step (tests/tools/test_ws_model.py reproduces it on CPU)
    ((256, 640, 512, 1, "bf16", False, (128, 128, 64, 8, 8, 5, 0, 2, 4, 0)), "forward"),
]


def _hopper() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "no GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"push_ws needs sm_90, this is sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    return None


def _case_id(c) -> str:
    return f"M{c[0]}-N{c[1]}-K{c[2]}-gd{c[3]}-{c[4]}" if isinstance(c, tuple) else c


@pytest.mark.parametrize("case, transport", ALL_CASES, ids=_case_id)
@pytest.mark.parametrize("late", [False, True], ids=["concurrent", "late_producers"])
def test_push_ws_matches_reference_on_an_emulated_pair(case, transport: str, late: bool) -> None:
    why = _hopper()
    if why:
        pytest.skip(why)
    import torch
    from autotaxer.kernels.ag_gemm.fused import FusedConfig
    from autotaxer.kernels.common.gemm import num_sms

    from autotaxer.testing.push_ws_pair import EmulatedPushPair

    m, n, k, gd, dtype, col_b, fields = case
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    sms = num_sms(torch.device("cuda"))
    pair = EmulatedPushPair(m, n, k, gd, dt, FusedConfig(*fields), sms, col_b, seed=m, transport=transport)
    delay = 2_000_000 if late else 0  # ~1 ms of GPU sleep before the producers start
    for call in range(3):
        pair.new_shards()
        pair.poison()
        pair.call(delay_cycles=delay)
        torch.cuda.synchronize()
        ref = pair.reference()
        for rank in (0, 1) if pair.in_kernel else (0,):
            err = ((pair.outs[rank].float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"call {call}, rank {rank}: relative error {err}"  # NaN fails too
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        pair.call(delay_cycles=delay)
    for replay in range(2):
        pair.new_shards()
        pair.poison()
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        ref = pair.reference()
        for rank in (0, 1) if pair.in_kernel else (0,):
            err = ((pair.outs[rank].float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, f"graph replay {replay}, rank {rank}: relative error {err}"


def test_launcher_caches_and_replays_at_one_rank() -> None:
    """``ag_gemm_push_ws`` itself (the cached call, the side stream's fork and join) at one rank, where the
    producers find no peer: eager calls on fresh inputs reuse one resolved call, calls switch to
    ``push``'s kernel and back, then a graph replays."""
    why = _hopper()
    if why:
        pytest.skip(why)
    import torch
    from autotaxer.kernels.ag_gemm.experimental.push_ws import ag_gemm_push_ws
    from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, FusedConfig, flags_count, geometry, inbox_shape

    m, n, k = 512, 4096, 4096
    config = FusedConfig(128, 256, 64, 8, 8, 4, 4, 4, 8, 0)
    dt = torch.bfloat16
    inbox = torch.empty(inbox_shape(m, k, 1), device="cuda", dtype=dt)
    flags = torch.zeros(flags_count(geometry(config, m, k), 1), device="cuda", dtype=torch.int32)
    sync = torch.zeros(SYNC_WORDS, device="cuda", dtype=torch.int64)
    heap_bases = torch.tensor([inbox.data_ptr()], device="cuda", dtype=torch.int64)
    cache: dict = {}
    a, b = torch.empty(m, k, device="cuda", dtype=dt), torch.empty(k, n, device="cuda", dtype=dt)
    out = torch.empty(m, n, device="cuda", dtype=dt)

    def call():
        ag_gemm_push_ws(
            a_shard=a, b=b, out=out, inbox=inbox, flags=flags, sync=sync, heap_bases=heap_bases, rank=0,
            world_size=1, gather_dim=0, config=config, num_sms=132, cache=cache,
        )  # fmt: skip

    def check(what: str) -> None:
        torch.cuda.synchronize()
        ref = a.float() @ b.float()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"{what}: relative error {err}"

    for i in range(3):
        a.normal_(), b.normal_(), out.fill_(float("nan"))
        call()
        check(f"call {i}")
    assert sum(1 for key in cache if isinstance(key, tuple) and key[0] == "push_ws") == 1
    # a misaligned shard (data_ptr % 16 == 2) runs push's kernel on the same buffers, then aligned again:
    # epochs and push's tile queue must stay in step across the switches (dedicated producers join the
    # GEMM through that queue)
    store = torch.empty(a.numel() + 1, device="cuda", dtype=dt)
    for i, shifted in enumerate((True, False, True, True, False)):
        a.normal_(), b.normal_(), out.fill_(float("nan"))
        if shifted:
            aligned, a = a, store[1:].view(a.shape).copy_(a)
        call()
        check(f"switch {i} ({'push' if shifted else 'push_ws'})")
        if shifted:
            a = aligned
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
        call()
    for i in range(2):
        a.normal_(), b.normal_(), out.fill_(float("nan"))
        graph.replay()
        check(f"replay {i}")
