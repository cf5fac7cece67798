"""The fused kernels' protocol at 4 and 8 ranks on one GPU: compiled kernels, bf16, tiles and schedules
of the tuner's space, every rank emulated in one process (``autotaxer.tools.emulated_ranks``: one heap
buffer per rank, phased launches). Each check runs two calls on one set of flags with fresh inputs and
NaN-poisoned outputs and asserts the result against fp32, the arrivals, every flag's epoch and the
inbox contents."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.emulated]

_TILES = dict(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)
_MANY_PEERS = dict(push_order=1, release_each=1, group_across=1)
#: (kind, FusedConfig fields, shard rows at gather_dim=0): the shipped kind of schedule (dedicated
#: producers; every program producing, as the 8-GPU table's records) and the many-peer schedule with
#: one-tile-row shards, where group_across matters
AG_CASES = {
    "push": ("push", dict(comm_sms=16, row_chunks=4, k_chunks=1), 256),
    "push-every-program": ("push", dict(comm_sms=0, row_chunks=16, k_chunks=8), 256),
    "push-many-peers": ("push", dict(comm_sms=16, row_chunks=1, k_chunks=1, **_MANY_PEERS), 128),
    "pull": ("pull", dict(comm_sms=16, row_chunks=4, k_chunks=1), 256),
    "push_tma": ("push_tma", dict(comm_sms=16, row_chunks=2, k_chunks=2), 256),
    "push_tma-many-peers": ("push_tma", dict(comm_sms=0, row_chunks=1, k_chunks=4, **_MANY_PEERS), 128),
}


def _num_sms() -> int:
    import torch

    return torch.cuda.get_device_properties(0).multi_processor_count


@pytest.mark.parametrize("gather_dim", [0, 1], ids=lambda gd: f"gd{gd}")
@pytest.mark.parametrize("world_size", [4, 8], ids=lambda ws: f"ws{ws}")
@pytest.mark.parametrize("case", sorted(AG_CASES), ids=lambda c: f"ag_gemm-{c}")
def test_ag_gemm_on_emulated_ranks(case: str, world_size: int, gather_dim: int) -> None:
    import torch
    from autotaxer.kernels.ag_gemm.fused import FusedConfig

    from autotaxer.ops.ag_gemm._emulated import check_ag_gemm

    kind, fields, rows = AG_CASES[case]
    if gather_dim == 1 and fields.get("group_across"):
        fields = {**fields, "group_across": 0}  # gather_dim=0 only
    m, k = (rows * world_size, 1024) if gather_dim == 0 else (512, 256 * world_size)
    cfg = FusedConfig(**_TILES, **fields)
    b_t = (world_size // 4 + gather_dim) % 2 == 1  # each case meets both weight layouts over its four ids
    result = check_ag_gemm(
        kind, world_size, gather_dim, m, 1024, k, cfg, calls=2, dtype=torch.bfloat16, device="cuda",
        b_t=b_t, num_sms=_num_sms(),
    )  # fmt: skip
    assert result.startswith("OK")


@pytest.mark.parametrize("scatter_dim", [0, 1], ids=lambda sd: f"sd{sd}")
@pytest.mark.parametrize("world_size", [4, 8], ids=lambda ws: f"ws{ws}")
@pytest.mark.parametrize("core", ["push", "push_tma"], ids=lambda c: f"gemm_rs-{c}")
def test_gemm_rs_on_emulated_ranks(core: str, world_size: int, scatter_dim: int) -> None:
    import torch
    from autotaxer.kernels.gemm_rs.push import RsConfig

    from autotaxer.ops.gemm_rs._emulated import check_gemm_rs_push

    m, n = (256 * world_size, 1024) if scatter_dim == 0 else (512, 256 * world_size)
    cfg = RsConfig(**_TILES, num_programs=0)
    layout = "nk" if (world_size // 4 + scatter_dim) % 2 else "kn"  # both layouts over the four ids
    result = check_gemm_rs_push(
        world_size, scatter_dim, m, n, 256 * world_size, cfg, layout=layout, dtype=torch.bfloat16,
        tma=core == "push_tma", calls=2, device="cuda", num_sms=_num_sms(),
    )  # fmt: skip
    assert result.startswith("OK")


_CE_SCRIPT = """
import sys, json
from autotaxer import ProblemKey
from autotaxer._target import cuda_target
from autotaxer.tools.emulated_ranks import check_variant

op, variant, ws = sys.argv[1], sys.argv[2], int(sys.argv[3])
for layout, shape, params in json.loads(sys.argv[4]):
    key = ProblemKey.make(op, cuda_target(0).gpu_model, ws, "bf16", shape, layout)
    print(check_variant(op, variant, key, params, calls=2), flush=True)
