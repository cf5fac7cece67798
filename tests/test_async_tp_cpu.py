"""``autotaxer.async_tp`` without GPUs: the kernel override of torch's two fused ops is registered and removed
cleanly, and on gloo ranks (the kernels registered for the CPU key, torch's own kernel in its test mode,
which computes with functional collectives) every call is served by autotaxer where the table has a record
and by torch's kernel elsewhere, with the values of a float64 reference and the sizes and strides of torch's
meta function, eager and compiled."""

from __future__ import annotations

import pytest

from autotaxer.testing import run_ranks

OPS = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter")
SCALED = ("fused_all_gather_scaled_matmul", "fused_scaled_matmul_reduce_scatter")
#: A runtime that reads only the tables a test names (and writes no misses file).
QUIET_CONFIG = {"shipped_tables": False, "env_tables": False, "persist_misses": False}


def _dumps(names: tuple[str, ...]) -> dict[str, str]:
    import torch
    import torch.distributed._symmetric_memory  # noqa: F401  (defines the ops)

    return {n: torch._C._dispatch_dump(f"symm_mem::{n}") for n in names}


@pytest.fixture
def atp(monkeypatch):
    """``autotaxer.async_tp`` as if a CUDA device were visible (``enable`` registers CUDA kernels only)."""
    import torch

    import autotaxer.async_tp as atp

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    atp.disable()
    yield atp
    atp.disable()


def test_enable_overrides_the_cuda_kernels_and_disable_gives_them_back(atp) -> None:
    import torch

    before, scaled, impls = _dumps(OPS), _dumps(SCALED), set(torch.library._impls)
    assert not atp.is_enabled() and atp.unavailable_reason() is None
    atp.enable()
    assert atp.is_enabled()
    for name, dump in _dumps(OPS).items():
        active = [line for line in dump.splitlines() if line.startswith("CUDA:")]
        assert len(active) == 1 and "async_tp.py" in active[0], dump  # autotaxer's kernel is the active one
        assert "CUDA (inactive)" in dump and "_symmetric_memory" in dump, dump  # torch's is kept
        assert dump != before[name]
    assert _dumps(SCALED) == scaled  # the fp8 forms stay torch's
    atp.disable()
    assert not atp.is_enabled()
    assert _dumps(OPS) == before
    assert set(torch.library._impls) == impls  # torch's own registrations still on its books


def test_enable_and_disable_are_idempotent(atp) -> None:
    before = _dumps(OPS)
    atp.enable()
    once = _dumps(OPS)
    atp.enable()
    assert _dumps(OPS) == once  # registered once, not stacked
    atp.disable()
    atp.disable()
    assert _dumps(OPS) == before and not atp.is_enabled()


def test_a_torch_that_cannot_override_is_refused_by_name(atp, monkeypatch) -> None:
    import torch

    def impl_without_override(self, op_name, fn, dispatch_key="", *, with_keyset=False):  # torch <= 2.7
        raise AssertionError("must not be called")

    before = _dumps(OPS)
    monkeypatch.setattr(torch.library.Library, "impl", impl_without_override)
    assert "allow_override" in atp.unavailable_reason() and "2.8" in atp.unavailable_reason()
    with pytest.raises(RuntimeError, match=r"async_tp.enable\(\): torch .* allow_override"):
        atp.enable()
    assert not atp.is_enabled() and _dumps(OPS) == before


def test_a_torch_without_python_kernels_is_refused_by_name(atp, monkeypatch) -> None:
    import torch.distributed._symmetric_memory as symm_mem

    monkeypatch.delattr(symm_mem, "_fused_matmul_reduce_scatter")
    with pytest.raises(RuntimeError, match="_symmetric_memory._fused_matmul_reduce_scatter"):
        atp.enable()
    assert not atp.is_enabled()


def test_enable_without_a_cuda_device_is_refused_by_name(atp, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"async_tp.enable\(\): no CUDA device is visible"):
        atp.enable()
    assert not atp.is_enabled()


def test_counters_reset(atp) -> None:
    atp._STATE.counts["fused_all_gather_matmul"]["torch"] = 3
    assert atp.counters()["fused_all_gather_matmul"] == {"autotaxer": 0, "torch": 3}
    atp.counters()["fused_all_gather_matmul"]["torch"] = 7  # a copy: the caller cannot change the state
    atp.reset_counters()
    assert atp.counters() == {name: {"autotaxer": 0, "torch": 0} for name in OPS}


