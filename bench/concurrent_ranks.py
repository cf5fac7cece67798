"""The fused kernels (``push``, ``push_tma``, ``pull``) on N ranks emulated on one GPU, every rank's kernel
running at once on its share of the SMs: what their waits on peers cost when they spin (issue 47).

    CUDA_DEVICE_MAX_CONNECTIONS=32 python -P bench/concurrent_ranks.py --world-size 4 \\
        --variants push,push_tma --shapes 1024x2560x8192:nk,4096x2560x8192:nk [--configs 2] [--calls 20] \\
        [--json-out concurrent.json]

The emulation tests run a fused kernel in phases (every rank's producers, then every rank's consumers), so
nothing waits. Here every rank is prepared as the tuner prepares it (:func:`autotaxer.tools.emulated_ranks
.emulate`, each rank's context on :func:`~autotaxer.tools.emulated_ranks.sms_per_rank` SMs, so that the N
grids are resident together) and a call is enqueued behind a gate (a sleep kernel longer than the host
takes to enqueue it), so that every rank's kernel starts together and its tiles wait on the peers' pushes
as on real peers. Before the timed calls, each rank's kernel is loaded by a call of its own whose waits give
up at once (its watch slot's bound set to 0; the flags, queues and slot are then reset), because CUDA may
not load a kernel while another spins. That first call compiles the kernel once per rank specialisation
(Triton specialises the rank argument: 0, 1 and the rest), and each value of
``$AUTOTAXER_WAIT_CHECK_AFTER_US`` is a kernel of its own. A load call that has not ended after
``limit_s`` ends the script naming the rank and its watch slot: on 2026-11-29 such calls hung, their waits
having given up, until the kernels' give-up decision was made one for the CTA
(``bench/results/2026-11-29_give_up_hang_h200``).

A row (variant, shape, configuration): the slowest rank's time from the gate's end (µs, median over
``--calls``), each rank's median, every rank's output on every call against fp32 (NaN-poisoned, fresh inputs),
waits that gave up, and ``$AUTOTAXER_WAIT_CHECK_AFTER_US`` as this process read it: run the script once
unset and once with e.g. ``10000`` for the A/B of the shared waits' bound reads (after that threshold they
read the bound from pinned host memory on every poll; ``ce_persistent``'s tiles stalled on such reads,
``bench/results/2026-11-29_bound_reads_h200``). The peers' rows move through one GPU's HBM, not NVLink, and
each rank has a quarter of the SMs at four ranks: the rows show what waiting costs, not a 4-GPU time.
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from rank0_view import _cycles_per_us, emulation_parser, has_32_queues, parse_shapes  # noqa: E402

#: The fused variants whose kernels wait on peers in the kernel (the copy-engine family waits on streams).
FUSED = ("push", "push_tma", "pull")


def _load_kernels(variant: Any, works: list, ctxs: list, mains: list, inputs: list, outs: list,
                  *, limit_s: float = 120.0) -> None:  # fmt: skip
    """Every rank's kernel compiled and loaded by a call of its own whose waits give up at once (its watch
    slot's bound 0); then every workspace's flags, queue and slot as a fresh one has them (its bound and
    alarm address kept, its compiled launches too). A call that has not ended ``limit_s`` after it was
    enqueued ends the script (exit 1) naming the rank and its slot's words."""
    import time

    import torch
    from autotaxer.kernels.common.watch import ALARM, BOUND

    from autotaxer.tools.emulated_ranks import call_giving_up

    slots = [work.buffers["watch"].tensor for work in works]
    kept = [(int(slot[BOUND]), int(slot[ALARM])) for slot in slots]
    for r, work in enumerate(works):
        t0 = time.monotonic()
        gave_up = call_giving_up(variant, work, ctxs[r], mains[r], inputs[r], outs[r], limit_s)
        if gave_up is None:
            words = slots[r].tolist()
            raise SystemExit(f"concurrent_ranks: rank {r}'s load call (bound 0) has not ended "
                             f"{limit_s:.0f} s after it was enqueued; watch slot {words}")  # fmt: skip
        print(f"    rank {r} loaded in {time.monotonic() - t0:.1f} s ({gave_up} waits gave up)", flush=True)
    torch.cuda.synchronize()
    for work, slot, (bound, alarm) in zip(works, slots, kept, strict=True):
        work.buffers["flags"].zero_()
        work.buffers["sync"].zero_()
        slot.zero_()
        slot[BOUND], slot[ALARM] = bound, alarm
    torch.cuda.synchronize()


