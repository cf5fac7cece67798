"""``autotaxer.async_tp`` on GPUs: a sequence-parallel block compiled with PyTorch's async TP
(``_micro_pipeline_tp`` on, symmetric memory enabled for the group), trained one step at a time:

1. no tuned record: the compiled code holds torch's fused ops, torch's kernels run them (counters);
2. a table with a record for every key the first step decided (what a warm-up or ``autotaxer misses`` +
   ``tune`` gives): the same compiled code, every call served by autotaxer's dispatch;
3. ``disable()``: torch's kernels again.

Each step's output and gradients are checked against the unsharded block in fp32 and against the same
block uncompiled (plain PyTorch, functional collectives), both in bf16.
"""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks

TOL = 3e-2  # bf16 block outputs and gradients against fp32
#: Variants tried first for the records of the test table (then the next, down to the baseline).
PREFERRED = {"ag_gemm": ("push", "copy_engine", "pull", "bsp"), "gemm_rs": ("push", "copy_engine", "bsp")}


def _table_for(ctx, rt, path: str) -> dict[str, str]:
    """Rank 0 writes a record for every key ``rt`` decided (a fused variant where one fits); returns
    key -> variant."""
    import torch.distributed as dist

    from autotaxer.ops import get_op
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table

    records, chosen = [], {}
    for key in rt.decisions():
        op = get_op(key.op)
        available = op.available_variants(ctx.target)
        for name in PREFERRED[key.op]:
            v = available.get(name)
            if v is None:
                continue
            seeds = [c for c in v.seed_configs(key, ctx.target) if v.check(key, ctx.target, c) is None]
            params = seeds[0] if seeds else v.default_params(key, ctx.target)
            if v.check(key, ctx.target, params) is None:
                break
        rec = WinnerRecord(key, name, params, 5.0, 9.0, 1, arch=ctx.target.arch, num_sms=ctx.target.num_sms)
        records.append(rec)
        chosen[key.text] = name
    if ctx.rank == 0:
        write_table(records, path)
    dist.barrier()
    return chosen


def _compiled_block(ctx, table_dir: str) -> dict:
    import warnings

    import torch
    import torch._functorch.config
    import torch._inductor.config
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as symm_mem
    from torch._inductor.utils import run_and_get_code

    import autotaxer
    import autotaxer.async_tp as atp
    from autotaxer.ops import relative_error
    from autotaxer.testing.sp_block import BlockShape, reference_step, shard_weights, sharded_step, sp_block

    torch._inductor.config.fx_graph_cache = False  # compile here, so that the code is seen
    if hasattr(torch._functorch.config, "enable_autograd_cache"):
        torch._functorch.config.enable_autograd_cache = False
    torch._inductor.config._micro_pipeline_tp = True
    group, ws, rank = dist.group.WORLD, ctx.world_size, ctx.rank
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated in 2.13, still what the pass checks
        symm_mem.enable_symm_mem_for_group(group.group_name)

    shape = BlockShape(seq=256 * ws, batch=2, hidden=512, ffn=1024 * ws)
    full, x_full, loss_weight, want = reference_step(shape, rank, ws, ctx.device)  # fp32, unsharded
    w = shard_weights(full, rank, ws, torch.bfloat16)
    x = x_full.chunk(ws)[rank].to(torch.bfloat16).contiguous().requires_grad_()

    def step(fn) -> dict:
        return sharded_step(fn, x, w, loss_weight.chunk(ws)[rank], group)

    def errors(got: dict, against: dict) -> dict:
        return {k: relative_error(got[k].float(), against[k].float()) for k in want}

    out: dict = {}
    plain = step(lambda x, w: sp_block(x, w, group))
    out["plain"] = errors(plain, want)

    cfg = {"env_tables": False, "shipped_tables": False, "persist_misses": False}
    rt = autotaxer.init(autotaxer.RuntimeConfig(**cfg))
    atp.enable()
    atp.reset_counters()
    try:
        compiled = torch.compile(lambda x, w: sp_block(x, w, group), fullgraph=True)
        got, codes = run_and_get_code(step, compiled)
        code = "\n".join(codes)
        out["code"] = {op: code.count(f"symm_mem.{op}") for op in atp.OPS}
        out["untuned"] = (errors(got, want), errors(got, plain), atp.counters())
        out["chosen"] = _table_for(ctx, rt, f"{table_dir}/table.json")
        autotaxer.init(autotaxer.RuntimeConfig(tables=(f"{table_dir}/table.json",), **cfg))
        atp.reset_counters()
        for _ in range(2):  # two steps: the second on the plans made by the first
            got = step(compiled)
        out["tuned"] = (errors(got, want), errors(got, plain), atp.counters())
        out["served"] = [(c["op"], c["key"], c["served"]) for c in atp.decisions()]
        atp.disable()
        atp.reset_counters()
        got = step(compiled)
        out["disabled"] = (errors(got, want), errors(got, plain), atp.counters())
    finally:
        atp.disable()
    return out


def _check(results: list[dict]) -> None:
    for r in results:
        assert max(r["plain"].values()) < TOL, r["plain"]
        assert all(n >= 1 for n in r["code"].values()), r["code"]  # inductor emitted torch's fused ops
        calls = {}
        for phase in ("untuned", "tuned", "disabled"):
            vs_ref, vs_plain, counts = r[phase]
            assert max(vs_ref.values()) < TOL, (phase, vs_ref)
            assert max(vs_plain.values()) < TOL, (phase, vs_plain)
            calls[phase] = counts
        for op, c in calls["untuned"].items():
            assert c["autotaxer"] == 0 and c["torch"] >= 1, (op, c)  # no record: torch's kernel
            assert calls["tuned"][op] == {"autotaxer": 2 * c["torch"], "torch": 0}, (op, calls)  # two steps
            # disabled: torch's own kernels run straight from the dispatcher, autotaxer sees no call
            assert calls["disabled"][op] == {"autotaxer": 0, "torch": 0}, (op, calls)
        assert r["served"] and all(served for _, _, served in r["served"]), r["served"]
        assert set(r["chosen"]) == {key for _, key, _ in r["served"]}


@pytest.mark.gpu
def test_compiled_async_tp_block_is_served_by_autotaxer_on_one_gpu(tmp_path) -> None:
    _check(run_ranks(_compiled_block, 1, "cuda", args=(str(tmp_path),), timeout=600))


@pytest.mark.gpu(world_size=2)
def test_compiled_async_tp_block_is_served_by_autotaxer_on_two_gpus(tmp_path) -> None:
    _check(run_ranks(_compiled_block, 2, "cuda", args=(str(tmp_path),), timeout=600))