"""

#: ``ce_persistent``'s GEMM tiles: 128x128x64 on 4 warps, 4 stages; 128x256x64 on 8 warps, 3 stages
_CE_TILES = dict(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)
_CE_WIDE = dict(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3)

#: (op, variant) -> [(layout, shape, params)]: both layouts and weight layouts, both signal back ends,
#: lanes and groups; at most 3 streams per emulated rank (8 ranks share the GPU's 32 hardware queues)
CE_CASES = {
    ("ag_gemm", "copy_engine"): [
        ({"gather_dim": 0}, {"M": "256ws", "N": 1024, "K": 1024},
         {"gather_first": False, "signal": "memop", "chunks": 2, "accumulate": "out", "order": "rotated"}),
        ({"gather_dim": 0, "b_layout": "nk"}, {"M": "256ws", "N": 1024, "K": 1024},
         {"gather_first": True, "signal": "triton", "chunks": 1, "accumulate": "out", "order": "reverse"}),
        ({"gather_dim": 1}, {"M": 512, "N": 1024, "K": "256ws"},
         {"gather_first": False, "signal": "memop", "chunks": 1, "accumulate": "fp32", "order": "rotated"}),
    ],
    ("ag_gemm", "ce_fanout"): [
        ({"gather_dim": 0}, {"M": "256ws", "N": 1024, "K": 1024},
         {"streams": 2, "gemms": "range", "signal": "memop", "chunks": 1, "accumulate": "out"}),
        ({"gather_dim": 1, "b_layout": "nk"}, {"M": 512, "N": 1024, "K": "256ws"},
         {"streams": 2, "gemms": "peer", "signal": "triton", "chunks": 2, "accumulate": "fp32"}),
    ],
    ("ag_gemm", "ce_local_rest"): [
        ({"gather_dim": 0}, {"M": "256ws", "N": 1024, "K": 1024}, {"streams": 2, "signal": "memop"}),
        ({"gather_dim": 0, "b_layout": "nk"}, {"M": "256ws", "N": 1024, "K": 1024},
         {"streams": 1, "signal": "triton"}),
    ],
    ("ag_gemm", "ce_grouped"): [
        ({"gather_dim": 0}, {"M": "256ws", "N": 1024, "K": 1024},
         {"streams": 2, "group": 2, "signal": "memop", "accumulate": "out"}),
        ({"gather_dim": 0, "b_layout": "nk"}, {"M": "256ws", "N": 1024, "K": 1024},
         {"streams": 1, "group": "all", "signal": "triton", "accumulate": "out"}),
        ({"gather_dim": 1}, {"M": 512, "N": 1024, "K": "256ws"},
         {"streams": 2, "group": 2, "signal": "memop", "accumulate": "fp32"}),
        ({"gather_dim": 1, "b_layout": "nk"}, {"M": 512, "N": 1024, "K": "256ws"},
         {"streams": 2, "group": "all", "signal": "memop", "accumulate": "out"}),
    ],
    ("ag_gemm", "ce_persistent"): [
        ({"gather_dim": 0}, {"M": "256ws", "N": 1024, "K": 1024},
         {**_CE_TILES, "chunks": 2, "streams": 2, "tma": 1, "signal": "triton"}),
        ({"gather_dim": 0, "b_layout": "nk"}, {"M": "256ws", "N": 1024, "K": 1024},
         {**_CE_WIDE, "chunks": 1, "streams": 1, "tma": 0, "signal": "memop"}),
        ({"gather_dim": 1}, {"M": 512, "N": 1024, "K": "256ws"},
         {**_CE_TILES, "chunks": 4, "streams": 2, "tma": 1, "signal": "memop"}),
        ({"gather_dim": 1, "b_layout": "nk"}, {"M": 512, "N": 1024, "K": "256ws"},
         {**_CE_WIDE, "chunks": 2, "streams": 1, "tma": 0, "signal": "triton"}),
    ],
    ("gemm_rs", "copy_engine"): [
        ({"scatter_dim": 0}, {"M": "256ws", "N": 1024, "K": "256ws"}, {"streams": 2, "signal": "memop"}),
        ({"scatter_dim": 1, "b_layout": "nk"}, {"M": 512, "N": "256ws", "K": "256ws"},
         {"streams": 1, "signal": "triton"}),
        ({"scatter_dim": 0, "b_layout": "nk"}, {"M": "256ws", "N": 1024, "K": "256ws"},
         {"streams": 2, "signal": "triton"}),
    ],
}  # fmt: skip


def _resolve(value, ws: int):
    """``"256ws"`` -> 256 * ws; ``"all"`` (a group) -> the smallest power of two covering every peer."""
    if value == "all":
        return 1 << (ws - 2).bit_length()
    if isinstance(value, str) and value.endswith("ws"):
        return int(value[:-2]) * ws
    return value


@pytest.mark.parametrize("world_size", [2, 4, 8], ids=lambda ws: f"ws{ws}")
@pytest.mark.parametrize("case", sorted(CE_CASES), ids=lambda c: f"{c[0]}-{c[1]}")
def test_copy_engine_family_on_emulated_ranks(case: tuple[str, str], world_size: int) -> None:
    """Each emulated rank on its own streams, flags and tokens through the channel on the emulated heap;
    two calls, so the consumed-inbox tokens of the first gate the second's copies."""
    import json
    import os
    import subprocess
    import sys

    op, variant = case
    if world_size == 2 and variant in ("ce_fanout", "ce_grouped", "ce_local_rest"):
        pytest.skip(f"{variant} needs 3 ranks or more")
    ws = world_size
    cases = [
        (layout, {k: _resolve(v, ws) for k, v in shape.items()},
         {k: min(v, ws - 1) if k == "streams" else _resolve(v, ws) for k, v in params.items()})
        for layout, shape, params in CE_CASES[case]
    ]  # fmt: skip
    env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS="32")
    try:
        proc = subprocess.run(
            # -P as this process was started: on the device the package is installed, not the checkout
            [sys.executable, *(["-P"] if sys.flags.safe_path else []), "-c", _CE_SCRIPT, op, variant, str(ws),
             json.dumps(cases)],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        done = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        pytest.fail(
            f"{op} {variant} ws{ws}: hung after {done.count('OK')} of {len(cases)} cases (a flag"
            f" never came, or the GPU's queues ran out); finished:\n{done}"
        )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count("OK") == len(cases), proc.stdout
