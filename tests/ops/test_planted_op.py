"""Adding an op is its two folders and one registry line: a planted op (``tests/_planted``: a host folder
with a BSP and a Triton variant, a device module, registered by ``$AUTOTAXER_OPS``) is served by
``dispatch``, tuned by ``autotaxer tune``, benchmarked by ``autotaxer bench`` and backs ``autotaxer.nn``'s
column-parallel layer, with no line of autotaxer naming it. CPU, 2 gloo ranks, Triton's interpreter."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import autotaxer.ops as registry
from autotaxer.cli import app
from autotaxer.testing import run_ranks

OP = "planted_gemm"
SHAPES = f"op,M,N,K,dtype\n{OP},32,16,16,fp32\n"
runner = CliRunner(env={"AUTOTAXER_DB": None, "AUTOTAXER_TABLE": None, "COLUMNS": "200"})


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The planted op's registry line, inherited by every spawned rank; Triton's interpreter there.
    Triton is imported before the interpreter is on, and modules first imported while it was on
    (kernels, Iris) are forgotten after: their functions are the interpreter's, which a later test's
    compiled (Gluon) kernels cannot import."""
    import triton  # noqa: F401  (first imported here, not under the interpreter: see above)

    monkeypatch.setenv(registry.ENV_VAR, f"{OP}=_planted.{OP}")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(registry, "_OPS", {})  # this process reads the registry again
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("autotaxer.kernels", "_planted", "iris")):
            del sys.modules[name]


def _record(key_shape: dict, variant: str, params: dict):
    from autotaxer import ProblemKey
    from autotaxer.records import WinnerRecord
    from autotaxer.runtime.kernel_hash import kernel_source_hash

    key = ProblemKey.make(OP, "cpu", 2, "fp32", key_shape, {"gather_dim": 0})
    return WinnerRecord(
        key=key, variant=variant, params=params, median_us=1.0, bsp_us=2.0, trials=2,
        kernel_hash=kernel_source_hash(OP, variant), device_type="cpu",
    )  # fmt: skip


def _served(ctx, table: str) -> dict:
    """On each rank: dispatch's call and the column-parallel layer, both served the planted op."""
    import torch

    from autotaxer import ProblemKey, dispatch, nn
    from autotaxer.ops import get_op, relative_error
    from autotaxer.runtime.dispatch import RuntimeConfig, init, runtime_for, shutdown

    op = get_op(OP)
    init(RuntimeConfig(tables=(table,), shipped_tables=False, env_tables=False, persist_misses=False))
    key = ProblemKey.make(OP, "cpu", 2, "fp32", {"M": 32, "N": 16, "K": 16}, {"gather_dim": 0})
    inputs = op.make_inputs(key, ctx.rank, ctx.device, 7)
    got = dispatch(OP, *inputs, gather_dim=0)
    plan = runtime_for(None).plan(OP, *inputs, gather_dim=0)
    layer = nn.ColumnParallelLinear(16, 32, bias=False, dtype=torch.float32, op=OP)
    x = torch.randn(8, 16)
    try:  # the planted op declares no autograd: a differentiable call says so, on every rank
        layer(x)
        no_grad_error = ""
    except NotImplementedError as e:
        no_grad_error = str(e)
    with torch.no_grad():
        y = layer(x)
    xs = [torch.empty_like(x) for _ in range(ctx.world_size)]
    torch.distributed.all_gather(xs, x)
    layer_ref = (torch.cat(xs).double() @ layer.weight.double().t()).float()
    layer_plan = runtime_for(None).plan(OP, x, layer.weight.t(), gather_dim=0)
    shutdown()
    return {
        "err": relative_error(got, op.reference(key, ctx.rank, ctx.device, 7)),
        "variant": plan.decision.variant,
        "layer_err": relative_error(y, layer_ref),
        "layer_variant": layer_plan.decision.variant,
        "layer_op": layer.op,
        "no_grad_error": no_grad_error,
    }


@pytest.mark.slow
def test_dispatch_and_the_layer_serve_the_planted_op(planted, tmp_path: Path) -> None:
    from autotaxer.table_file import write_table

    table = tmp_path / "planted.json"
    records = [  # the Triton variant tuned for the call's key and for the layer's (M 16, N 16, K 16)
        _record({"M": 32, "N": 16, "K": 16}, "triton", {"BLOCK": 16}),
        _record({"M": 16, "N": 16, "K": 16}, "triton", {"BLOCK": 32}),
    ]
    write_table(records, table)
    results = run_ranks(_served, 2, "cpu", args=(str(table),), timeout=300)
    for r in results:
        assert r["variant"] == "triton" and r["layer_variant"] == "triton" and r["layer_op"] == OP, r
        assert r["err"] < 1e-5 and r["layer_err"] < 1e-5, r
        assert f"dispatch('{OP}'): autograd is implemented for" in r["no_grad_error"], r


@pytest.mark.slow
def test_tune_and_bench_run_the_planted_op(planted, tmp_path: Path) -> None:
    import optuna

    from autotaxer.storage import open_database

    shapes = tmp_path / "shapes.csv"
    shapes.write_text(SHAPES)
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    common = ["--device", "cpu", "--world-size", "2", "--shapes", str(shapes), "--db", url]
    res = runner.invoke(app, ["tune", *common, "--trials", "3", "--sampler", "grid", "--quiet"])
    assert res.exit_code == 0, res.output
    with open_database(url) as db:
        (winner,) = db.winners(op=OP)
        study = optuna.load_study(study_name=winner.key.text, storage=db.optuna_storage())
        done = {
            (t.params["variant"], t.params.get("triton.BLOCK")) for t in study.trials if t.value is not None
        }
    assert {("bsp", None), ("triton", 16), ("triton", 32)} <= done  # every variant validated and timed
    assert winner.variant in ("bsp", "triton")

    out = tmp_path / "bench.json"
    timing = ["--iters", "2", "--samples", "3", "--max-configs", "1", "--dispatch-timing", "eager"]
    res = runner.invoke(app, ["bench", *common, "--out", str(out), *timing])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["op"], row["M"], row["gather_dim"]) == (OP, 32, 0) and row["parts"] == ["allgather", "gemm"]
    triton = row["variants"]["triton"]
    assert triton["eager"] > 0 and triton["err"] < 1e-5 and triton["source"] == "tuned"
    assert row["dispatch"]["variant"] == winner.variant and row["dispatch"]["err"] < 1e-5
    assert all(row[p]["eager"] > 0 for p in row["parts"]) and row["bsp"]["eager"] > 0
