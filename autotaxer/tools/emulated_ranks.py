"""N ranks of the fused kernels in one process, on CPU (Triton's interpreter) or on one GPU.

The symmetric heap is emulated: one byte buffer per rank, carved at the same offsets on every rank, and
``heap_bases`` = the buffers' addresses, so a kernel of rank ``r`` translates its stores and flag
releases into rank ``p``'s buffer exactly as it would into a peer's mapping. The ranks' calls run in
phases (the launchers' ``phase``), every rank's producing step before any rank's consuming step: the
interpreter runs programs one after another, and on one GPU nothing then depends on N kernels being
resident at once. What a phased run checks is the protocol at any world size (flag counts and slots,
chunk order, per-destination release, parity and epochs over several calls with no reset, the inbox
contents bit for bit) and the result against fp32, not the overlap. Nor the copy engine: on one GPU the
copy-engine variants' peer copies are same-device ``cuMemcpyAsync``, which the driver runs as copy
kernels on the SMs (``bench/copy_sm_probe.py``), so beside a kernel that spins on most SMs they crawl.

What each op checks this way is its ``emulated`` integration (``autotaxer/ops/<op>/_emulated.py``: its
fused kernels' protocol call by call, and rank 0's waits on peers that never signal), laid out in the
emulated heap of :mod:`autotaxer.ops._emulated_heap`; the emulated Iris context and the checks that serve
every op (:func:`check_variant`, :func:`never_signal`, and on a GPU :func:`give_up_calls`: calls whose
waits all give up must all end) are here. Used by the interpreter tests
(``tests/ops/test_kernels_interpreter.py``, ``tests/ops/test_gemm_rs_push_interpreter.py``,
``tests/runtime/test_peer_wait_cpu.py``) and the one-GPU tests (``tests/ops/test_emulated_ranks_gpu.py``,
run by ``bench/device.sh emulated``). A failed check raises ``AssertionError`` naming the call, rank
and what differed.
"""

from __future__ import annotations

from typing import Any