# -- on gloo ranks ----------------------------------------------------------------------------------
def _ag_cases(ws: int) -> list[tuple]:
    """(A_shard shape, gather_dim, number of Bs, B layouts, return_A), K the last dim of A_shard."""
    return [
        ((4, 3, 8), 0, 1, "kn", True),
        ((4, 3, 8), 0, 2, "nk", False),
        ((3, 4, 8), 1, 2, "kn", True),  # a middle gather dim: outputs strided like torch's
        ((3, 4, 8), 2, 1, "nk", True),  # the last dim: K is gathered
        ((6, 8), 0, 1, "nk", False),
        ((6, 8), 1, 3, "kn", True),
    ]


def _rs_cases(ws: int) -> list[tuple]:
    """(A shape, scatter_dim, B layout, reduce_op); the scattered dim divisible by the world size."""
    return [
        ((4 * ws, 3, 8), 0, "kn", "sum"),
        ((3, 4 * ws, 8), 1, "nk", "avg"),  # a middle scatter dim: torch's meta gives a contiguous result
        ((3, 4, 8), 2, "kn", "sum"),  # N is scattered
        ((4 * ws, 8), 0, "nk", "avg"),
    ]


def _b(k: int, n: int, layout: str, seed: int, dtype):
    import torch

    g = torch.Generator().manual_seed(seed)
    if layout == "nk":
        return torch.randn((n, k), generator=g, dtype=dtype).t()
    return torch.randn((k, n), generator=g, dtype=dtype)


def _gather(t, dim: int):
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=dim)


def _layout(t) -> tuple:
    return tuple(t.shape), tuple(s for s, n in zip(t.stride(), t.shape, strict=True) if n > 1)


