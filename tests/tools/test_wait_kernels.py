"""Every kernel that waits on a peer compiles for sm_90 with the installed Triton, its bounded wait in the
PTX (``autotaxer.tools.wait_kernels``; no GPU needed). The interpreter runs these kernels on CPU but does
not type-check like the compiler: ``spin_one(..., 1)`` with ``ok = 0`` in its loop ran there and failed to
compile on the GPUs (issue 35). Skips where this Triton cannot compile for sm_90 (no NVIDIA back end or
ptxas, or ``TRITON_INTERPRET=1``). For the lent GPUs' Triton, run the tool under that Triton (its
docstring says how)."""

from __future__ import annotations

import pytest
import triton
import triton.language as tl


def _skip_unless_sm90() -> None:
    from autotaxer.tools.wait_kernels import sm90_compile_unavailable

    why = sm90_compile_unavailable()
    if why:
        pytest.skip(why)


def test_every_wait_kernel_compiles_for_hopper_with_its_bound() -> None:
    _skip_unless_sm90()
    from autotaxer.tools.wait_kernels import cases, check

    rows = [check(name, launch) for name, launch in cases(quick=True)]
    names = {r["kernel"].split(" ")[0] for r in rows}
    assert {"signal.wait", "signal.memop_wait_eq", "ag_gemm", "gemm_rs", "flash_decode", "push_ws"} <= names
    assert any("ce_persistent" in r["kernel"] for r in rows)  # the copy-engine GEMM's per-tile waits
    assert any("poll=load" in r["kernel"] for r in rows)  # its flags read by ld.acquire
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad


def test_the_poll_modes_compile_to_their_reads() -> None:
    """``ce_persistent``'s tile waits: ``atomic`` an acquire atomic add, ``load`` an ``ld.acquire.sys`` and
    no atomic read, ``sleep`` that load and a ``nanosleep``."""
    _skip_unless_sm90()
    from autotaxer.tools.sm90 import compile_for_hopper
    from autotaxer.tools.wait_kernels import cases

    found = {}
    for name, launch in cases(quick=False):
        if name.startswith("ag_gemm ce_persistent ws=4 gather_dim=0 tma nk"):
            ptx = compile_for_hopper(*launch()).asm["ptx"]
            found[name.rpartition("poll=")[2] if "poll=" in name else "atomic"] = ptx
    assert set(found) == {"atomic", "load", "sleep"}
    assert (
        "atom.global.sys.acquire.add.u32" in found["atomic"]
        and "ld.global.acquire.sys" not in found["atomic"]
    )
    for mode in ("load", "sleep"):
        assert (
            "ld.global.acquire.sys.b32" in found[mode]
            and "atom.global.sys.acquire.add.u32" not in found[mode]
        )
    assert "nanosleep" in found["sleep"] and "nanosleep" not in found["load"]


@triton.jit
def _literal_ok_spin(x_ptr, ok):
    """The pattern that failed on the GPUs: ``ok`` a literal on entry, an int32 after the ``if``."""
    if tl.load(x_ptr) > 0:
        ok = 0
    tl.store(x_ptr, ok)


@triton.jit
def _literal_ok_kernel(x_ptr):
    _literal_ok_spin(x_ptr, 1)


def test_the_check_rejects_a_literal_reassigned_in_a_branch() -> None:
    """The check sees the compiler's error (the interpreter would run this kernel)."""
    _skip_unless_sm90()
    import torch

    from autotaxer.tools.wait_kernels import check

    row = check("literal ok", lambda: (_literal_ok_kernel, (torch.zeros(4, dtype=torch.int32),), {}))
    assert not row["ok"] and "constexpr" in row["error"] and "int32" in row["error"], row