from ..ops._emulated_heap import ALIGN, EmulatedHeap


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
        o, self.off = self.off, -(-(self.off + n) // ALIGN) * ALIGN
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


def sms_per_rank(num_sms: int, world_size: int) -> int:
    """Each emulated rank's share of the GPU's ``num_sms`` SMs (at least 2: a persistent grid keeps one
    free for its flag kernels)."""
    return max(2, num_sms // world_size)


def rank_target(world_size: int, share_sms: bool = True) -> Any:
    """The target each of ``world_size`` ranks emulated on the current GPU sees: with ``share_sms``, its
    :func:`sms_per_rank` share of the SMs (see :func:`emulate`), else the whole GPU."""
    import dataclasses

    from autotaxer._target import cuda_target

    target = cuda_target(0)
    if not share_sms:
        return target
    return dataclasses.replace(target, num_sms=sms_per_rank(target.num_sms, world_size))


def emulate(op_name: str, variant_name: str, key: Any, params: dict[str, Any], heap_bytes: int = 1 << 28,
            seed: int = 0, *, share_sms: bool = False,
            warm_up: bool = True) -> tuple[Any, Any, list, list, list]:  # fmt: skip
    """``key.world_size`` ranks of a host-scheduled variant on the current GPU, prepared on one emulated
    heap and warmed up (every kernel loaded, the channels' flags as new): ``(op, variant, contexts,
    workspaces, main streams)``, one of each per rank. What :func:`check_variant` runs its calls on.

    ``share_sms``: each rank's context sees :func:`sms_per_rank` SMs instead of the whole GPU's, as a rank
    of its own GPU would see all of them. A variant sizes its persistent grid by that count
    (``ce_persistent``: all SMs but one), and its spinning tiles must leave room for its copies and flag
    kernels; with every rank's grid sized for the whole GPU, the first ranks' grids take every SM and the
    copies that would release them never start (at 8 ranks, 128 tiles a rank: a hang until the bound).
    ``warm_up=False``: prepared only, for a fused kernel, whose waits on peers run on the GPU and cannot be
    skipped (``bench/concurrent_ranks.py`` loads its kernels itself)."""
    import torch

    from autotaxer.ops import get_op
    from autotaxer.ops._base import RunContext

    _single_process_group()
    op, ws = get_op(op_name), key.world_size
    variant = op.variants[variant_name]
    device = torch.device("cuda")
    target = rank_target(ws, share_sms)
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
    if warm_up:
        _warm_up(variant, works, ctxs, mains, [op.make_inputs(key, r, device, seed) for r in range(ws)],
                 [op.empty_output(key, device) for _ in range(ws)])  # fmt: skip
    return op, variant, ctxs, works, mains


def check_variant(
    op_name: str,
    variant_name: str,
    key: Any,
    params: dict[str, Any],
    *,
    calls: int = 3,
    heap_bytes: int = 1 << 28,
    seed: int = 0,
    share_sms: bool = True,
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
    under a timeout. ``share_sms`` (the default): each rank sees its share of the SMs (:func:`emulate`)."""
    import torch

    from autotaxer.ops import relative_error

    op, variant, ctxs, works, mains = emulate(
        op_name, variant_name, key, params, heap_bytes, seed, share_sms=share_sms
    )
    ws, device = key.world_size, torch.device("cuda")
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


def never_signal_kinds() -> dict[str, Any]:
    """What :func:`never_signal` can run: kind -> the op's function that runs rank 0's kernel of that kind
    (every registered op's ``emulated`` integration, e.g. a fused kernel by push or pull, or a
    copy-engine schedule's flag wait)."""
    from autotaxer.integrations import forms_of

    kinds: dict[str, Any] = {}
    for form in forms_of("emulated").values():
        kinds.update(form.never_signal)
    return kinds


def never_signal(kind: str, *, device: Any = "cpu", timeout_s: float = 0.3, world_size: int = 2) -> Any:
    """One call of ``kind`` (:func:`never_signal_kinds`) by rank 0 of ``world_size`` emulated ranks whose
    peers never run, so no flag of theirs is ever raised: rank 0's waits must give up after ``timeout_s``
    and :func:`autotaxer.check` must name the op, variant, key and a silent peer. Returns the
    :class:`~autotaxer.ops._peer_wait.PeerTimeoutError` (``AssertionError`` when none is raised).

    On CPU run it under Triton's interpreter (``TRITON_INTERPRET=1`` before Triton is imported)."""
    import torch

    from autotaxer._target import cpu_target, cuda_target
    from autotaxer.ops import RunContext
    from autotaxer.ops._peer_wait import PeerTimeoutError, check

    kinds = never_signal_kinds()
    if kind not in kinds:
        raise ValueError(f"kind: expected one of {', '.join(kinds)}, got {kind!r}")
    dev = torch.device(device)
    target = cuda_target(dev.index or 0) if dev.type == "cuda" else cpu_target()
    gen = torch.Generator(device="cpu").manual_seed(0)
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dev, dtype)

    ctx = RunContext(rank=0, world_size=world_size, device=dev, target=target, peer_timeout_s=timeout_s,
                     first_call_timeout_s=timeout_s)  # fmt: skip
    slot = kinds[kind](kind, ctx, randn, dtype)  # kept alive while the kernels use it
    try:
        check(dev)
    except PeerTimeoutError as exc:
        return exc
    finally:
        del slot
    raise AssertionError(f"never_signal({kind!r}): rank 0's waits ended without giving up")


def call_giving_up(variant: Any, work: Any, ctx: Any, stream: Any, inputs: Any, out: Any,
                   limit_s: float) -> int | None:  # fmt: skip
    """One call of ``variant`` on ``work`` enqueued on ``stream`` with its watch slot's bound set to 0, so
    that every wait on a peer that has not signalled gives up after
    :data:`~autotaxer.kernels.common.watch.CHECK_AFTER_NS`: how many waits gave up in it, or ``None`` when
    the call has not ended ``limit_s`` after it was enqueued (its kernel hung; the GPU stays busy)."""
    import time

    import torch

    from autotaxer.kernels.common.watch import BOUND, GAVE_UP

    slot = work.buffers["watch"].tensor
    slot[BOUND] = 0
    before = int(slot[GAVE_UP])
    with torch.cuda.stream(stream):
        variant.run(work, inputs, ctx, out=out)
    enqueued = time.monotonic()
    while not stream.query():
        if time.monotonic() - enqueued > limit_s:
            return None
        time.sleep(0.005)
    return int(slot[GAVE_UP]) - before


def give_up_calls(variant_name: str, key: Any, calls: int = 12, limit_s: float = 10.0) -> list[int]:
    """``calls`` calls by rank 0 of ``key``'s op's variant ``variant_name`` (one whose kernels wait on peers
    in the kernel, e.g. ``ag_gemm``'s ``push``, ``push_tma``, ``pull``; its first valid seed configuration)
    on ``key.world_size`` ranks emulated on the current GPU whose peers never run
    (:func:`call_giving_up`): how many waits gave up in each call. ``AssertionError`` naming the call that
    has not ended ``limit_s`` after it was enqueued (its kernel hung; run this in a process of its own,
    under a timeout, since the GPU stays busy)."""
    import torch

    from autotaxer.ops import get_op

    variant = get_op(key.op).variants[variant_name]
    share = rank_target(key.world_size)
    seeds = [variant.complete_params(p) for p in variant.seed_configs(key, share)]
    params = next(p for p in seeds if variant.check(key, share, p) is None)
    op, variant, ctxs, works, mains = emulate(
        key.op, variant_name, key, params, heap_bytes=1 << 30, share_sms=True, warm_up=False
    )
    device = torch.device("cuda")
    inputs = op.make_inputs(key, 0, device, 0)
    torch.cuda.synchronize()
    gave_up: list[int] = []
    for call in range(calls):
        out = op.empty_output(key, device)
        n = call_giving_up(variant, works[0], ctxs[0], mains[0], inputs, out, limit_s)
        if n is None:
            raise AssertionError(
                f"{variant_name} at {key.text} {params}: call {call} (rank 0, every wait giving up) has"
                f" not ended {limit_s:g} s after it was enqueued; calls before it gave up {gave_up} waits"
            )
        gave_up.append(n)
    return gave_up
