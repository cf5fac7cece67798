"""N ranks of the fused kernels in one process, on CPU (Triton's interpreter) or on one GPU.

The symmetric heap is emulated: one byte buffer per rank, carved at the same offsets on every rank, and
``heap_bases`` = the buffers' addresses, so a kernel of rank ``r`` translates its stores and flag
releases into rank ``p``'s buffer exactly as it would into a peer's mapping. The ranks' calls run in
phases (the launchers' ``phase``), every rank's producing step before any rank's consuming step: the
interpreter runs programs one after another, and on one GPU nothing then depends on N kernels being
resident at once. What a phased run checks is the protocol at any world size (flag counts and slots,
chunk order, per-destination release, parity and epochs over several calls with no reset, the inbox
contents bit for bit) and the result against fp32, not the overlap.

Used by the interpreter tests (``tests/ops/test_kernels_interpreter.py``,
``tests/ops/test_gemm_rs_push_interpreter.py``), by the one-GPU tests
(``tests/ops/test_emulated_ranks_gpu.py``) and by ``bench/emulated_ranks.py``. A failed check raises
``AssertionError`` naming the call, rank and what differed.
"""

from __future__ import annotations

from typing import Any

_ALIGN = 256


class EmulatedHeap:
    """``world_size`` byte buffers on ``device``; :meth:`alloc` carves one view per rank at one offset."""

    def __init__(self, world_size: int, nbytes: int, device: Any = "cpu") -> None:
        import torch

        self.bufs = [torch.zeros(nbytes, dtype=torch.uint8, device=device) for _ in range(world_size)]
        self.off = 0
        self.bases = torch.tensor([b.data_ptr() for b in self.bufs], dtype=torch.int64, device=device)

    def alloc(self, shape: tuple[int, ...], dtype: Any) -> list[Any]:
        """One ``shape`` view of ``dtype`` per rank, at the same offset of every rank's buffer."""
        import torch

        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        o, self.off = self.off, -(-(self.off + n) // _ALIGN) * _ALIGN
        if self.off > self.bufs[0].numel():
            raise ValueError(f"heap: {self.off} bytes needed, {self.bufs[0].numel()} emulated")
        return [b[o : o + n].view(dtype).view(shape) for b in self.bufs]


def _bytes(shape: tuple[int, ...], dtype: Any) -> int:
    import torch

    return -(-torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() // _ALIGN) * _ALIGN


def _rel_err(out: Any, ref: Any) -> float:
    err = ((out.float() - ref).norm() / ref.norm()).item()
    return float("inf") if err != err else err  # NaN never passes


def _tolerance(dtype: Any) -> float:
    import torch

    return {torch.float32: 1e-5, torch.float16: 2e-3}.get(dtype, 1e-2)


def grid_and_tiles(m: int, n: int, config: Any, num_sms: int) -> tuple[int, int]:
    """The fused ``ag_gemm`` launch's grid and its GEMM's tile count, as the launcher computes them."""
    tiles = -(-m // config.block_m) * -(-n // config.block_n)
    return config.comm_sms + min(num_sms - config.comm_sms, tiles), tiles


def check_ag_gemm(
    kind: str,
    world_size: int,
    gather_dim: int,
    m: int,
    n: int,
    k: int,
    config: Any,
    *,
    calls: int = 3,
    dtype: Any = None,
    device: Any = "cpu",
    seed: int = 0,
    first_epoch: int = 1,
    b_t: bool = False,
    tma: bool = True,
    num_sms: int = 4,
) -> str:
    """``calls`` calls of ``kind`` (``pull``, ``push`` or ``push_tma``) on ``world_size`` emulated ranks,
    one set of flags, fresh inputs and NaN-poisoned outputs each call; returns ``"OK ..."``.

    ``first_epoch`` > 1: the sync words start as that many calls had left them. ``b_t``: B is a
    transposed row-major ``(N, K)`` tensor (nn.Linear's layout). ``tma``: for ``push_tma``, whether the
    TMA core is expected to run (else push's kernel as its fallback)."""
    import torch

    from autotaxer.kernels.ag_gemm.fused import SYNC_WORDS, flags_count, geometry, inbox_shape, shard_dims
    from autotaxer.kernels.ag_gemm.pull import ag_gemm_pull
    from autotaxer.kernels.ag_gemm.push import ag_gemm_push
    from autotaxer.kernels.ag_gemm.push_tma import ag_gemm_push_tma, tma_ready

    launch = {"pull": ag_gemm_pull, "push": ag_gemm_push, "push_tma": ag_gemm_push_tma}[kind]
    dtype = dtype or torch.float32
    ws, gd = world_size, gather_dim
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ms, ks = shard_dims(m, k, ws, gd)
    geo = geometry(config, ms, ks)
    box, n_flags = inbox_shape(ms, ks, ws), flags_count(geo, ws)
    heap = EmulatedHeap(ws, _bytes(box, dtype) + _bytes((n_flags,), torch.int32), device)
    inbox, flags = heap.alloc(box, dtype), heap.alloc((n_flags,), torch.int32)
    syncs = [torch.zeros(SYNC_WORDS, dtype=torch.int64, device=device) for _ in range(ws)]
    grid, tiles = grid_and_tiles(m, n, config, num_sms)
    per_call = tiles + config.comm_sms if config.comm_sms else 0  # the tile queue's draws per call
    for s in syncs:
        s[0], s[1] = (first_epoch - 1) * grid, ((first_epoch - 1) * per_call) % 2**32
    for epoch in range(first_epoch, first_epoch + calls):
        shards = [torch.randn(ms, ks, generator=gen).to(device, dtype) for _ in range(ws)]
        b = torch.randn(k, n, generator=gen).to(device, dtype)
        if b_t:
            b = b.t().contiguous().t()
        outs = [torch.full((m, n), float("nan"), dtype=dtype, device=device) for _ in range(ws)]
        ref = torch.cat([s.float() for s in shards], dim=gd) @ b.float()
        if kind == "push_tma":
            ready = tma_ready(shards[0], b, inbox[0], gd, config) is None
            assert ready == tma, f"push_tma: TMA core expected {tma}, tma_ready says {ready}"
        for phase in ("stage", "fetch", "consumers"):  # pull's fetch waits on every rank's staging
            for r in range(ws):
                launch(a_shard=shards[r], b=b, out=outs[r], flags=flags[r], sync=syncs[r],
                       heap_bases=heap.bases, rank=r, world_size=ws, gather_dim=gd, config=config,
                       num_sms=num_sms, phase=phase, inbox=inbox[r])  # fmt: skip
        for r in range(ws):
            err = _rel_err(outs[r], ref)
            where = f"{kind} ws{ws} gd{gd} call {epoch} rank {r}"
            assert err < _tolerance(dtype), f"{where}: relative error {err:.2e}"
            # every program arrived once per call; the queue advanced by tiles + dedicated producers
            arrivals, drawn = syncs[r].tolist()
            assert arrivals == epoch * grid, f"rank {r} call {epoch}: {arrivals} arrivals, {epoch * grid} due"
            assert drawn % 2**32 == (epoch * per_call) % 2**32, f"rank {r} call {epoch}: queue at {drawn}"
            # this call's parity slot holds its epoch in every flag a peer raises (pull: its own too)
            slot = flags[r].view(2, ws, geo.count)[epoch % 2]
            raised = slot.flatten().tolist().count(epoch)
            due = (ws if kind == "pull" else ws - 1) * geo.count
            assert raised == due, f"rank {r} call {epoch}: {raised} flags hold the epoch, {due} due"
            for src in range(ws):  # every peer's shard landed bit for bit (pull: the own one staged)
                if src != r or kind == "pull":
                    landed = torch.equal(inbox[r][epoch % 2, src], shards[src])
                    assert landed, f"{kind} call {epoch}: rank {src}'s shard differs in rank {r}'s inbox"
    return f"OK {kind} ws{ws} gd{gd} {m}x{n}x{k} {str(dtype).removeprefix('torch.')}"


def check_gemm_rs_push(
    world_size: int,
    scatter_dim: int,
    m: int,
    n: int,
    k: int,
    config: Any,
    *,
    layout: str = "kn",
    dtype: Any = None,
    tma: bool = False,
    calls: int = 3,
    device: Any = "cpu",
    num_sms: int = 4,
    seed: int = 0,
    pull: bool = False,
) -> str:
    """``calls`` calls of ``gemm_rs``'s fused push kernel (``pull``: its owner-pull form) on
    ``world_size`` emulated ranks (``k`` is the full K; each rank holds ``k / world_size`` of it), every
    rank's GEMM-and-push step before any rank's reduce step; ``layout`` ``nk``: B is nn.Linear's
    transposed weight. Returns ``"OK ..."``."""
    import torch

    from autotaxer.kernels.gemm_rs.push import (
        SYNC_WORDS,
        flags_count,
        gemm_rs_push,
        grid_of,
        inbox_shape,
        out_dims,
        tma_ready,
    )  # fmt: skip

    dtype = dtype or torch.float32
    ws, sd, ks = world_size, scatter_dim, k // world_size
    gen = torch.Generator(device="cpu").manual_seed(seed)
    mo, no = out_dims(m, n, ws, sd)
    box, n_flags = inbox_shape(mo, no, ws), flags_count(m, n, ws, sd, config)
    heap = EmulatedHeap(ws, _bytes(box, dtype) + _bytes((n_flags,), torch.int32), device)
    inbox, flags = heap.alloc(box, dtype), heap.alloc((n_flags,), torch.int32)
    syncs = [torch.zeros(SYNC_WORDS, dtype=torch.int64, device=device) for _ in range(ws)]
    grid = grid_of(config, num_sms)
    for call in range(1, calls + 1):
        a = [torch.randn(m, ks, generator=gen).to(device, dtype) for _ in range(ws)]
        if layout == "kn":
            b = [torch.randn(ks, n, generator=gen).to(device, dtype) for _ in range(ws)]
        else:
            b = [torch.randn(n, ks, generator=gen).to(device, dtype).t() for _ in range(ws)]
        full = sum(x.float() @ y.float() for x, y in zip(a, b, strict=True))
        outs = [torch.full((mo, no), float("nan"), dtype=dtype, device=device) for _ in range(ws)]
        if tma:
            reason = tma_ready(a[0], b[0])
            assert reason is None, f"gemm_rs push_tma: the TMA core would not run ({reason})"
        for phase in ("push", "reduce"):
            for r in range(ws):
                gemm_rs_push(a=a[r], b=b[r], out=outs[r], inbox=inbox[r], flags=flags[r], sync=syncs[r],
                             heap_bases=heap.bases, rank=r, world_size=ws, scatter_dim=sd, config=config,
                             num_sms=num_sms, phase=phase, tma=tma, pull=pull)  # fmt: skip
        for r in range(ws):
            ref = full[r * mo : (r + 1) * mo] if sd == 0 else full[:, r * no : (r + 1) * no]
            err = _rel_err(outs[r], ref)
            where = f"gemm_rs ws{ws} sd{sd} call {call} rank {r}"
            assert err < _tolerance(dtype), f"{where}: relative error {err:.2e}"
            arrivals = syncs[r].item()
            assert arrivals == call * grid, f"rank {r} call {call}: {arrivals} arrivals, {call * grid} due"
            tiles = n_flags // (2 * ws)
            raised = flags[r].view(2, ws, tiles)[call % 2].eq(call).all().item()
            assert raised, f"rank {r} call {call}: a source's tile flag does not hold the epoch"
    core = ("tma" if tma else "plain") + (" pull" if pull else "")
    return f"OK gemm_rs ws{ws} sd{sd} {m}x{n}x{k} {layout} {core} {str(dtype).removeprefix('torch.')}"


class EmulatedIris:
    """Rank ``rank``'s view of an emulated symmetric heap, with the part of Iris's context that the
    copy-engine variants use (``zeros``, ``heap.translate``, ``get_heap_bases``, ``barrier``). Every
    rank allocates in the same order, so its buffers sit at the same offsets as its peers'."""

    def __init__(self, heap: EmulatedHeap, rank: int) -> None:
        self.shared, self.rank, self.off = heap, rank, 0
        self.heap = self

    def zeros(self, *shape: int, dtype: Any) -> Any:
        import torch

        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        buf = self.shared.bufs[self.rank]
        o, self.off = self.off, -(-(self.off + n) // _ALIGN) * _ALIGN
        if self.off > buf.numel():
            raise ValueError(f"heap: {self.off} bytes needed, {buf.numel()} emulated")
        view = buf[o : o + n]
        view.zero_()
        return view.view(dtype).view(shape)

    def translate(self, ptr: int, rank: int, peer: int) -> int:
        bases = self.shared.bufs
        return int(ptr) - bases[rank].data_ptr() + bases[peer].data_ptr()

    def get_heap_bases(self) -> Any:
        return self.shared.bases

    def barrier(self) -> None:
        import torch

        torch.cuda.synchronize()


#: Emulated contexts stay alive: channels are cached by the context's ``id``, which must not be reused.
_CONTEXTS: list[EmulatedIris] = []


def _single_process_group() -> None:
    """A one-process gloo group, for the collectives a channel's set-up calls (barriers)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def _warm_up(variant: Any, works: list, ctxs: list, mains: list, inputs: list, outs: list) -> None:
    """One call of every rank with every flag wait skipped, so that each kernel it launches is compiled
    and loaded before any stream spins (CUDA loads kernels lazily, and a load can wait for the streams of
    the whole context, one of them spinning on a rank not yet enqueued); then the channels' flags, tokens
    and epochs as a fresh channel has them."""
    import torch

    from autotaxer.kernels.common import signal as sig

    saved = sig.memop_wait_eq, sig.wait
    sig.memop_wait_eq = lambda *args, **kwargs: None
    sig.wait = lambda *args, **kwargs: None
    try:
        for r in range(len(works)):
            with torch.cuda.stream(mains[r]):
                variant.run(works[r], inputs[r], ctxs[r], out=outs[r])
        torch.cuda.synchronize()
    finally:
        sig.memop_wait_eq, sig.wait = saved
    epoch = torch.ones(1, dtype=torch.int32, device="cuda")
    flags = torch.ones(8, dtype=torch.int32, device="cuda")
    for flag in (flags[0:1], flags[1:2]):  # the skipped wait kernels: 16-byte aligned flags and not
        sig.wait(flag, epoch)
        sig.wait(flag, epoch, offset=-1)
        sig.memop_wait_eq(flag.data_ptr(), 1, torch.cuda.current_stream())
    for w in works:
        ch = w.buffers.get("channel")
        if ch is not None:
            ch.data.zero_()
            ch.done.fill_(1 if ch.backend == "memop" else 0)
            ch.epoch.zero_()
    torch.cuda.synchronize()


def check_variant(
    op_name: str,
    variant_name: str,
    key: Any,
    params: dict[str, Any],
    *,
    calls: int = 3,
    heap_bytes: int = 1 << 28,
    seed: int = 0,
) -> str:
    """``calls`` calls of a host-scheduled variant (the copy-engine family) on ``key.world_size`` ranks
    emulated on the current GPU, each rank on a stream of its own, against the op's fp32 reference and
    NaN-poisoned outputs; returns ``"OK ..."``.

    Every rank's calls are enqueued one after another while earlier ranks' streams already wait on
    flags, which two things of one process can turn into a hang: CUDA's lazy loading of kernels (a load
    can wait for every stream of the context, one of them spinning on a rank not yet enqueued: a first
    call with the waits skipped loads every kernel beforehand) and more streams than the GPU has hardware
    queues (``CUDA_DEVICE_MAX_CONNECTIONS``, 8 by default, 32 at most), where a wait blocks a queue that a
    later rank's copy needs. So run this in a process started with ``CUDA_DEVICE_MAX_CONNECTIONS=32``,
    under a timeout."""
    import torch

    from autotaxer._target import cuda_target
    from autotaxer.ops import get_op, relative_error
    from autotaxer.ops._base import RunContext

    _single_process_group()
    op, ws = get_op(op_name), key.world_size
    variant = op.variants[variant_name]
    device = torch.device("cuda")
    target = cuda_target(0)
    heap = EmulatedHeap(ws, heap_bytes, device)
    ctxs, works, mains = [], [], []
    for r in range(ws):
        iris = EmulatedIris(heap, r)
        _CONTEXTS.append(iris)
        ctx = RunContext(rank=r, world_size=ws, device=device, target=target, _iris=iris)
        ctxs.append(ctx)
        works.append(variant.prepare(key, params, ctx))
        mains.append(torch.cuda.Stream())
    torch.cuda.synchronize()
    _warm_up(variant, works, ctxs, mains, [op.make_inputs(key, r, device, seed) for r in range(ws)],
             [op.empty_output(key, device) for _ in range(ws)])  # fmt: skip
    for call in range(1, calls + 1):
        inputs = [op.make_inputs(key, r, device, seed + call) for r in range(ws)]
        outs = [op.empty_output(key, device) for _ in range(ws)]
        for r in range(ws):
            mains[r].wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(mains[r]):
                variant.run(works[r], inputs[r], ctxs[r], out=outs[r])
        for r in range(ws):
            torch.cuda.current_stream().wait_stream(mains[r])
        torch.cuda.synchronize()
        for r in range(ws):
            err = relative_error(outs[r], op.reference(key, r, device, seed + call))
            where = f"{op_name} {variant_name} ws{ws} call {call} rank {r}"
            assert err == err and err < 1e-2, f"{where}: relative error {err:.2e}"
    return f"OK {op_name} {variant_name} ws{ws} {key.text} {params}"


#: What :func:`never_signal` can run: the fused ``ag_gemm`` kernel by push or pull, ``gemm_rs``'s fused
#: push, flash decode's fused kernel, and the copy-engine schedules' flag wait (``signal``).
NEVER_SIGNAL_KINDS = ("push", "pull", "gemm_rs", "flash_decode", "signal")


def never_signal(kind: str, *, device: Any = "cpu", timeout_s: float = 0.3, world_size: int = 2) -> Any:
    """One call of ``kind`` (:data:`NEVER_SIGNAL_KINDS`) by rank 0 of ``world_size`` emulated ranks whose
    peers never run, so no flag of theirs is ever raised: rank 0's waits must give up after ``timeout_s``
    and :func:`autotaxer.check` must name the op, variant, key and a silent peer. Returns the
    :class:`~autotaxer.ops._peer_wait.PeerTimeoutError` (``AssertionError`` when none is raised).

    On CPU run it under Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is imported)."""
    import torch

    from autotaxer import ProblemKey
    from autotaxer._target import cpu_target, cuda_target
    from autotaxer.ops import RunContext
    from autotaxer.ops._peer_wait import PeerTimeoutError, check

    if kind not in NEVER_SIGNAL_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(NEVER_SIGNAL_KINDS)}, got {kind!r}")
    dev = torch.device(device)
    target = cuda_target(dev.index or 0) if dev.type == "cuda" else cpu_target()
    ws, gen = world_size, torch.Generator(device="cpu").manual_seed(0)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dev, dtype)

    ctx = RunContext(rank=0, world_size=ws, device=dev, target=target, peer_timeout_s=timeout_s,
                     first_call_timeout_s=timeout_s)  # fmt: skip
    if kind in ("push", "pull"):
        from autotaxer.kernels.ag_gemm.fused import (
            SYNC_WORDS,
            FusedConfig,
            flags_count,
            geometry,
            inbox_shape,
        )
        from autotaxer.kernels.ag_gemm.fused import launch as fused_launch

        m, n, k = 12 * ws, 40, 40
        config = FusedConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_warps=4, num_stages=2,
                             comm_sms=1, row_chunks=2, k_chunks=2)  # fmt: skip
        key = ProblemKey.make(
            "ag_gemm", target.gpu_model, ws, "fp32", {"M": m, "N": n, "K": k}, {"gather_dim": 0}
        )
        ms = m // ws
        box, n_flags = inbox_shape(ms, k, ws), flags_count(geometry(config, ms, k), ws)
        heap = EmulatedHeap(ws, _bytes(box, dtype) + _bytes((n_flags,), torch.int32), dev)
        inbox, flags = heap.alloc(box, dtype), heap.alloc((n_flags,), torch.int32)
        slot = ctx.watch_slot(key, kind)
        sync = torch.zeros(SYNC_WORDS, dtype=torch.int64, device=dev)
        out = torch.empty(m, n, dtype=dtype, device=dev)
        fused_launch(kind, a_shard=randn(ms, k), b=randn(k, n), out=out, inbox=inbox[0], flags=flags[0],
                     sync=sync, heap_bases=heap.bases, rank=0, world_size=ws, gather_dim=0, config=config,
                     num_sms=4, watch=slot.tensor)  # fmt: skip
    elif kind == "gemm_rs":
        from autotaxer.kernels.gemm_rs.push import (
            SYNC_WORDS,
            RsConfig,
            flags_count,
            gemm_rs_push,
            inbox_shape,
        )

        m, n, ks = 16 * ws, 24, 16
        config = RsConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_programs=3)
        key = ProblemKey.make("gemm_rs", target.gpu_model, ws, "fp32", {"M": m, "N": n, "K": ks * ws},
                              {"scatter_dim": 0})  # fmt: skip
        box, n_flags = inbox_shape(m // ws, n, ws), flags_count(m, n, ws, 0, config)
        heap = EmulatedHeap(ws, _bytes(box, dtype) + _bytes((n_flags,), torch.int32), dev)
        inbox, flags = heap.alloc(box, dtype), heap.alloc((n_flags,), torch.int32)
        slot = ctx.watch_slot(key, "push")
        sync = torch.zeros(SYNC_WORDS, dtype=torch.int64, device=dev)
        gemm_rs_push(a=randn(m, ks), b=randn(ks, n), out=torch.empty(m // ws, n, dtype=dtype, device=dev),
                     inbox=inbox[0], flags=flags[0], sync=sync, heap_bases=heap.bases, rank=0, world_size=ws,
                     scatter_dim=0, config=config, num_sms=4, watch=slot.tensor)  # fmt: skip
    elif kind == "flash_decode":
        from autotaxer.kernels.flash_decode.fused import flag_shape, flash_decode_fused, inbox_shapes
        from autotaxer.kernels.flash_decode.partials import DecodeConfig

        b, h, hkv, d, s = 1, 2, 1, 64, 32
        config = DecodeConfig(block_n=16, splits=2, num_warps=4, num_stages=1)
        key = ProblemKey.make("flash_decode", target.gpu_model, ws, "fp32",
                              {"B": b, "H": h, "Hkv": hkv, "D": d, "S": s * ws}, {})  # fmt: skip
        o_shape, lse_shape = inbox_shapes(b, h, d, ws, config.splits)
        f_shape = flag_shape(b, hkv, ws, config.splits)
        sizes = (
            _bytes(o_shape, torch.float32),
            _bytes(lse_shape, torch.float32),
            _bytes(f_shape, torch.int64),
        )
        heap = EmulatedHeap(ws, sum(sizes), dev)
        inbox_o, inbox_lse = heap.alloc(o_shape, torch.float32), heap.alloc(lse_shape, torch.float32)
        flags = heap.alloc(f_shape, torch.int64)
        slot = ctx.watch_slot(key, "fused")
        q, kv = randn(b, h, d), [randn(b, s, hkv, d) for _ in range(2)]
        lengths, ticket = torch.full((b,), s, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
        flash_decode_fused(q, kv[0], kv[1], lengths.to(dev), torch.empty(b, h, d, dtype=dtype, device=dev),
                           inbox_o=inbox_o[0], inbox_lse=inbox_lse[0], flags=flags[0], ticket=ticket.to(dev),
                           heap_bases=heap.bases, rank=0, world_size=ws, config=config,
                           watch=slot.tensor)  # fmt: skip
    else:
        from autotaxer.kernels.common import signal as sig

        key = ProblemKey.make("ag_gemm", target.gpu_model, ws, "fp32", {"M": 2 * ws, "N": 8, "K": 8},
                              {"gather_dim": 0})  # fmt: skip
        slot = ctx.watch_slot(key, "copy_engine")
        flag, epoch = (
            torch.zeros(4, dtype=torch.int32, device=dev),
            torch.ones(1, dtype=torch.int32, device=dev),
        )
        sig.wait(flag[1:2], epoch, watch=slot.tensor, peer=1, index=1)
    try:
        check(dev)
    except PeerTimeoutError as exc:
        return exc
    raise AssertionError(f"never_signal({kind!r}): rank 0's waits ended without giving up")