def _meta_layouts(op, *args, **kwargs) -> list:
    import torch

    meta = [
        [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta") for x in a]
        if isinstance(a, list)
        else torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
        if isinstance(a, torch.Tensor)
        else a
        for a in args
    ]
    out = op(*meta, **kwargs)
    flat = [out] if isinstance(out, torch.Tensor) else [out[0], *out[1]]
    return [None if t is None else _layout(t) for t in flat]


def _run_cases(ctx, compiled: bool) -> list[dict]:
    """Every case once: value error against float64 and whether outputs match torch's meta layout."""
    import torch
    import torch.distributed as dist

    group_name = dist.group.WORLD.group_name
    ws, results = ctx.world_size, []

    def compile_each(op):  # the graph calls the op through the dispatcher, as inductor's fallback kernels do
        def call(*args, **kwargs):
            torch._dynamo.reset()  # one graph per case (no recompile limit across cases)
            return torch.compile(op, backend="aot_eager", fullgraph=True)(*args, **kwargs)

        return call

    fused_ag = torch.ops.symm_mem.fused_all_gather_matmul.default
    fused_rs = torch.ops.symm_mem.fused_matmul_reduce_scatter.default
    if compiled:
        fused_ag, fused_rs = compile_each(fused_ag), compile_each(fused_rs)
    for i, (shape, gd, nb, layout, return_a) in enumerate(_ag_cases(ws)):
        g = torch.Generator().manual_seed(100 * i + ctx.rank)
        a = torch.randn(shape, generator=g)
        bs = [
            _b(shape[-1] * (ws if gd == len(shape) - 1 else 1), 5 + j, layout, i + j, a.dtype)
            for j in range(nb)
        ]
        want_a = _gather(a.double(), gd)
        args = (a, bs, gd, group_name)
        got_a, outs = fused_ag(*args, return_A=return_a)
        meta = _meta_layouts(torch.ops.symm_mem.fused_all_gather_matmul.default, *args, return_A=return_a)
        errs = [float((o.double() - want_a @ b.double()).abs().max()) for o, b in zip(outs, bs, strict=True)]
        if return_a:
            errs.append(float((got_a.double() - want_a).abs().max()))
        got = [None if got_a is None else _layout(got_a), *(_layout(o) for o in outs)]
        results.append({"case": ("ag", i), "err": max(errs), "layout_ok": got == meta, "meta": meta})
    for i, (shape, sd, layout, reduce_op) in enumerate(_rs_cases(ws)):
        g = torch.Generator().manual_seed(200 * i + ctx.rank)
        a = torch.randn(shape, generator=g)
        b = _b(shape[-1], 6 * ws, layout, 50 + i + 7 * ctx.rank, a.dtype)
        full = _gather((a.double() @ b.double()).unsqueeze(0), 0).sum(0)
        if reduce_op == "avg":
            full = full / ws
        want = full.chunk(ws, dim=sd)[ctx.rank]
        out = fused_rs(a, b, reduce_op, sd, group_name)
        meta = _meta_layouts(
            torch.ops.symm_mem.fused_matmul_reduce_scatter.default, a, b, reduce_op, sd, group_name
        )
        err = float((out.double() - want).abs().max())
        results.append({"case": ("rs", i), "err": err, "layout_ok": [_layout(out)] == meta, "meta": meta})
    return results


def _table_for(
    ctx, rt, path: str, ag_variant: str = "bsp", fastest: str | None = None, isolated: str | None = None
) -> int:
    """A table with a record for every key the runtime has decided: the warm-up a user's launch does
    (``ag_gemm``'s winner ``ag_variant``: ``bsp`` hands out the gathered A, ``cpu_chunked`` does not;
    ``fastest``: the fastest form each record says it measured, ``env["fastest_form"]``; ``isolated``:
    the one fastest alone where an in-step check found another, ``env["fastest_form_isolated"]``)."""
    from autotaxer.ops import get_op
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table

    records = []
    for key in rt.decisions():
        name = ag_variant if key.op == "ag_gemm" else "bsp"
        params = {"chunks": 1, "order": "rotated"} if name == "cpu_chunked" else {}
        assert get_op(key.op).variants[name].check(key, ctx.target, params) is None
        env = {"fastest_form": fastest} if fastest else {}
        if isolated:
            env.update(in_step="replaced", in_step_winner="cpu_chunked", fastest_form_isolated=isolated)
        records.append(WinnerRecord(key, name, params, 5.0, 9.0, 4, env=env, device_type="cpu"))
    if ctx.rank == 0:
        write_table(records, path)
    import torch.distributed as dist

    dist.barrier()
    return len(records)


def _served_and_fallback(ctx, table_dir: str) -> dict:
    import warnings

    import torch
    import torch.distributed._symmetric_memory as symm_mem

    import autotaxer
    import autotaxer.async_tp as atp

    def init(tables: tuple[str, ...]):
        return autotaxer.init(autotaxer.RuntimeConfig(tables=tables, **QUIET_CONFIG))

    out: dict = {}
    rt = init(())
    atp._install("CPU")
    try:
        with symm_mem._test_mode():
            out["untuned"] = _run_cases(ctx, compiled=False)  # no record: torch's kernel for every call
            out["untuned_counts"] = atp.counters()
            out["records"] = _table_for(ctx, rt, f"{table_dir}/t.json")
            rt = init((f"{table_dir}/t.json",))  # a new runtime: decisions are made again
            atp.reset_counters()
            out["tuned"] = _run_cases(ctx, compiled=False)
            out["tuned_counts"] = atp.counters()
            out["decisions"] = atp.decisions()
            atp.reset_counters()
            out["compiled"] = _run_cases(ctx, compiled=True)
            out["compiled_counts"] = atp.counters()
            _table_for(ctx, rt, f"{table_dir}/no_saving.json", "cpu_chunked")
            rt = init((f"{table_dir}/no_saving.json",))
            atp.reset_counters()
            out["no_saving"] = _run_cases(ctx, compiled=False)
            out["no_saving_counts"] = atp.counters()
            out["no_saving_served"] = [c["served"] for c in atp.decisions()]
            # the records say BSP was the fastest form: it serves the calls that return A (served())
            _table_for(ctx, rt, f"{table_dir}/no_saving_bsp.json", "cpu_chunked", fastest="bsp")
            rt = init((f"{table_dir}/no_saving_bsp.json",))
            atp.reset_counters()
            before = autotaxer.served()
            out["no_saving_bsp"] = _run_cases(ctx, compiled=False)
            out["no_saving_bsp_counts"] = atp.counters()
            rows = autotaxer.served(since=before)
            out["no_saving_bsp_rows"] = sorted(
                {(s.path, s.variant, s.status) for s in rows if s.key.startswith("ag_gemm")}
            )
            out["no_saving_bsp_calls"] = sum(s.calls for s in rows if s.key.startswith("ag_gemm"))
            # BSP served after an in-step check where torch's kernel ran faster alone: torch's kernel runs
            out["checked_bsp_records"] = _table_for(
                ctx, rt, f"{table_dir}/checked_bsp.json", fastest="bsp", isolated="torch_fused"
            )
            rt = init((f"{table_dir}/checked_bsp.json",))
            atp.reset_counters()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out["checked_bsp"] = _run_cases(ctx, compiled=False)
            out["checked_bsp_counts"] = atp.counters()
            out["checked_bsp_calls"] = [(c["served"], c["key"] is not None) for c in atp.decisions()]
            out["checked_bsp_warned"] = [str(w.message) for w in caught if "async_tp" in str(w.message)]
            # ... and BSP still serves where the check's record says BSP was the fastest alone too
            out["checked_bsp_alone_records"] = _table_for(
                ctx, rt, f"{table_dir}/checked_bsp_alone.json", fastest="bsp", isolated="bsp"
            )
            init((f"{table_dir}/checked_bsp_alone.json",))
            atp.reset_counters()
            out["checked_bsp_alone"] = _run_cases(ctx, compiled=False)
            out["checked_bsp_alone_counts"] = atp.counters()
            atp.reset_counters()
            a = torch.randn(4, 8, dtype=torch.float64)  # a dtype autotaxer does not take: torch's kernel
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _, (c,) = torch.ops.symm_mem.fused_all_gather_matmul(a, [a.t()], 0, "0")
            out["fp64"] = (
                float((c - _gather(a, 0) @ a.t()).abs().max()),
                atp.counters()["fused_all_gather_matmul"],
                [str(w.message) for w in caught if "async_tp" in str(w.message)],
            )
    finally:
        atp.disable()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_calls_are_served_where_tuned_and_torchs_elsewhere(tmp_path, world_size: int) -> None:
    n_ag, n_rs = len(_ag_cases(world_size)), len(_rs_cases(world_size))
    for r in run_ranks(_served_and_fallback, world_size, "cpu", args=(str(tmp_path),), timeout=600):
        for phase in (
            "untuned",
            "tuned",
            "compiled",
            "no_saving",
            "no_saving_bsp",
            "checked_bsp",
            "checked_bsp_alone",
        ):
            for case in r[phase]:
                assert case["err"] < 1e-4, (phase, case)  # NaN fails too
                assert case["layout_ok"], (phase, case)
        assert r["untuned_counts"] == {
            "fused_all_gather_matmul": {"autotaxer": 0, "torch": n_ag},
            "fused_matmul_reduce_scatter": {"autotaxer": 0, "torch": n_rs},
        }
        assert r["records"] >= 4  # the keys the calls were decided on: a miss each
        for phase in ("tuned_counts", "compiled_counts", "checked_bsp_alone_counts"):
            assert r[phase] == {
                "fused_all_gather_matmul": {"autotaxer": n_ag, "torch": 0},
                "fused_matmul_reduce_scatter": {"autotaxer": n_rs, "torch": 0},
            }, phase
        calls = r["decisions"]
        assert len(calls) == n_ag + n_rs and all(c["served"] for c in calls)
        ag = calls[0]  # the first case, as decisions() describes it for a replay
        assert ag["op"] == "fused_all_gather_matmul" and ag["inputs"][0] == ((4, 3, 8), (24, 8, 1), "float32")
        assert ag["args"] == {"gather_dim": 0, "group_name": "0", "return_A": True}
        assert ag["key"].startswith(f"ag_gemm|cpu|{world_size}|fp32|M={12 * world_size},N=5,K=8")
        # a winner that cannot hand out the gathered A leaves the calls that return it to torch's kernel
        needs_a = [return_a or nb > 1 for _, _, nb, _, return_a in _ag_cases(world_size)]
        assert r["no_saving_counts"]["fused_all_gather_matmul"] == {
            "autotaxer": needs_a.count(False), "torch": needs_a.count(True)
        }  # fmt: skip
        assert r["no_saving_served"][:n_ag] == [not n for n in needs_a]
        # ... unless the records name the fastest form that hands it out: that form serves them
        assert r["no_saving_bsp_counts"]["fused_all_gather_matmul"] == {"autotaxer": n_ag, "torch": 0}
        assert r["no_saving_bsp_rows"] == [
            ("async_tp", "bsp", "fell back"),
            ("async_tp", "cpu_chunked", "tuned"),
        ]
        assert r["no_saving_bsp_calls"] == n_ag
        # BSP served after an in-step check, torch's kernel faster alone: torch's kernel runs, quietly
        assert r["checked_bsp_counts"] == {
            "fused_all_gather_matmul": {"autotaxer": 0, "torch": n_ag},
            "fused_matmul_reduce_scatter": {"autotaxer": 0, "torch": n_rs},
        }
        assert r["checked_bsp_records"] == r["checked_bsp_alone_records"] == r["records"]
        assert r["checked_bsp_calls"] == [(False, True)] * (n_ag + n_rs)  # decided on a tuned key
        assert r["checked_bsp_warned"] == []
        err, counts, warned = r["fp64"]
        assert err < 1e-9 and counts == {"autotaxer": 0, "torch": 1}
        assert warned and "torch's kernel runs ag_gemm" in warned[0] and "dtype" in warned[0]


def _sp_block_errors(ctx) -> dict:
    """The helper block of the GPU tests on gloo: output and gradients of the sharded block in eager
    PyTorch against the unsharded block (what the compiled runs are checked against on GPUs)."""
    import torch
    import torch.distributed as dist

    from autotaxer.ops import relative_error
    from autotaxer.testing.sp_block import BlockShape, reference_step, shard_weights, sharded_step, sp_block

    shape, ws, rank, group = (
        BlockShape(seq=8, batch=2, hidden=16, ffn=12),
        ctx.world_size,
        ctx.rank,
        dist.group.WORLD,
    )
    full, x_full, loss_weight, want = reference_step(shape, rank, ws, "cpu", torch.float64, seed=3)
    w = shard_weights(full, rank, ws, torch.float64)
    x = x_full.chunk(ws)[rank].clone().requires_grad_()
    got = sharded_step(lambda x, w: sp_block(x, w, group), x, w, loss_weight.chunk(ws)[rank], group)
    return {k: relative_error(got[k], want[k]) for k in want}


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_sp_block_helper_equals_the_unsharded_block(world_size: int) -> None:
    for errs in run_ranks(_sp_block_errors, world_size, "cpu", timeout=300):
        assert max(errs.values()) < 1e-12, errs


def _warm_up_compiled(ctx, tmp: str) -> dict:
    """A compiled step whose graph holds torch's fused ops only when compiled (as inductor's micro-pipeline
    pass leaves them: eager code all-gathers and multiplies), warmed up with async TP on."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.distributed._symmetric_memory as symm_mem

    import autotaxer
    import autotaxer.async_tp as atp

    group_name, ws = dist.group.WORLD.group_name, ctx.world_size
    autotaxer.init(autotaxer.RuntimeConfig(db_url=f"sqlite:///{tmp}/w.sqlite", **QUIET_CONFIG))
    g = torch.Generator().manual_seed(7 + ctx.rank)
    a, b_up = torch.randn(8, 16, generator=g), torch.randn(16, 12, generator=g)
    b_down = torch.randn(12, 16, generator=g)

    def block(a, b_up, b_down):
        if torch.compiler.is_compiling():
            # return_A=False: served whichever variant wins (a winner that cannot hand out A leaves
            # return_A calls to torch, see test_calls_are_served_where_tuned_and_torchs_elsewhere)
            _, (h,) = torch.ops.symm_mem.fused_all_gather_matmul(a, [b_up], 0, group_name, return_A=False)
            return torch.ops.symm_mem.fused_matmul_reduce_scatter(h, b_down, "sum", 0, group_name)
        h = funcol.all_gather_tensor(a, 0, group_name) @ b_up
        return funcol.reduce_scatter_tensor(h @ b_down, "sum", 0, group_name)

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    want = _gather(a.double(), 0) @ b_up.double() @ b_down.double()
    want = _gather(want.unsqueeze(0), 0).sum(0).chunk(ws)[ctx.rank]
    out: dict = {}
    atp._install("CPU")
    try:
        with symm_mem._test_mode():
            compiled(a, b_up, b_down)
            out["before"] = atp.counters()
            atp.reset_counters()
            report = autotaxer.warmup(
                lambda: compiled(a, b_up, b_down), budget_s=120, trials=2, variants=("cpu_chunked",),
                progress=False,
            )  # fmt: skip
            out["warmup"] = [(r.key, r.status) for r in report.results]
            atp.reset_counters()
            got = compiled(a, b_up, b_down)
            out["after"] = atp.counters()
            out["err"] = float((got.double() - want).abs().max())
            out["served"] = sorted(c["key"] for c in atp.decisions() if c["served"])
    finally:
        atp.disable()
    return out


@pytest.mark.slow
def test_warmup_tunes_the_fused_calls_of_compiled_code_and_they_are_served_next(tmp_path) -> None:
    for r in run_ranks(_warm_up_compiled, 2, "cpu", args=(str(tmp_path),), timeout=600):
        one_each = {"fused_all_gather_matmul": 1, "fused_matmul_reduce_scatter": 1}
        assert {op: c["torch"] for op, c in r["before"].items()} == one_each  # untuned: torch's kernels
        keys = sorted(k for k, _ in r["warmup"])
        assert [k.split("|")[0] for k in keys] == ["ag_gemm", "gemm_rs"], r["warmup"]  # seen only compiled
        assert all(status == "tuned" for _, status in r["warmup"]), r["warmup"]
        assert {op: c["autotaxer"] for op, c in r["after"].items()} == one_each  # the winners serve them
        assert r["served"] == keys
        assert r["err"] < 1e-4  # NaN fails too
