"""Dispatch on gloo ranks: BSP fallback and a tuned CPU variant give the reference result; ranks with
different tables, rank-local partial hits and rank-local errors are resolved the same way on every rank
(nobody waits forever)."""

from __future__ import annotations

import pytest
from _factories import rank_key

from autotaxer.testing import run_ranks, run_world_sizes

SEED = 11


def _runtime(tables: tuple[str, ...], group=None):
    import autotaxer

    config = autotaxer.RuntimeConfig(
        tables=tables, env_tables=False, shipped_tables=False, persist_misses=False
    )
    return autotaxer.init(config, group)


def _check(ctx, key, use_out: bool = False) -> float:
    """Dispatch ``key`` on fresh inputs (over ``ctx.group``) and return the relative error against the
    fp32 reference."""
    import autotaxer
    from autotaxer.ops import get_op, relative_error

    op = get_op("ag_gemm")
    a, b = op.make_inputs(key, ctx.rank, ctx.device, SEED + key["M"])
    out = op.empty_output(key, ctx.device) if use_out else None
    c = autotaxer.dispatch("ag_gemm", a, b, gather_dim=key["gather_dim"], out=out, group=ctx.group)
    if use_out:
        assert c is out
    return relative_error(c, op.reference(key, ctx.rank, ctx.device, SEED + key["M"]))


def _fallback_and_tuned(ctx, table_path: str) -> dict:
    """Per layout: an untuned shape (BSP), a tuned one (cpu_chunked, exact) and a near one (nearest),
    dispatched over ``ctx.group`` (the default group, or a subgroup of it)."""
    rt = _runtime((table_path,), ctx.group)
    ws = ctx.world_size
    out = {}
    for gd in (0, 1):
        for label, m in (("fallback", 2 * ws), ("exact", 8 * ws), ("nearest", 10 * ws)):
            key = rank_key(ctx, m, 12, 6 * ws, gd)
            errs = [_check(ctx, key, use_out=i % 2 == 1) for i in range(3)]  # repeated calls: the hot path
            d = rt.decisions()[key]
            out[(gd, label)] = (max(errs), d.variant, d.source)
        # compiling costs seconds per rank: once per layout is enough, over the default group (a subgroup
        # that dispatch has not traced before is unknown to the custom op's fake implementation)
        if ctx.group is None:
            out[(gd, "compiled")] = _compiled_error(ctx, rank_key(ctx, 8 * ws, 12, 6 * ws, gd))
    return out


def _compiled_error(ctx, key) -> tuple[float, str, str]:
    """``torch.compile`` (aot_eager) of a function calling dispatch: the graph holds the custom op."""
    import torch

    import autotaxer
    from autotaxer.ops import get_op, relative_error

    seen: list[str] = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=lambda g, _: g.forward)(gm, example_inputs)

    def f(a, b):
        return autotaxer.dispatch("ag_gemm", a, b, gather_dim=key["gather_dim"], group=ctx.group) * 2.0

    op = get_op("ag_gemm")
    a, b = op.make_inputs(key, ctx.rank, ctx.device, SEED)
    got = torch.compile(f, backend=backend, fullgraph=True)(a, b)
    err = relative_error(got, 2.0 * op.reference(key, ctx.rank, ctx.device, SEED))
    return (
        err,
        "compiled",
        "autotaxer.ag_gemm" if any("autotaxer.ag_gemm" in t for t in seen) else ",".join(seen),
    )


