"""Cross-GPU flags for stream-ordered producers and consumers, with a device-resident epoch.

Two back ends signal "data for this call has landed" between ranks:

* ``triton`` (portable: NVIDIA and AMD): 1-program Triton kernels. The epoch counter lives in device
  memory and is advanced by a kernel (:func:`advance_epoch`), so a captured CUDA graph sees a new epoch
  on every replay. :func:`signal` stores ``epoch + offset`` into a (possibly remote) flag with a
  release at system scope; :func:`wait` spins with acquire loads at system scope until the flag
  reaches ``epoch + offset``. Flags are never reset: a later epoch overwrites an older one.
* ``memop`` (NVIDIA only): ``cuStreamWriteValue32`` from ``cuda.bindings.driver`` raises flags with 0
  SMs. Stream memory operations take constant values, so this back end uses a token protocol instead of
  epochs: the producer writes 1, the consumer waits for 1 and writes 0 back; constants are what a graph
  replays, so it is replay safe too. The driver's ``cuStreamWaitValue32`` has no timeout, so the wait is
  a 1-program spin kernel too (:func:`memop_wait_eq`). :func:`memop_available` is the capability check.

Every wait is bounded: it gives up after the bound of a watch slot (``watch``; :mod:`.watch`) and records
the peer and flag there, and the host raises. Flags are ``int32``. A flag's address may be local or a
peer's (an Iris heap address translated to this process's mapping); the kernels take tensors (or
:class:`Int32Ptr`), the memops take integer addresses.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from .watch import spin_one, unnamed_slot


@triton.jit
def _advance_epoch_kernel(epoch_ptr):
    # Stream-ordered: every later kernel/memop on this stream (and on streams forked from it) sees it.
    e = tl.load(epoch_ptr)
    tl.store(epoch_ptr, e + 1)


@triton.jit
def _signal_kernel(flag_ptr, epoch_ptr, OFFSET: tl.constexpr):
    e = tl.load(epoch_ptr) + OFFSET
    # Release at system scope: everything this stream wrote before (the peer copies, completed before
    # this kernel started) is visible to a reader whose acquire load sees ``e``.
    tl.atomic_xchg(flag_ptr, e, sem="release", scope="sys")


@triton.jit(do_not_specialize=["peer", "index"])
def _wait_kernel(flag_ptr, epoch_ptr, watch_ptr, peer, index, OFFSET: tl.constexpr):
    e = tl.load(epoch_ptr) + OFFSET
    # Acquire loads (an atomic add of 0): a plain volatile load would not order the later reads.
    spin_one(flag_ptr, e, watch_ptr, peer, index, 1)


@triton.jit(do_not_specialize=["value", "peer", "index"])
def _wait_eq_kernel(flag_ptr, value, watch_ptr, peer, index):
    spin_one(flag_ptr, value, watch_ptr, peer, index, 1, EQUAL=True)


class Int32Ptr:
    """A raw device address that Triton kernels accept as an ``int32`` pointer (a peer's flag)."""

    def __init__(self, addr: int) -> None:
        import torch

        self.addr = int(addr)
        self.dtype = torch.int32

    def data_ptr(self) -> int:
        return self.addr

    def numel(self) -> int:
        return 1


def _check_flag(t: Any, what: str) -> None:
    import torch

    if t.dtype != torch.int32:
        raise ValueError(f"{what}: expected an int32 tensor, got {t.dtype}")
    if t.numel() < 1:
        raise ValueError(f"{what}: empty tensor")


def advance_epoch(epoch: Any) -> None:
    """Increment the device-resident ``epoch`` (int32, 1 element) on the current stream."""
    _check_flag(epoch, "epoch")
    _advance_epoch_kernel[(1,)](epoch, num_warps=1)


def signal(flag: Any, epoch: Any, offset: int = 0) -> None:
    """Store ``epoch + offset`` into ``flag`` (release, system scope) on the current stream."""
    _check_flag(flag, "flag")
    _check_flag(epoch, "epoch")
    _signal_kernel[(1,)](flag, epoch, OFFSET=offset, num_warps=1)


def wait(flag: Any, epoch: Any, offset: int = 0, watch: Any = None, peer: int = -1, index: int = -1) -> None:
    """Block the current stream until ``flag >= epoch + offset`` (acquire, system scope), at most the bound
    of the watch slot ``watch`` (None: the process's slot for unnamed launches); ``peer`` raises the flag
    and ``index`` names it in the record of a wait that gave up."""
    _check_flag(flag, "flag")
    _check_flag(epoch, "epoch")
    if watch is None:
        watch = unnamed_slot(epoch.device)
    _wait_kernel[(1,)](flag, epoch, watch, peer, index, OFFSET=offset, num_warps=1)


# -- NVIDIA stream memory operations ---------------------------------------------------------------


def memop_available() -> str | None:
    """None when ``cuStreamWriteValue32``/``cuStreamWaitValue32`` can be used here, else why not."""
    import torch

    if not torch.cuda.is_available() or torch.version.hip is not None:
        return "stream memops need an NVIDIA GPU"
    try:
        from cuda.bindings import driver
    except ImportError:
        return "cuda.bindings (cuda-python) is not installed"
    for name in ("cuStreamWriteValue32", "cuStreamWaitValue32"):
        if not hasattr(driver, name):
            return f"cuda.bindings.driver has no {name}"
    err, version = driver.cuDriverGetVersion()
    if int(err) != 0 or version < 12000:
        return f"CUDA driver {version} is older than 12.0"
    return None


def _driver():
    from cuda.bindings import driver

    return driver


def _check(result: tuple, what: str) -> None:
    err = result[0]
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")


def _stream(stream: Any):
    return _driver().CUstream(int(stream.cuda_stream))


def memop_write(addr: int, value: int, stream: Any) -> None:
    """``cuStreamWriteValue32(addr, value)`` on ``stream`` (with the default memory barrier before it)."""
    drv = _driver()
    flags = drv.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
    _check(
        drv.cuStreamWriteValue32(_stream(stream), drv.CUdeviceptr(addr), value, flags), "cuStreamWriteValue32"
    )


def memop_wait_eq(
    addr: int, value: int, stream: Any, watch: Any = None, peer: int = -1, index: int = -1
) -> None:
    """Block ``stream`` until the ``int32`` at ``addr`` equals ``value`` (acquire, system scope): a 1-program
    spin kernel bounded by the watch slot ``watch`` as in :func:`wait` (``cuStreamWaitValue32``, the memop
    that would take no SM, cannot time out)."""
    import torch

    if watch is None:
        watch = unnamed_slot(stream.device)
    with torch.cuda.stream(stream):
        _wait_eq_kernel[(1,)](Int32Ptr(addr), value, watch, peer, index, num_warps=1)


def memcpy_async(dst: int, src: int, nbytes: int, stream: Any) -> None:
    """A copy-engine copy of ``nbytes`` from ``src`` to ``dst`` (unified addresses, peers included)."""
    drv = _driver()
    _check(
        drv.cuMemcpyAsync(drv.CUdeviceptr(dst), drv.CUdeviceptr(src), nbytes, _stream(stream)),
        "cuMemcpyAsync",
    )
