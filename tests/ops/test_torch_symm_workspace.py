"""torch's symmetric workspace grown at a ``torch_fused`` workspace's preparation, the one it replaces kept
alive (a CUDA graph captured against it still addresses it), on CPU with torch's registry stood in for."""

from __future__ import annotations

import weakref

import pytest
import torch

from autotaxer._problem import ProblemKey
from autotaxer.ops import _torch_symm

symm_mem = pytest.importorskip("torch.distributed._symmetric_memory")


@pytest.fixture
def registry(monkeypatch):
    """torch's per-group workspace registry and its growth (``get_symm_mem_workspace``), stood in for."""
    held: dict[str, torch.Tensor] = {}
    grown: list[int] = []

    def grow(group_name: str, min_size: int):
        tensor = held.get(group_name)
        if tensor is None or tensor.numel() < min_size:
            held[group_name] = torch.empty(min_size, dtype=torch.uint8)  # torch's replaces the last reference
            grown.append(min_size)
        return held[group_name]

    monkeypatch.setattr(symm_mem, "_group_name_to_workspace_tensor", held, raising=False)
    monkeypatch.setattr(symm_mem, "get_symm_mem_workspace", grow, raising=False)
    monkeypatch.setattr(_torch_symm, "RETIRED_WORKSPACES", [])
    return held, grown


def _key(op: str, m: int, n: int, k: int, ws: int = 4) -> ProblemKey:
    dim = "gather_dim" if op == "ag_gemm" else "scatter_dim"
    return ProblemKey.make(
        op, "nvidia-h200", ws, "bf16", {"M": m, "N": n, "K": k}, {dim: 0, "b_layout": "nk"}
    )


def test_the_bytes_torchs_fused_ops_ask_of_the_workspace() -> None:
    assert _torch_symm.workspace_bytes(_key("ag_gemm", 8192, 2560, 8192)) == 2048 * 8192 * 2  # A's shard
    assert _torch_symm.workspace_bytes(_key("gemm_rs", 8192, 8192, 28672)) == 2 * 2048 * 8192 * 2  # 2 chunks


def test_a_larger_key_grows_the_workspace_to_a_power_of_two_and_keeps_the_old_one(registry) -> None:
    held, grown = registry
    _torch_symm.reserve_workspace("g", 3000)
    first = weakref.ref(held["g"])
    assert grown == [4096]
    _torch_symm.reserve_workspace("g", 4096)  # fits: nothing allocated
    _torch_symm.reserve_workspace("g", 100)
    assert grown == [4096]
    _torch_symm.reserve_workspace("g", 5000)
    assert grown == [4096, 8192] and held["g"].numel() == 8192
    assert first() is not None and _torch_symm.RETIRED_WORKSPACES[0] is first()  # still alive: graphs use it


def test_nothing_is_grown_without_torchs_registry(monkeypatch) -> None:
    monkeypatch.delattr(symm_mem, "_group_name_to_workspace_tensor", raising=False)
    monkeypatch.setattr(_torch_symm, "RETIRED_WORKSPACES", [])
    _torch_symm.reserve_workspace("g", 1 << 20)  # an older or newer torch: served as torch's op grows it
    assert _torch_symm.RETIRED_WORKSPACES == []


def test_the_workspace_a_fused_call_ran_against_outlives_torch_growing_it(registry, monkeypatch) -> None:
    """PyTorch's async TP grows the workspace at a larger key between replays of a ``torch_fused`` call that
    autotaxer captured: the one the call ran against stays alive (2xH200: an illegal address without it)."""
    held, grown = registry

    def fused_op(*args, **kwargs):  # torch's op: asks the registry for its bytes, runs against the result
        symm_mem.get_symm_mem_workspace("g", min_size=1000)
        return "ran"

    monkeypatch.setattr(_torch_symm, "_original", lambda name: fused_op)
    assert _torch_symm.all_gather_matmul(torch.ones(1), [torch.ones(1)], 0, "g", return_A=False) == "ran"
    ran_against = weakref.ref(held["g"])
    assert _torch_symm.matmul_reduce_scatter(torch.ones(1), torch.ones(1), "sum", 0, "g") == "ran"
    assert len(_torch_symm.RETIRED_WORKSPACES) == 1  # the same workspace is held once
    symm_mem.get_symm_mem_workspace("g", min_size=1 << 20)  # async TP's larger key: torch drops its reference
    assert grown == [1000, 1 << 20] and held["g"] is not ran_against()
    assert ran_against() is not None and _torch_symm.RETIRED_WORKSPACES[0] is ran_against()
    _torch_symm.hold_workspace("g")  # the grown one, once a call ran against it
    assert [t.numel() for t in _torch_symm.RETIRED_WORKSPACES] == [1000, 1 << 20]


def test_holding_needs_a_workspace(registry) -> None:
    _torch_symm.hold_workspace("never-used")
    assert _torch_symm.RETIRED_WORKSPACES == []