@pytest.fixture(scope="module")
def fallback_and_tuned(tmp_path_factory) -> dict[int, list[dict]]:
    """:func:`_fallback_and_tuned` at 2, 3 and 4 ranks (subgroups of one spawned group of 4, the default
    group at 4), with a table of cpu_chunked records of the tuned shapes at each world size."""
    from autotaxer import ProblemKey
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table

    records = []
    for world_size in (2, 3, 4):
        for gd in (0, 1):
            shape = {"M": 8 * world_size, "N": 12, "K": 6 * world_size}
            k = ProblemKey.make("ag_gemm", "cpu", world_size, "fp32", shape, {"gather_dim": gd})
            params = {"chunks": 2, "order": "rotated"}
            records.append(WinnerRecord(k, "cpu_chunked", params, 5.0, 9.0, 4, device_type="cpu"))
    path = tmp_path_factory.mktemp("tables") / "t.json"
    write_table(records, path)
    return run_world_sizes(_fallback_and_tuned, (2, 3, 4), args=(str(path),), timeout=360)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_fallback_and_tuned_variant_match_the_reference(fallback_and_tuned, world_size: int) -> None:
    results = fallback_and_tuned[world_size]
    assert len(results) == world_size
    for per_rank in results:
        for (gd, label), (err, variant, source) in per_rank.items():
            assert err < 1e-5, (gd, label, err)
            if label == "compiled":
                assert source == "autotaxer.ag_gemm"  # traced as the custom op, with the fake shape
                continue
            assert source == label
            assert variant == ("bsp" if label == "fallback" else "cpu_chunked")
    decisions = [{k: v[1:] for k, v in r.items()} for r in results]
    assert all(d == decisions[0] for d in decisions)


def _different_tables(ctx, paths: list[str]) -> dict:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt = _runtime((paths[ctx.rank],))
        key = rank_key(ctx, 16, 12, 8, 0)
        err = _check(ctx, key)
        other = rank_key(ctx, 64, 12, 8, 0)  # tuned only in rank 1's file
        err2 = _check(ctx, other)
    return {
        "err": max(err, err2),
        "decisions": {k.text: d.digest for k, d in rt.decisions().items()},
        "digest": rt.table.digest,
        "warned": any("different tuning tables" in str(w.message) for w in caught),
    }


@pytest.mark.slow
def test_ranks_with_different_table_files_agree_on_rank_0s(tmp_path) -> None:
    from autotaxer import ProblemKey
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table

    def rec(m: int, chunks: int) -> WinnerRecord:
        k = ProblemKey.make("ag_gemm", "cpu", 2, "fp32", {"M": m, "N": 12, "K": 8}, {"gather_dim": 0})
        return WinnerRecord(
            k, "cpu_chunked", {"chunks": chunks, "order": "ascending"}, 5.0, 9.0, 4, device_type="cpu"
        )

    write_table([rec(16, 2)], tmp_path / "r0.json")
    write_table([rec(16, 4), rec(64, 8)], tmp_path / "r1.json")
    r0, r1 = run_ranks(
        _different_tables, 2, "cpu", args=([str(tmp_path / "r0.json"), str(tmp_path / "r1.json")],)
    )
    assert r0["err"] < 1e-5 and r1["err"] < 1e-5
    assert r0["digest"] == r1["digest"]
    assert r0["decisions"] == r1["decisions"]
    assert '"chunks": 2' in r0["decisions"][_text(16)]  # rank 0's record
    assert '"bsp"' in r0["decisions"][_text(64)]  # rank 1's extra record was dropped with its table
    assert r0["warned"] and r1["warned"]


def _text(m: int) -> str:
    from autotaxer import ProblemKey

    return ProblemKey.make("ag_gemm", "cpu", 2, "fp32", {"M": m, "N": 12, "K": 8}, {"gather_dim": 0}).text