def run_case(variant_name: str, key: Any, params: dict[str, Any], *, calls: int, gate_cycles: int) -> dict:
    """``calls`` timed calls (after 2 untimed) of one configuration on every emulated rank at once."""
    import time

    import torch
    from autotaxer.kernels.common.watch import GAVE_UP

    from autotaxer.ops import relative_error
    from autotaxer.tools.emulated_ranks import emulate

    t0 = time.monotonic()
    op, variant, ctxs, works, mains = emulate(
        "ag_gemm", variant_name, key, params, heap_bytes=1 << 30, share_sms=True, warm_up=False
    )
    ws, device = key.world_size, torch.device("cuda")
    inputs = [op.make_inputs(key, r, device, 0) for r in range(ws)]
    setup_s = time.monotonic() - t0
    print(
        f"  {variant_name} {key.text}: prepared in {setup_s:.0f} s; loading every rank's kernel", flush=True
    )
    _load_kernels(variant, works, ctxs, mains, inputs, [op.empty_output(key, device) for _ in range(ws)])
    load_s = time.monotonic() - t0 - setup_s
    print(f"  loaded in {load_s:.0f} s; {calls + 2} gated calls", flush=True)
    gate = torch.cuda.Stream()
    start = torch.cuda.Event(enable_timing=True)
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(ws)]
    per_rank: list[list[float]] = [[] for _ in range(ws)]
    slowest, worst_error = [], 0.0
    for call in range(calls + 2):
        inputs = [op.make_inputs(key, r, device, call + 1) for r in range(ws)]
        outs = [op.empty_output(key, device).fill_(float("nan")) for _ in range(ws)]
        gate.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(gate):
            torch.cuda._sleep(gate_cycles)
            start.record()
        for r in range(ws):
            mains[r].wait_event(start)
            with torch.cuda.stream(mains[r]):
                variant.run(works[r], inputs[r], ctxs[r], out=outs[r])
                ends[r].record()
        torch.cuda.synchronize()
        errors = [relative_error(outs[r], op.reference(key, r, device, call + 1)) for r in range(ws)]
        bad = [f"rank {r}: {e:.2e}" for r, e in enumerate(errors) if not (e == e and e < 1e-2)]
        if bad:
            raise SystemExit(f"{variant_name} {key.text} {params} call {call}: WRONG ({', '.join(bad)})")
        worst_error = max(worst_error, *errors)
        if call >= 2:
            times = [start.elapsed_time(e) * 1000.0 for e in ends]
            for r in range(ws):
                per_rank[r].append(times[r])
            slowest.append(max(times))
    gave_up = sum(int(w.buffers["watch"].tensor[GAVE_UP]) for w in works)
    return {
        "slowest_us": round(statistics.median(slowest), 1),
        "rank_us": [round(statistics.median(t), 1) for t in per_rank],
        "max_error": worst_error,
        "gave_up": gave_up,
        "setup_s": round(setup_s, 1),
        "load_s": round(load_s, 1),
        "calls_s": round(time.monotonic() - t0 - setup_s - load_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = emulation_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="push,push_tma")
    args = parser.parse_args(argv)
    if not has_32_queues(
        "concurrent_ranks", "each rank's spinning kernel must have a hardware queue of its own"
    ):
        return 2
    unknown = sorted(set(filter(None, args.variants.split(","))) - set(FUSED))
    if unknown:
        print(
            f"concurrent_ranks: --variants: {', '.join(unknown)} not one of {', '.join(FUSED)}",
            file=sys.stderr,
        )
        return 2

    import torch
    from autotaxer.kernels.common.watch import check_after_ns

    from autotaxer import ProblemKey
    from autotaxer.ops import get_op
    from autotaxer.tools.emulated_ranks import rank_target

    ws = args.world_size
    share = rank_target(ws)
    gate_cycles = int(args.gate_us * _cycles_per_us())
    rows = []
    for name in filter(None, args.variants.split(",")):
        variant = get_op("ag_gemm").variants[name]
        for m, n, k, layout in parse_shapes(args.shapes):
            key = ProblemKey.make("ag_gemm", share.gpu_model, ws, "bf16", {"M": m, "N": n, "K": k},
                                  {"gather_dim": 0, "b_layout": layout})  # fmt: skip
            seeds = [variant.complete_params(p) for p in variant.seed_configs(key, share)]
            for params in [p for p in seeds if variant.check(key, share, p) is None][: args.configs]:
                row = {"variant": name, "key": key.text, "params": params, "world_size": ws,
                       "sms_per_rank": share.num_sms, "check_after_us": check_after_ns() / 1000}  # fmt: skip
                row.update(run_case(name, key, params, calls=args.calls, gate_cycles=gate_cycles))
                rows.append(row)
                print(f"{name:9s} {m}x{n}x{k}:{layout} check_after {row['check_after_us']:g} us: slowest "
                      f"{row['slowest_us']} us, ranks {row['rank_us']}, gave up {row['gave_up']} | {params}",
                      flush=True)  # fmt: skip
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
