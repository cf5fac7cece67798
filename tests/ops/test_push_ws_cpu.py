"""``push_ws`` without a GPU: its Gluon consumer compiles for sm_90 with the installed Triton, and the
variant's rules (availability, pruning, the consumer's config and tensor checks) say what they should.

The kernel itself runs only on a Hopper GPU (``tests/test_push_ws_gpu.py``): Gluon has no interpreter.
Compiling it here is what catches an API move in a newer Triton (3.6 on the lent GPUs, newer in CI).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _compile_hopper():
    from autotaxer.tools import sm90

    return sm90


@pytest.mark.parametrize(
    "gather_dim, col_b, config, produce",
    [
        (0, False, dict(block_n=256, stages=4, mma_wgs=2), False),
        (1, True, dict(block_n=128, stages=5, mma_wgs=2), False),
        (0, True, dict(block_n=128, stages=4, mma_wgs=1), False),
        (1, False, dict(block_n=256, stages=3, mma_wgs=2), True),
        (0, False, dict(block_n=256, stages=4, mma_wgs=2), "forward"),
        (1, True, dict(block_n=128, stages=5, mma_wgs=1), "forward"),
    ],
)
def test_consumer_compiles_for_hopper_warp_specialised(gather_dim: int, col_b: bool, config: dict,
                                                      produce: bool | str) -> None:  # fmt: skip
    from autotaxer.kernels.ag_gemm.experimental.ws import SMEM_LIMIT, WsConfig

    ch = _compile_hopper()
    ws = WsConfig(**config)
    # rank 1: Triton turns an integer argument equal to 1 into a constant at launch
    forward = produce == "forward"
    m = 256 if forward and gather_dim == 1 else 512  # forwarding at gather_dim=1: one wave of tiles
    fn, args, kw = ch.ws_launch(
        m, 8192, 8192, gather_dim, ws, col_b=col_b, produce=produce is True, rank=int(bool(produce)),
        forward=forward,
    )  # fmt: skip
    kernel = ch.compile_for_hopper(fn, args, kw)
    ptx = kernel.asm["ptx"]
    assert re.search(r"wgmma\.mma_async", ptx), "no wgmma: the MMA partition did not lower to Hopper MMAs"
    assert re.search(r"cp\.async\.bulk\.tensor", ptx), "no TMA load"
    assert re.search(r"setmaxnreg\.dec", ptx), "no register hand-back: the load warp is not specialised"
    # the load warp's flag poll: acquire loads at system scope
    assert re.search(r"atom\.global\.sys\.acquire\.add", ptx)
    assert "fence.proxy.async.global" in ptx  # before TMA reads what the acquires made visible
    assert ws.smem_bytes() <= kernel.metadata.shared <= SMEM_LIMIT
    # the CTAs' own share of the transfer: releases at system scope into the peers' (32-bit) flags
    assert bool(re.search(r"atom\.(global\.sys\.release|release\.sys\.global)\.exch\.b32", ptx)) == bool(
        produce
    )
    # the load warp's waits are bounded in time: the global timer, and a give-up recorded in the watch slot
    assert "%globaltimer" in ptx and re.search(r"atom\.global\.sys\.release\.exch\.b64", ptx)
    # the forward warp: TMA stores from the ring into the peer, a box's flag released only after a bulk
    # wait for its writes and a proxy fence
    assert bool(re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared", ptx)) == forward
    if forward:
        wait = ptx.index("cp.async.bulk.wait_group 0;")
        release = re.search(r"atom\.global\.sys\.release|atom\.release\.sys", ptx[wait:])
        assert release and "fence.proxy.async.global" in ptx[wait : wait + release.start()]


def test_consumer_config_and_tensor_checks_name_the_problem() -> None:
    import torch
    from autotaxer.kernels.ag_gemm.experimental.ws import WsConfig, tensors_error, ws_config_error

    assert ws_config_error(WsConfig()) is None
    assert "mma_wgs" in ws_config_error(WsConfig(mma_wgs=3))
    assert "registers" in ws_config_error(WsConfig(block_n=256, mma_wgs=1))
    assert "shared memory" in ws_config_error(WsConfig(block_n=256, stages=5))
    assert "stages" in ws_config_error(WsConfig(stages=1))
    shard, b = torch.empty(96, 1024, dtype=torch.bfloat16), torch.empty(2048, 512, dtype=torch.bfloat16)
    inbox = torch.empty(2, 2, 96, 1024, dtype=torch.bfloat16)
    assert "straddle" in tensors_error(shard, b, inbox, 0, WsConfig(block_n=128))
    assert tensors_error(shard, b, inbox, 1, WsConfig(block_n=128)) is None
    odd = torch.empty(128, 500, dtype=torch.bfloat16)  # 1000-byte rows
    assert "16 bytes" in tensors_error(
        odd, torch.empty(1000, 512, dtype=torch.bfloat16), inbox, 1, WsConfig()
    )


def test_fused_config_maps_onto_the_consumer() -> None:
    from autotaxer.kernels.ag_gemm.experimental.push_ws import ws_config
    from autotaxer.kernels.ag_gemm.fused import FusedConfig

    ws = ws_config(FusedConfig(128, 256, 64, 4, 8, 3, 4, 16, 8, 0))
    assert (ws.block_m, ws.block_n, ws.block_k, ws.group_m, ws.stages, ws.mma_wgs) == (128, 256, 64, 4, 3, 2)
    assert ws_config(FusedConfig(128, 128, 64, 8, 4, 6, 4, 4, 8, 0)).mma_wgs == 1


def test_variant_is_hopper_only_opt_in_and_prunes_what_it_cannot_run(monkeypatch) -> None:
    from autotaxer import ProblemKey
    from autotaxer._problem import Target
    from autotaxer.ops import get_op

    variant = get_op("ag_gemm").variants["push_ws"]
    assert variant.experimental, "push_ws stays opt-in until it is measured on 2 GPUs"
    hopper = Target(gpu_model="nvidia-h200", arch="sm_90", num_sms=132)
    blackwell = Target(gpu_model="nvidia-b200", arch="sm_100", num_sms=148)
    from autotaxer.ops.ag_gemm.iris_fused import PushVariant

    monkeypatch.setattr(PushVariant, "unavailable_reason", lambda self, target: None)  # Iris importable
    assert "sm_90" in variant.unavailable_reason(blackwell)
    assert "sm_90" in variant.unavailable_reason(Target("amd-mi300x", "gfx942", 304))
    assert variant.unavailable_reason(hopper) is None
    key = ProblemKey.make(
        "ag_gemm", "nvidia-h200", 2, "bf16", {"M": 512, "N": 8192, "K": 8192}, {"gather_dim": 0}
    )
    good = variant.seed_configs(key, hopper)
    assert good and all(variant.check(key, hopper, c) is None for c in good)
    space = variant.search_space(key, hopper)
    assert all(set(c) == set(space) and all(c[f] in space[f] for f in c) for c in good)
    assert variant.check(key, hopper, dict(good[0], comm_sms=0)) is None  # the consumers move the shard
    assert "num_warps" in variant.check(key, hopper, dict(good[0], num_warps=2))
    assert variant.check(key, hopper, dict(good[0], block_n=256, num_warps=4)) is not None  # 256 regs/thread
    assert "shared memory" in variant.check(
        key, hopper, dict(good[0], block_n=128, num_warps=8, num_stages=8)
    )


def test_call_counts_push_arrivals_and_keeps_no_user_tensor() -> None:
    """A resolved call grows ``sync[0]`` by push's grid (so push's producers and the consumer read the same
    epoch) and keeps only placeholders where the per-call tensors go."""
    import torch
    from autotaxer.kernels.ag_gemm.experimental.push_ws import PushWsCall
    from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, FusedConfig, flags_count, geometry, inbox_shape

    config = FusedConfig(128, 256, 64, 8, 8, 4, 4, 16, 8, 0)
    ms, ks, n = 256, 4096, 4096
    a, b = torch.empty(ms, ks, dtype=torch.bfloat16), torch.empty(2 * ks, n, dtype=torch.bfloat16)
    out = torch.empty(ms, n, dtype=torch.bfloat16)
    call = PushWsCall(
        a_shard=a, b=b, out=out, inbox=torch.empty(inbox_shape(ms, ks, 2), dtype=torch.bfloat16),
        flags=torch.zeros(flags_count(geometry(config, ms, ks), 2), dtype=torch.int32),
        sync=torch.zeros(SYNC_WORDS, dtype=torch.int64), heap_bases=torch.zeros(2, dtype=torch.int64), rank=0,
        world_size=2, gather_dim=1, config=config, num_sms=132,
    )  # fmt: skip
    tiles = (ms // 128) * (n // 256)
    assert call.grid == 4 and call.arrivals == 4 + min(132 - 4, tiles)
    assert call.consumer_grid == min(132 - 4, tiles)
    held = [x for x in (*call.args, *call.consumer_args) if isinstance(x, torch.Tensor)]
    assert not any(x.data_ptr() in (a.data_ptr(), b.data_ptr(), out.data_ptr()) for x in held)
    assert call.a_template.base.data_ptr() == 0 and call.b_template.base.data_ptr() == 0
    call.count_arrivals()
    call.count_arrivals()
    assert int(call.sync[0]) == 2 * call.arrivals


def test_fallback_to_push_keeps_epoch_and_tile_queue_in_step(monkeypatch) -> None:
    """Calls alternating between ``push_ws``'s own path and ``push``'s kernel (what a misaligned input does
    on the same workspace): each call gets the next epoch on either path, and ``push``'s kernel always
    finds its tile queue at ``(epoch - 1) * draws``. A queue out of step sends its programs to tiles
    that do not exist, to wait for flags that never come (the hang this bookkeeping prevents)."""
    import torch
    from autotaxer.kernels.ag_gemm.experimental import push_ws as pws
    from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, FusedConfig, flags_count, geometry, inbox_shape

    config = FusedConfig(128, 256, 64, 8, 8, 4, 4, 4, 4, 0)
    ms, k, n, num_sms = 128, 1000, 1000, 132
    a, b = torch.empty(ms, k, dtype=torch.bfloat16), torch.empty(k, n, dtype=torch.bfloat16)
    out = torch.empty(2 * ms, n, dtype=torch.bfloat16)
    sync = torch.zeros(SYNC_WORDS, dtype=torch.int64)
    tiles = 2 * 4  # 256 rows / 128, 1000 columns / 256
    arrivals, draws = config.comm_sms + min(num_sms - config.comm_sms, tiles), tiles + config.comm_sms
    seen = []

    def push_kernel(**kw) -> None:  # what push's kernel derives at its start, then its own counting
        epoch = int(sync[0]) // arrivals + 1
        assert int(sync[1]) == (epoch - 1) * draws, "push's tile queue is out of step with its epoch"
        seen.append(("push", epoch))
        sync[0] += arrivals
        sync[1] += draws

    monkeypatch.setattr(pws, "ag_gemm_push", push_kernel)
    inbox = torch.empty(inbox_shape(ms, k, 2), dtype=torch.bfloat16)
    flags = torch.zeros(flags_count(geometry(config, ms, k), 2), dtype=torch.int32)
    bases = torch.zeros(2, dtype=torch.int64)
    for path in ("ws", "push", "push", "ws", "push", "ws", "ws", "push"):
        if path == "push":
            pws._run_push(
                a, b, out, None, inbox=inbox, flags=flags, sync=sync, heap_bases=bases, rank=0, world_size=2,
                gather_dim=0, config=config, num_sms=num_sms,
            )  # fmt: skip
        else:  # this variant's own call: count, then both kernels read (s + G) // G + 1
            pws.count_call(sync, arrivals, pws.queue_draws(config, out, config.comm_sms))
            seen.append(("ws", int(sync[0]) // arrivals + 1))
    epochs = [e for _, e in seen]
    assert epochs == list(range(2, 2 + len(epochs))), seen
    assert int(sync[0]) == len(epochs) * arrivals and int(sync[1]) == len(epochs) * draws


def test_forward_variant_prunes_what_its_forward_warp_cannot_serve(monkeypatch) -> None:
    """``push_ws_fwd``: two ranks, no producer CTAs, one flag per 128x64 box, and at gather_dim=1 one wave
    of tiles only (there every tile forwards and waits); its seeds are valid and inside its space."""
    from autotaxer.kernels.ag_gemm.experimental.ws import WsConfig, forward_error

    from autotaxer import ProblemKey
    from autotaxer._problem import Target
    from autotaxer.ops import get_op
    from autotaxer.ops.ag_gemm.iris_fused import PushVariant

    monkeypatch.setattr(PushVariant, "unavailable_reason", lambda self, target: None)  # Iris importable
    fwd = get_op("ag_gemm").variants["push_ws_fwd"]
    assert fwd.experimental
    hopper = Target(gpu_model="nvidia-h200", arch="sm_90", num_sms=132)
    assert fwd.unavailable_reason(hopper) is None

    def key(m: int, gd: int, ws: int = 2, n: int = 8192) -> ProblemKey:
        return ProblemKey.make("ag_gemm", "nvidia-h200", ws, "bf16", {"M": m, "N": n, "K": 8192},
                               {"gather_dim": gd})  # fmt: skip

    for m, gd in ((256, 0), (512, 0), (4096, 0), (256, 1), (127, 1), (512, 1)):
        space = fwd.search_space(key(m, gd), hopper)
        seeds = [c for c in fwd.seed_configs(key(m, gd), hopper) if fwd.check(key(m, gd), hopper, c) is None]
        assert seeds, (m, gd)
        assert all(all(c[f] in space[f] for f in c) and set(c) == set(space) for c in seeds)
    good = fwd.seed_configs(key(512, 0), hopper)[0]  # a 256-row shard of 8192 columns
    assert (good["row_chunks"], good["k_chunks"], good["comm_sms"]) == (2, 128, 0)
    assert "row_chunks" in fwd.check(key(512, 0), hopper, dict(good, row_chunks=1))
    assert "k_chunks" in fwd.check(key(512, 0), hopper, dict(good, k_chunks=64))
    assert "comm_sms" in fwd.check(key(512, 0), hopper, dict(good, comm_sms=4))
    assert "world_size" in fwd.check(key(1024, 0, ws=4), hopper, good)
    # gather_dim=1, M=1024: 8 x 32 tiles of 128x256 are two waves on 132 SMs
    wide = fwd.seed_configs(key(1024, 1), hopper)[0]
    assert "one wave" in fwd.check(key(1024, 1), hopper, wide)
    ws = WsConfig(block_m=128, block_k=64)
    assert forward_error((128, 2, 64, 128), ws, 0, 512, 132) is None  # gather_dim=0: any number of waves
    assert forward_error((127, 1, 64, 64), ws, 1, 32, 132) is None  # a shard shorter than a box
    assert "box" in forward_error((64, 4, 64, 128), ws, 0, 64, 132)
