"""Compile every kernel that waits on a peer (takes a watch slot, ``kernels/common/watch.py``) for Hopper
(sm_90) without a GPU, with the installed Triton, and check that its bounded wait is in the PTX.

Triton's interpreter runs these kernels on CPU but type-checks less than the compiler: a variable that is
a literal on one path and a tensor on another (``ok`` passed as ``1`` to the spin, then set to ``0`` in
its loop) runs under the interpreter and fails to compile on a GPU ("initial value for `ok` is of type
constexpr[1], but the then block redefines it as int32[]"). This tool compiles each launch as its
launcher builds it (CPU tensors: only types, shapes and alignment matter; :mod:`.sm90`'s
specialisation), so that error shows on the CPU machine, and for another Triton too::

    python -m autotaxer.tools.wait_kernels [--quick] [--only SUBSTR]
    pip install --no-deps --target /tmp/triton36 triton==3.6.0   # the lent GPUs' Triton
    PYTHONPATH=/tmp/triton36 python -P -m autotaxer.tools.wait_kernels

Each compiled kernel's PTX must read ``%globaltimer`` (the bound's clock: the wait was not compiled out)
and add to the alarm word at system scope (``give_up``). Exit status 1 when any launch fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: What every wait kernel's PTX must hold: the bound's clock and the give-up's alarm (a 64-bit add with
#: release at system scope; ``red`` when its result is unused; the qualifiers' order varies).
PTX_MARKS = {
    "%globaltimer": re.compile(r"%globaltimer"),
    "alarm": re.compile(r"\b(atom|red)(\.global|\.sys|\.release){3}\.add\.[us]64"),
}


@contextmanager
def _recording(module: Any, name: str) -> Iterator[Any]:
    """``module.name`` (a kernel) replaced by a recorder while the block runs; yields the recorder."""
    from .sm90 import _Recorder

    real = getattr(module, name)
    rec = _Recorder(real)
    setattr(module, name, rec)
    try:
        yield rec
    finally:
        setattr(module, name, real)


def _signal_cases() -> Iterator[tuple[str, Callable[[], tuple]]]:
    import torch

    from autotaxer.kernels.common import signal as sig
    from autotaxer.kernels.common.watch import unnamed_slot

    def wait(offset: int) -> tuple:
        flag, epoch = torch.zeros(4, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
        with _recording(sig, "_wait_kernel") as rec:
            sig.wait(flag[1:2], epoch, offset, peer=1, index=1)
        _, args, kw = rec.launches[0]
        return rec.fn, args, kw

    def memop_wait() -> tuple:  # memop_wait_eq's launch (it needs a CUDA stream to be called itself)
        flag = torch.zeros(4, dtype=torch.int32)
        args = (sig.Int32Ptr(flag[2:3].data_ptr()), 1, unnamed_slot("cpu"), 1, 2)
        return sig._wait_eq_kernel, args, {"num_warps": 1}

    yield "signal.wait offset=0", lambda: wait(0)
    yield "signal.wait offset=-1", lambda: wait(-1)
    yield "signal.memop_wait_eq", memop_wait


def _fused_cases(quick: bool) -> Iterator[tuple[str, Callable[[], tuple]]]:
    import dataclasses

    from autotaxer.kernels.ag_gemm.fused import FusedConfig

    from .sm90 import CONFIGS, fused_launch

    configs = {"comm_sms=16": CONFIGS[1], "comm_sms=0": CONFIGS[5]}
    for kind in ("push", "pull", "push_tma"):
        for gd in (0,) if quick else (0, 1):
            for label, c in configs.items():
                if quick and label != "comm_sms=16" and kind != "push":
                    continue
                params = dataclasses.asdict(FusedConfig(*c))
                yield (
                    f"ag_gemm {kind} gather_dim={gd} {label}",
                    lambda kind=kind, gd=gd, params=params: fused_launch(kind, 4096, 8192, 8192, gd, params),
                )
    if not quick:  # many peers: the options each 1, at world size 4
        params = dataclasses.asdict(FusedConfig(*CONFIGS[1]))
        params.update(group_across=1, push_order=1, release_each=1)
        yield (
            "ag_gemm push ws=4 group_across push_order release_each",
            lambda: fused_launch("push", 4096, 8192, 8192, 0, params, world_size=4),
        )


def _gemm_rs_cases(quick: bool) -> Iterator[tuple[str, Callable[[], tuple]]]:
    import torch

    from autotaxer.kernels.gemm_rs import push as rs

    def launch(scatter_dim: int, tma: bool, world_size: int = 2, rank: int = 0) -> tuple:
        m, n, k = 4096, 4096, 1024
        config = rs.RsConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
        mo, no = rs.out_dims(m, n, world_size, scatter_dim)
        dt = torch.bfloat16
        with _recording(rs, "KERNEL") as rec:
            rs.gemm_rs_push(
                a=torch.empty(m, k, dtype=dt), b=torch.empty(k, n, dtype=dt),
                out=torch.empty(mo, no, dtype=dt),
                inbox=torch.empty(rs.inbox_shape(mo, no, world_size), dtype=dt),
                flags=torch.zeros(rs.flags_count(m, n, world_size, scatter_dim, config), dtype=torch.int32),
                sync=torch.zeros(rs.SYNC_WORDS, dtype=torch.int64),
                heap_bases=torch.zeros(world_size, dtype=torch.int64), rank=rank, world_size=world_size,
                scatter_dim=scatter_dim, config=config, num_sms=132, tma=tma,
            )  # fmt: skip
        _, args, kw = rec.launches[0]
        return rec.fn, args, kw

    for name, tma in (("push", False), ("push_tma", True)):
        for sd in (0,) if quick else (0, 1):
            if quick and name != "push":
                continue
            yield f"gemm_rs {name} scatter_dim={sd}", lambda sd=sd, tma=tma: launch(sd, tma)
    if not quick:
        yield "gemm_rs push ws=4 rank=1", lambda: launch(0, False, world_size=4, rank=1)


def _flash_decode_cases(quick: bool) -> Iterator[tuple[str, Callable[[], tuple]]]:
    import torch

    from autotaxer.kernels.flash_decode import fused as fd
    from autotaxer.kernels.flash_decode.partials import DecodeConfig

    def launch(world_size: int, splits: int, rank: int) -> tuple:
        b, h, hkv, d, s = 2, 32, 8, 128, 1024
        config = DecodeConfig(block_n=64, splits=splits, num_warps=4, num_stages=2)
        dt = torch.bfloat16
        o_shape, lse_shape = fd.inbox_shapes(b, h, d, world_size, splits)
        with _recording(fd, "_flash_decode_fused_kernel") as rec:
            fd.flash_decode_fused(
                torch.empty(b, h, d, dtype=dt), torch.empty(b, s, hkv, d, dtype=dt),
                torch.empty(b, s, hkv, d, dtype=dt), torch.full((b,), s, dtype=torch.int32),
                torch.empty(b, h, d, dtype=dt), inbox_o=torch.empty(o_shape, dtype=torch.float32),
                inbox_lse=torch.empty(lse_shape, dtype=torch.float32),
                flags=torch.zeros(fd.flag_shape(b, hkv, world_size, splits), dtype=torch.int64),
                ticket=torch.zeros(1, dtype=torch.int64),
                heap_bases=torch.zeros(world_size, dtype=torch.int64),
                rank=rank, world_size=world_size, config=config,
            )  # fmt: skip
        _, args, kw = rec.launches[0]
        return rec.fn, args, kw

    yield "flash_decode fused ws=2 splits=16", lambda: launch(2, 16, 0)
    if not quick:
        yield "flash_decode fused ws=4 splits=1 rank=1", lambda: launch(4, 1, 1)


def _push_ws_cases(quick: bool) -> Iterator[tuple[str, Callable[[], tuple]]]:
    from autotaxer.kernels.ag_gemm.experimental.ws import WsConfig

    from .sm90 import ws_launch

    ws = WsConfig(block_n=128, stages=4, mma_wgs=2)
    yield (
        "push_ws (Gluon) gather_dim=1 forward",
        lambda: ws_launch(256, 8192, 8192, 1, ws, rank=1, forward=True),
    )
    if not quick:
        yield "push_ws (Gluon) gather_dim=0 sms", lambda: ws_launch(512, 8192, 8192, 0, ws)


def _ce_persistent_cases(quick: bool) -> Iterator[tuple[str, Callable[[], tuple]]]:
    """``ce_persistent``'s GEMM (issue 47) at world size 4: the ``cp.async`` consumer, and (not ``quick``)
    the TMA one at both weight layouts and gather_dim=1; its flags read by the atomic and (``load``,
    ``sleep``) by ``ld.acquire``; its waits reading the bound after 10 ms (``late``, the default) and, once,
    after 50 us (``once``); its tiles taken chunk by chunk across the peers (``order=1``)."""
    import torch

    from autotaxer.kernels.ag_gemm.experimental import ce_persistent as cp

    def launch(
        gd: int, tma: int, nk: bool, ws: int = 4, m: int = 4096, n: int = 8192, k: int = 8192,
        poll: str = "atomic", reads: str = "late", order: int = 0,
    ) -> tuple:  # fmt: skip
        tiles = (128, 256, 64, 8, 8, 3) if tma else (128, 128, 64, 8, 4, 4)
        config = cp.CePersistentConfig(*tiles, tma=tma, poll=cp.POLLS.index(poll), order=order)
        ms, ks = (m // ws, k) if gd == 0 else (m, k // ws)
        rows = ms if gd == 0 else m
        plan = cp.PersistentPlan(
            base=None, lanes=(), sends=(), row_width=cp.chunk_width(rows, config.chunks, config.block_m),
            gather_dim=gd, m=m, n=n, k=k, config=config, programs=131,
        )  # fmt: skip
        dt = torch.bfloat16
        _, args, kw = _ce_launch_args(cp, plan, ws, ms, ks, m, n, k, dt, nk)
        return cp.kernel_for(reads, order, ws), args, kw

    yield "ag_gemm ce_persistent ws=4 gather_dim=0", lambda: launch(0, 0, False)
    yield "ag_gemm ce_persistent ws=4 gather_dim=0 poll=load", lambda: launch(0, 0, False, poll="load")
    yield "ag_gemm ce_persistent ws=4 gather_dim=0 reads=once", lambda: launch(0, 0, False, reads="once")
    if not quick:
        yield "ag_gemm ce_persistent ws=4 gather_dim=0 tma nk", lambda: launch(0, 1, True)
        yield "ag_gemm ce_persistent ws=4 gather_dim=1 tma", lambda: launch(1, 1, False)
        yield "ag_gemm ce_persistent ws=8 gather_dim=1 nk", lambda: launch(1, 0, True, ws=8)
        for poll in ("load", "sleep"):
            yield (
                f"ag_gemm ce_persistent ws=4 gather_dim=0 tma nk poll={poll}",
                (lambda poll=poll: launch(0, 1, True, poll=poll)),
            )
        yield "ag_gemm ce_persistent ws=4 gather_dim=1 poll=sleep", lambda: launch(1, 0, False, poll="sleep")
        yield (
            "ag_gemm ce_persistent ws=4 order=1 gather_dim=0 tma nk poll=load",
            lambda: launch(0, 1, True, poll="load", order=1),
        )
        yield "ag_gemm ce_persistent ws=8 order=1 gather_dim=0", lambda: launch(0, 0, False, ws=8, order=1)


def _ce_launch_args(cp: Any, plan: Any, ws: int, ms: int, ks: int, m: int, n: int, k: int, dt: Any,
                    nk: bool) -> tuple:  # fmt: skip
    """``ce_persistent``'s :func:`launch_args` on CPU tensors of the plan's shapes."""
    import torch

    from autotaxer.kernels.common.channel import MAX_CHUNKS
    from autotaxer.kernels.common.watch import unnamed_slot

    return cp.launch_args(
        plan, rank=1, world_size=ws, inbox=torch.empty(ws * ms * ks, dtype=dt),
        flags=torch.zeros(ws * MAX_CHUNKS, dtype=torch.int32), epoch=torch.zeros(1, dtype=torch.int32),
        sync=torch.zeros(cp.SYNC_WORDS, dtype=torch.int64), a_shard=torch.empty(ms, ks, dtype=dt),
        b=torch.empty(n, k, dtype=dt).t() if nk else torch.empty(k, n, dtype=dt),
        out=torch.empty(m, n, dtype=dt), watch=unnamed_slot("cpu"),
    )  # fmt: skip


def cases(quick: bool = False) -> list[tuple[str, Callable[[], tuple]]]:
    """``(name, launch)`` per launch to compile: ``launch()`` returns ``(fn, args, kw)`` as the launcher
    makes it. ``quick``: one launch of each kernel and back end (what the CPU test compiles)."""
    found = list(_signal_cases())
    for more in (_fused_cases, _gemm_rs_cases, _flash_decode_cases, _push_ws_cases, _ce_persistent_cases):
        found += list(more(quick))
    return found


def _root(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"


def check(name: str, launch: Callable[[], tuple]) -> dict[str, Any]:
    """Compile one launch for sm_90; ``{"kernel", "ok", "seconds", ...}`` (``error``: the root cause;
    ``missing``: the PTX marks it lacks)."""
    from .sm90 import compile_for_hopper

    t0 = time.monotonic()
    try:
        fn, args, kw = launch()
        ptx = compile_for_hopper(fn, args, kw).asm["ptx"]
    except Exception as exc:  # noqa: BLE001 - the report names it
        return {"kernel": name, "ok": False, "seconds": round(time.monotonic() - t0, 1), "error": _root(exc)}
    missing = [mark for mark, pattern in PTX_MARKS.items() if not pattern.search(ptx)]
    row = {"kernel": name, "ok": not missing, "seconds": round(time.monotonic() - t0, 1)}
    if missing:
        row["missing"] = missing
    return row


def sm90_compile_unavailable() -> str | None:
    """Why this Triton cannot compile for sm_90 here (None when it can): the interpreter is on, or the
    NVIDIA back end or its bundled ``ptxas`` is missing."""
    import os

    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return "TRITON_INTERPRET=1 (the interpreter does not compile)"
    try:
        import triton
        from triton.backends import backends
    except ImportError as exc:
        return f"triton: {exc}"
    if "nvidia" not in backends:
        return f"triton {triton.__version__} has no NVIDIA back end"
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas) and not os.environ.get("TRITON_PTXAS_PATH"):
        return "no ptxas bundled with triton (and TRITON_PTXAS_PATH unset)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one launch of each kernel and back end")
    parser.add_argument("--only", default="", help="only the launches whose name holds this text")
    parser.add_argument("--json", help="write the rows here too")
    args = parser.parse_args(argv)
    import triton

    why = sm90_compile_unavailable()
    if why:
        print(f"wait_kernels: cannot compile for sm_90 here: {why}", file=sys.stderr)
        return 2
    print(f"triton {triton.__version__} ({triton.__file__})", flush=True)
    rows = []
    for name, launch in cases(args.quick):
        if args.only in name:
            rows.append(check(name, launch))
            print(json.dumps(rows[-1]), flush=True)
    failed = [r["kernel"] for r in rows if not r["ok"]]
    print(f"{len(rows) - len(failed)} of {len(rows)} compiled for sm_90 with their bounded waits"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"triton": triton.__version__, "rows": rows}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