def _rank_local_differences(ctx, bad_path: str) -> dict:
    """Partial hit seen by one rank, a variant only rank 0 can run, rank-local bad input and bad table."""
    import warnings

    import autotaxer
    from autotaxer.ops import get_op
    from autotaxer.ops.ag_gemm.bsp import BspVariant
    from autotaxer.records import WinnerRecord
    from autotaxer.runtime.dispatch import ConsensusError

    class RankZeroOnly(BspVariant):
        name = "rank0_only"
        is_baseline = False

        def unavailable_reason(self, target):
            return None if ctx.rank == 0 else "only rank 0 has it"

    get_op("ag_gemm").register(RankZeroOnly())
    out: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rt = _runtime(())
        rt.load()
        # 1. a record only rank 1 sees (after the table was agreed): rank 0 decides BSP, rank 1 cpu_chunked
        partial = rank_key(ctx, 16, 12, 8, 0)
        if ctx.rank == 1:
            rt.table.records[partial] = WinnerRecord(
                partial, "cpu_chunked", {"chunks": 2, "order": "rotated"}, 5.0, 9.0, 4, device_type="cpu"
            )
        out["partial"] = (_check(ctx, partial), rt.decisions()[partial].variant)
        # 2. rank 0's decision is a variant rank 1 cannot run: everyone takes the baseline
        only0 = rank_key(ctx, 24, 12, 8, 1)
        rt.table.records[only0] = WinnerRecord(only0, "rank0_only", {}, 5.0, 9.0, 4, device_type="cpu")
        out["only0"] = (_check(ctx, only0), rt.decisions()[only0].variant)
        # 3. ranks calling with different problems: every rank raises, nobody hangs
        m = 16 if ctx.rank == 0 else 18
        try:
            _check(ctx, rank_key(ctx, m, 12, 4, 0))
            out["mismatch"] = "no error"
        except ConsensusError as e:
            out["mismatch"] = str(e)
        # 4. a bad input on one rank only: every rank raises with that rank's message
        import torch

        a = torch.randn(4, 8)
        b = torch.randn(8 if ctx.rank == 0 else 7, 12)
        try:
            autotaxer.dispatch("ag_gemm", a, b, gather_dim=0)
            out["bad_input"] = "no error"
        except (ConsensusError, ValueError) as e:
            out["bad_input"] = str(e)
        # 5. a table file that only rank 1 cannot read
        rt2 = autotaxer.Runtime(
            autotaxer.RuntimeConfig(
                tables=(bad_path,) if ctx.rank == 1 else (),
                env_tables=False,
                shipped_tables=False,
                persist_misses=False,
            )
        )
        try:
            rt2.load()
            out["bad_table"] = "no error"
        except ConsensusError as e:
            out["bad_table"] = str(e)
    return out


@pytest.mark.slow
def test_rank_local_differences_are_resolved_or_raised_on_every_rank(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("not json at all")
    r0, r1 = run_ranks(_rank_local_differences, 2, "cpu", args=(str(bad),), timeout=240)
    for r in (r0, r1):
        assert r["partial"][0] < 1e-5 and r["partial"][1] == "bsp"
        assert r["only0"][0] < 1e-5 and r["only0"][1] == "bsp"
        assert "ranks called with different problems" in r["mismatch"]
        assert "rank 1: ValueError: K: b has 7 rows" in r["bad_input"]
        assert "rank 1: TableFileError" in r["bad_table"] and "bad.json" in r["bad_table"]


def test_other_ops_dispatch_through_their_key_builder() -> None:
    """``flash_decode`` builds its key with ``Op.key_from_inputs``; one process, BSP on CPU."""
    import torch

    import autotaxer
    from autotaxer import ProblemKey
    from autotaxer.ops import get_op, op_names, relative_error

    if "flash_decode" not in op_names():
        pytest.skip("flash_decode op not registered")
    rt = autotaxer.Runtime(
        autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False)
    )
    op = get_op("flash_decode")
    key = ProblemKey.make("flash_decode", "cpu", 1, "fp32", {"B": 2, "H": 4, "Hkv": 2, "D": 64, "S": 64})
    for seed in (1, 2):
        inputs = op.make_inputs(key, 0, torch.device("cpu"), seed)
        got = rt.dispatch("flash_decode", *inputs)
        assert relative_error(got, op.reference(key, 0, torch.device("cpu"), seed)) < 1e-5
    assert [m.key for m in rt.misses()] == [key]
