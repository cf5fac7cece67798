"""``ag_gemm`` push_ws: ``push``'s producers beside a warp-specialised consumer (NVIDIA sm_90).

One call on rank ``r``:

* count the call's arrivals on ``sync[0]`` (stream-ordered, so both kernels below read the same epoch,
  ``sync[0] // arrivals + 1``, exactly as ``push``'s kernel derives it);
* side stream: ``push``'s kernel with only its producer steps on ``comm_sms`` CTAs: the local shard,
  K-chunk major, stored into slot ``r`` of every peer's inbox, each chunk's flag raised (release,
  system scope) at the epoch;
* this stream, at the same time: the Gluon consumer (:mod:`.ws`) on the other SMs, whose
  single load warp acquires each peer chunk's flag just before the TMA loads that read it, so the MMA
  warps keep working on slots already loaded while the transfer is under way.

The buffers, flags, inbox parity and epoch arithmetic are ``push``'s (the producer kernel is ``push``'s,
unchanged), so the variant's workspace is ``push``'s. Safety: the consumer grid leaves ``comm_sms`` SMs
free (one consumer CTA fills an SM's shared memory), so the producers always find room; the side stream
forks after the previous call's consumer, so a rank overwrites a peer's inbox parity only after that
peer finished the call that read it (as in ``push``). A call whose tensors TMA cannot address (a base or
row stride off 16 bytes, gather_dim=0 tiles straddling two ranks' rows) runs ``push``'s whole kernel
with the same config, its epoch kept in step (:func:`_run_push`), so ranks that take different paths in
a call, or a rank that switches between calls, still agree. With ``comm_sms=0`` there is no producer
kernel: every consumer CTA first moves its share of the shard (``push``'s ``comm_sms=0``), so the grid
is one CTA per SM and all of it resident. ``transport="forward"`` (``push_ws_fwd``, two ranks,
``comm_sms=0``): no CTA moves the shard up front either; each box of it is sent by the consumer's
forward warp from the ring slot a local tile has just loaded it into (TMA store into the peer's inbox),
so the peer's tiles trail this rank's by about a store's latency.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..args import Io
from ..fused import KERNEL, FusedConfig, _CompiledLaunch, _launch_args, _specialization
from ..push import ag_gemm_push
from .ws import KERNEL as ws_kernel
from .ws import WsConfig, tensors_error, ws_config_error
from .ws import launch_args as ws_launch_args

#: How a call's shard reaches the peer: ``push``'s producer CTAs or, with ``comm_sms=0``, the consumer's
#: CTAs before their tiles (``"sms"``); or the consumer's forward warp, box by box (``"forward"``).
TRANSPORTS = ("sms", "forward")


def ws_config(config: FusedConfig) -> WsConfig:
    """The consumer's tiles from the tuner's ``push`` parameters (``num_warps`` 4 or 8: 1 or 2 MMA
    warpgroups)."""
    return WsConfig(
        block_m=config.block_m, block_n=config.block_n, block_k=config.block_k, stages=config.num_stages,
        group_m=config.group_m, mma_wgs=max(1, config.num_warps // 4),
    )  # fmt: skip


class PushWsCall:
    """One rank's calls of one specialisation, resolved: the producer launch (``push``'s kernel, producer
    steps only) and the consumer's arguments, compiled on first use and then launched through the
    compiled kernels' own launchers (no argument binding). The per-call tensors are passed to each
    launch and not kept. :func:`ag_gemm_push_ws` runs both halves; tests run two ranks' on one GPU."""

    def __init__(self, *, a_shard, b, out, inbox, flags, sync, heap_bases, rank: int, world_size: int,
                 gather_dim: int, config: FusedConfig, num_sms: int, transport: str = "sms",
                 watch: Any = None) -> None:  # fmt: skip
        if transport not in TRANSPORTS or (transport == "forward" and config.comm_sms):
            raise ValueError(
                f"transport: {transport!r} with comm_sms={config.comm_sms} (expected one of {TRANSPORTS}; "
                "forward sends the shard from the consumer's own loads: comm_sms=0)"
            )
        self.grid, args, self.options = _launch_args(
            "push", a_shard=a_shard, b=b, out=out, inbox=inbox, flags=flags, sync=sync, heap_bases=heap_bases,
            rank=rank, world_size=world_size, gather_dim=gather_dim, config=config, num_sms=num_sms,
            phase="producers", watch=watch,
        )  # fmt: skip
        named = dict(zip(KERNEL.arg_names, args, strict=True))
        programs = named["programs"]
        #: what ``sync[0]`` grows by per call (``push``'s grid, from which its kernel derives the epoch)
        self.arrivals = programs.producers + programs.consumers
        #: what ``sync[1]`` (``push``'s tile queue) grows by per call of ``push``'s kernel, kept in step here
        self.draws = queue_draws(config, out, programs.producers)
        self.ws = ws_config(config)
        self.consumer_grid, cargs, self.consumer_options = ws_launch_args(
            a_shard=a_shard, b=b, out=out, inbox=inbox, flags=flags, sync=sync, arrivals=self.arrivals,
            rank=rank, world_size=world_size, gather_dim=gather_dim,
            geometry=tuple(named["chunks"]), config=self.ws,
            grid=num_sms - config.comm_sms, heap_bases=None if config.comm_sms else heap_bases,
            forward=transport == "forward", watch=watch,
        )  # fmt: skip
        #: no producer kernel: the consumer's CTAs move the shard first (``comm_sms=0``)
        self.in_kernel = config.comm_sms == 0
        self.args = [None, *args[1:]]  # push's kernel: the call's tensors (``io``) first, per call
        # the consumer's a_desc and b_desc are rebuilt per call from these (layouts computed once, no
        # user tensor kept: the templates' base is a stand-in)
        self.a_template = dataclasses.replace(cargs[0], base=_Placeholder(a_shard.dtype))
        self.b_template = dataclasses.replace(cargs[2], base=_Placeholder(b.dtype))
        self.b_row_major = b.stride(1) == 1
        # per call: a_desc, b_desc, c_ptr, a_ptr (the inbox's and the peer slots' descriptors stay)
        self.consumer_args = [None, cargs[1], None, cargs[3], cargs[4], None, None, *cargs[7:]]
        self.sync = sync
        self._producers: Any = None
        self._consumer: Any = None

    def count_arrivals(self) -> None:
        """Advance this rank's epoch (before either kernel of the call is launched) and ``push``'s tile queue
        as its kernel would have (:func:`_run_push` relies on both)."""
        count_call(self.sync, self.arrivals, self.draws)

    def _bind_consumer(self, a_shard, b, out) -> None:
        cargs = self.consumer_args
        cargs[0] = dataclasses.replace(self.a_template, base=a_shard)
        cargs[2] = dataclasses.replace(self.b_template, base=b if self.b_row_major else b.t())
        cargs[5], cargs[6] = out, a_shard

    def compile(self, a_shard, b, out) -> None:
        """Compile both kernels and load them onto the GPU without launching them. A module load can wait
        for the kernels already running on the device, and with ``comm_sms=0`` a running kernel can wait
        for the one being loaded (two ranks emulated on one GPU), so both are loaded before either runs."""
        if self._consumer is not None:
            return
        if not self.in_kernel:
            g = self.grid
            compiled = KERNEL.warmup(Io(a_shard, b, out), *self.args[1:], grid=(g,), **self.options)
            self._producers = _CompiledLaunch(compiled, g, self.args)  # push's launch, tensors swapped in
        self._bind_consumer(a_shard, b, out)
        try:
            g = self.consumer_grid
            compiled = ws_kernel.warmup(*self.consumer_args, grid=(g,), **self.consumer_options)
            self._consumer = compiled[(g, 1, 1)]
        finally:
            self._unbind_consumer()

    def _unbind_consumer(self) -> None:
        cargs = self.consumer_args
        cargs[0] = cargs[2] = cargs[5] = cargs[6] = None  # hold no user tensor between calls

    def producers(self, a_shard, b, out) -> None:
        if self.in_kernel:
            return
        self.compile(a_shard, b, out)
        self._producers(a_shard, b, out)

    def consumer(self, a_shard, b, out) -> None:
        self.compile(a_shard, b, out)
        self._bind_consumer(a_shard, b, out)
        try:
            self._consumer(*self.consumer_args)
        finally:
            self._unbind_consumer()


