"""The portable signal/wait kernels under the Triton interpreter (CPU, ``TRITON_INTERPRET=1``).

Two emulated ranks live in one process: each has a flag array (its "heap") and a device-resident
epoch. Over several calls without any reset, rank 0 signals rank 1's flag with its epoch and rank 1's
wait returns only once the flag has reached its own epoch; a wait on a flag still at the last epoch
must not return (checked with a watchdog thread).
"""

from __future__ import annotations

import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import threading

    import torch

    from autotaxer.kernels.common import signal as sig

    epochs = [torch.zeros(1, dtype=torch.int32) for _ in range(2)]
    flags = [torch.zeros(4, dtype=torch.int32) for _ in range(2)]  # per rank: one slot per chunk

    for call in range(1, 6):
        for r in range(2):
            sig.advance_epoch(epochs[r])
        assert epochs[0].item() == call and epochs[1].item() == call, epochs
        # rank 0 -> rank 1, slot 2 (the "peer" flag is rank 1's tensor: host-side translation)
        sig.signal(flags[1][2:3], epochs[0])
        assert flags[1][2].item() == call, flags[1]
        sig.wait(flags[1][2:3], epochs[1])  # must return: flag == epoch
        # the release of "finished the last call" uses offset -1 and is satisfied by the previous value
        sig.wait(flags[1][2:3], epochs[1], offset=-1)

    # A wait for a future epoch must spin until a signal arrives from another thread.
    sig.advance_epoch(epochs[1])
    done = threading.Event()

    def waiter():
        sig.wait(flags[1][2:3], epochs[1])
        done.set()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    t.join(timeout=2.0)
    assert not done.is_set(), "wait returned before the flag reached the epoch"
    # The peer's advance + signal, as plain writes: the interpreter is not thread-safe (it patches
    # triton.language while a kernel runs), so only the waiter thread may interpret now.
    epochs[0] += 1
    flags[1][2] = epochs[0][0]
    t.join(timeout=20.0)
    assert done.is_set(), "wait did not return after the signal"
    assert flags[1].tolist() == [0, 0, 6, 0], flags[1]
    assert flags[0].tolist() == [0, 0, 0, 0], flags[0]

    try:
        sig.signal(torch.zeros(1, dtype=torch.int64), epochs[0])
    except ValueError as exc:
        assert "int32" in str(exc)
    else:
        raise AssertionError("int64 flag accepted")
    print("OK")
    """
)


@pytest.mark.slow
def test_signal_wait_over_epochs_without_reset(interpreter_worker) -> None:
    out = interpreter_worker.run(_SCRIPT, timeout=120)
    assert out.strip().endswith("OK"), out
