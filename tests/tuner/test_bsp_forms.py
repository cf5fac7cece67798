"""Every speedup is against the fastest BSP form: the space measures every form (named or not), the
tuner's reference is the fastest of them, and a bench row's speedups use the fastest form too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from _factories import KEY

from autotaxer._target import cpu_target
from autotaxer.benchmark.rows import bsp_us
from autotaxer.ops import Variant, Workspace, get_op
from autotaxer.tuner.study import SearchSpace, best_bsp


class _FakeForm(Variant):
    """A second BSP form on CPU (e.g. NCCL's symmetric-memory collectives on GPUs)."""

    name = "bsp_fake_form"
    device_types = frozenset({"cpu"})
    bsp_form = True

    def prepare(self, key, params, ctx) -> Workspace:
        return Workspace(key, dict(params))

    def run(self, ws, inputs, ctx, out=None) -> Any:
        raise NotImplementedError


@pytest.fixture
def ag_gemm_with_form():
    op = get_op("ag_gemm")
    op.register(_FakeForm())
    yield op
    op._variants.pop(_FakeForm.name)


def test_every_form_is_in_the_space_first_even_when_not_named(ag_gemm_with_form) -> None:
    op = ag_gemm_with_form
    assert op.bsp_forms() == ["bsp", "bsp_symm", "bsp_fake_form"]  # bsp_symm: GPUs only
    assert op.bsp_forms(cpu_target()) == ["bsp", "bsp_fake_form"]
    named = SearchSpace.build(op, KEY, cpu_target(), ("cpu_chunked",))
    assert named.names == ["bsp", "bsp_fake_form", "cpu_chunked"]
    assert named.forms == ("bsp", "bsp_fake_form")
    default = SearchSpace.build(op, KEY, cpu_target(), None)
    assert default.names[:2] == ["bsp", "bsp_fake_form"] and "cpu_chunked" in default.names


@dataclass
class _Trial:
    variant: str
    value: float
    params: dict = field(init=False)

    def __post_init__(self) -> None:
        self.params = {"variant": self.variant}


class _Study:
    def __init__(self, trials: list[_Trial]) -> None:
        self.trials = trials

    def get_trials(self, deepcopy: bool, states: Any) -> list[_Trial]:
        return self.trials


def test_the_reference_is_the_fastest_form(ag_gemm_with_form) -> None:
    space = SearchSpace.build(ag_gemm_with_form, KEY, cpu_target(), ("cpu_chunked",))
    study = _Study([_Trial("bsp", 10.0), _Trial("bsp_fake_form", 7.0), _Trial("cpu_chunked", 5.0)])
    assert best_bsp(study, space).value == 7.0  # not the baseline's 10, not the fused 5
    assert best_bsp(_Study([_Trial("cpu_chunked", 5.0)]), space) is None  # no form ran: no speedup


def test_a_bench_row_compares_with_its_fastest_form() -> None:
    row = {
        "bsp": {"eager": 120.0, "graph": 100.0},
        "bsp_forms": ["bsp", "bsp_symm"],
        "variants": {"bsp_symm": {"eager": 90.0, "graph": 95.0}, "push": {"eager": 60.0}},
    }
    assert bsp_us(row) == 90.0
    assert bsp_us({**row, "bsp_forms": ["bsp"]}) == 100.0  # a row without other forms: plain BSP
    assert bsp_us({"bsp": {"eager": 50.0}}) == 50.0  # rows written before forms existed