class _Placeholder:
    """Stands in for a tensor in a descriptor template: its dtype, an aligned null address."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype

    def data_ptr(self) -> int:
        return 0


class _Fork:
    """The side stream and the two events of a fork/join (reused: no allocation per call)."""

    def __init__(self) -> None:
        import torch

        self.side = torch.cuda.Stream()
        self.fork = torch.cuda.Event()
        self.join = torch.cuda.Event()


def _fork(cache: dict | None) -> _Fork:
    if cache is None:
        return _Fork()
    fork = cache.get("push_ws_fork")
    if fork is None:
        fork = cache["push_ws_fork"] = _Fork()
    return fork


def queue_draws(config: FusedConfig, out: Any, producers: int) -> int:
    """Values ``push``'s kernel draws from its tile queue per call: every tile not dealt by program id, and
    one final draw per program (``tiles + producers``, ``protocol``'s contract)."""
    m, n = out.shape
    return -(-m // config.block_m) * -(-n // config.block_n) + producers


def count_call(sync: Any, arrivals: int, draws: int, sign: int = 1) -> None:
    """Advance (``sign=-1``: take back) one call's arrivals ``sync[0]`` and queue draws ``sync[1]``:
    stream-ordered scalar adds, so they replay in CUDA graphs."""
    sync[0:1].add_(sign * arrivals)
    sync[1:2].add_(sign * draws)


def _run_push(a_shard, b, out, cache, **workspace: Any) -> None:
    """``push``'s whole kernel on the same buffers, kept in step with this variant's calls.

    Here a call's epoch is ``(s + G) // G + 1`` for ``sync[0] = s`` before the call (the arrivals ``G``
    are counted before the launch), while ``push``'s kernel counts its own ``G`` and derives
    ``s // G + 1``; and ``push``'s tile queue (``sync[1]``) must hold ``(epoch - 1) * D`` draws when its
    kernel starts (``D`` per call, :func:`queue_draws`), while this variant's own calls draw nothing. So
    every call of this variant counts ``G`` and ``D`` (:meth:`PushWsCall.count_arrivals`), and here one
    more ``G`` and ``D`` are counted before ``push``'s kernel and taken back after it: both paths then use
    the same epoch, parity and queue base, whichever a rank takes in a call."""
    _, args, _ = _launch_args("push", a_shard=a_shard, b=b, out=out, phase="producers", **workspace)
    programs = dict(zip(KERNEL.arg_names, args, strict=True))["programs"]
    arrivals = programs.producers + programs.consumers
    draws = queue_draws(workspace["config"], out, programs.producers)
    count_call(workspace["sync"], arrivals, draws)
    ag_gemm_push(a_shard=a_shard, b=b, out=out, cache=cache, **workspace)
    count_call(workspace["sync"], arrivals, draws, sign=-1)


def ag_gemm_push_ws(
    *,
    a_shard,
    b,
    out,
    inbox,
    flags,
    sync,
    heap_bases,
    rank: int,
    world_size: int,
    gather_dim: int,
    config: FusedConfig,
    num_sms: int,
    phase: str = "all",
    cache: dict | None = None,
    transport: str = "sms",
    watch: Any = None,
):
    """``out = all_gather(a_shard, gather_dim) @ b``; arguments as ``ag_gemm_push`` (named, as there: every
    call's path; ``phase`` must be ``"all"``: the Gluon consumer has no interpreter path; ``transport``:
    :data:`TRANSPORTS`; ``watch``: the watch slot bounding both kernels' waits on peers); collective."""
    import torch

    if phase != "all":
        raise ValueError(f"phase: push_ws runs whole calls only, got {phase!r}")
    spec = ("push_ws", transport, *_specialization(a_shard, b, out))
    call = cache.get(spec) if cache is not None else None
    if call is None:
        consumer = ws_config(config)
        why = ws_config_error(consumer, a_shard.element_size()) or tensors_error(
            a_shard, b, inbox, gather_dim, consumer
        )
        kept = dict(
            inbox=inbox, flags=flags, sync=sync, heap_bases=heap_bases, rank=rank, world_size=world_size,
            gather_dim=gather_dim, config=config, num_sms=num_sms, watch=watch,
        )  # fmt: skip
        if why is not None:
            _run_push(a_shard, b, out, cache, **kept)
            return out
        call = PushWsCall(a_shard=a_shard, b=b, out=out, transport=transport, **kept)
        if cache is not None and len(cache) < 64:
            cache[spec] = call
    call.count_arrivals()
    if call.in_kernel:
        call.consumer(a_shard, b, out)
        return out
    f = _fork(cache)
    main = torch.cuda.current_stream()
    f.fork.record(main)
    f.side.wait_event(f.fork)
    with torch.cuda.stream(f.side):
        call.producers(a_shard, b, out)
    call.consumer(a_shard, b, out)
    f.join.record(f.side)
    main.wait_event(f.join)
    return out
