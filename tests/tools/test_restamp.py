"""``autotaxer.tools.restamp``: what counts as the same kernel after a refactor (without a GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autotaxer.tools import restamp

_spec = importlib.util.spec_from_file_location(
    "_fingerprint", Path(restamp.__file__).with_name("_fingerprint.py")
)
fingerprint = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fingerprint)


def _write(folder: Path, files: dict[str, str]) -> list[str]:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return [str(folder / name) for name in files]


def test_code_moved_between_modules_digests_the_same(tmp_path: Path) -> None:
    before = _write(tmp_path / "a", {
        "one.py": '"""Doc."""\nimport x\n\ndef f(a):\n    from .two import g\n    return g(a) + 1\n',
        "two.py": "def g(a):\n    return a * 2\n",
    })  # fmt: skip
    after = _write(tmp_path / "b", {
        "merged.py": '"""Other doc."""\nfrom .common import y\n\n\n'
        'def g(a):\n    """New."""\n    return a * 2\n\n'
        "def f(a):\n    from ..elsewhere.two import g  # moved\n    return g(a) + 1\n",
    })  # fmt: skip
    changed = _write(
        tmp_path / "c", {"merged.py": "def g(a):\n    return a * 3\n\ndef f(a):\n    return g(a) + 1\n"}
    )
    assert fingerprint.code_digest(before) == fingerprint.code_digest(after)
    assert fingerprint.code_digest(before) != fingerprint.code_digest(changed)


def _launch(ttir: str = "t1", grid: int = 132) -> dict:
    return {
        "grid": [grid],
        "options": {"num_warps": 8},
        "args": [["tensor", "torch.bfloat16", [4, 8]]],
        "ttir": ttir,
    }


def _records(*variants: str) -> list[dict]:
    return [{"op": "ag_gemm", "variant": v} for v in variants]


def _fingerprints(launches: list, **variants: tuple[str, str]) -> dict:
    """A fingerprint as restamp's ``_fingerprint`` returns it: ``ag_gemm/<name>``'s (hash, code) for each
    ``name=(hash, code)``, and the scenarios' launches."""
    found = {f"ag_gemm/{name}": {"hash": h, "code": code} for name, (h, code) in variants.items()}
    return {"variants": found, "launches": launches}


def test_decide_restamps_moved_code_and_identical_launches_only() -> None:
    scenarios = [{"variant": "push"}, {"variant": "push"}, {"variant": "pull"}, {"variant": "push_tma"}]
    base = _fingerprints(
        [[_launch()], [_launch()], [_launch("t2")], [_launch()]],
        bsp=("b0", "c"), copy_engine=("e0", "ce"), push=("p0", "x"), pull=("l0", "x"), push_tma=("t0", "x"),
        push_ws=("w0", "x"),
    )  # fmt: skip
    now = _fingerprints(
        [[_launch()], [_launch()], [_launch("t3")], [_launch(grid=131)]],
        bsp=("b0", "c"), copy_engine=("e1", "ce"), push=("p1", "y"), pull=("l1", "y"), push_tma=("t1", "y"),
        push_ws=("w1", "y"),
    )  # fmt: skip
    records = _records("bsp", "copy_engine", "push", "pull", "push_tma", "push_ws")
    verdicts = restamp.decide(records, base, now, scenarios)
    assert verdicts == {
        "ag_gemm/bsp": ("unchanged", None),
        "ag_gemm/copy_engine": ("moved", "e1"),
        "ag_gemm/push": ("same launches", "p1"),
        "ag_gemm/pull": ("changed", None),  # other PTX
        "ag_gemm/push_tma": ("changed", None),  # another grid
        "ag_gemm/push_ws": ("changed", None),  # not traced, code changed
    }
    base["launches"][0] = "error: RuntimeError: boom"  # a scenario that failed proves nothing
    assert restamp.decide(_records("push"), base, now, scenarios)["ag_gemm/push"] == ("changed", None)


def test_accept_changed_restamps_changed_records_and_keeps_the_evidence(tmp_path: Path, monkeypatch) -> None:
    import json

    key = {"world_size": 2, "layout": {"gather_dim": 0}, "shape": {"M": 64, "N": 64, "K": 64}, "params": {}}
    table = {"records": [
        {"op": "ag_gemm", "variant": "copy_engine", "kernel_hash": "e0", "env": {"timing": "eager"}, **key},
        {"op": "ag_gemm", "variant": "bsp", "kernel_hash": "b0", "env": {}, **key},
    ]}  # fmt: skip
    (tmp_path / "t.json").write_text(json.dumps(table))
    fake = {
        # both records are traced (bsp's scenario sorts first): the copy-engine schedule differs too
        None: _fingerprints(
            [[{"schedule": "b"}], [{"schedule": "y"}]], copy_engine=("e1", "y"), bsp=("b0", "")
        ),
        "base": _fingerprints(
            [[{"schedule": "b"}], [{"schedule": "x"}]], copy_engine=("e0", "x"), bsp=("b0", "")
        ),
    }
    monkeypatch.setattr(restamp, "_base_tree", lambda repo, rev, into: "base")
    monkeypatch.setattr(restamp, "_fingerprint", lambda request, tree, cwd: fake[tree])
    args = ["--base", "HEAD", "--tables", str(tmp_path), "--write"]
    assert restamp.main(args) == 1  # changed and not accepted: reported, left stale
    assert json.loads((tmp_path / "t.json").read_text())["records"][0]["kernel_hash"] == "e0"
    assert restamp.main([*args, "--accept-changed", "measured: bench/results/x"]) == 0
    ce, bsp = json.loads((tmp_path / "t.json").read_text())["records"]
    assert ce["kernel_hash"] == "e1" and ce["env"] == {
        "timing": "eager",
        "restamped": "measured: bench/results/x",
    }
    assert bsp == {"op": "ag_gemm", "variant": "bsp", "kernel_hash": "b0", "env": {}, **key}  # untouched
    # a second change accepted later keeps the first one's evidence after its own
    fake["base"], fake[None] = (
        fake[None],
        _fingerprints([[{"schedule": "b"}], [{"schedule": "z"}]], copy_engine=("e2", "z"), bsp=("b0", "")),
    )
    assert restamp.main([*args, "--accept-changed", "measured again: bench/results/y"]) == 0
    ce = json.loads((tmp_path / "t.json").read_text())["records"][0]
    assert ce["kernel_hash"] == "e2"
    assert ce["env"]["restamped"] == "measured again: bench/results/y; earlier: measured: bench/results/x"


def test_tuple_arguments_are_compared_leaf_by_leaf() -> None:
    """A kernel that takes its pointers as one tuple receives them as separate parameters: the recorded
    arguments are the leaves, in order, so grouping a signature does not read as a changed launch."""
    assert fingerprint._leaves(((1, 2), 3, (4, (5,)))) == [1, 2, 3, 4, 5]
    assert fingerprint._leaves(7) == [7]
    assert fingerprint._leaves(()) == []


def test_flash_decode_records_are_traced_by_their_own_op() -> None:
    """A flash_decode record's scenario names its op, and its launches decide its verdict (not an
    ag_gemm variant of the same name)."""
    record = {"op": "flash_decode", "variant": "fused", "world_size": 2, "dtype": "bf16",
              "shape": {"B": 1, "H": 32, "Hkv": 8, "D": 128, "S": 8192}, "layout": {},
              "params": {"block_n": 64, "splits": 8, "num_warps": 4, "num_stages": 2}}  # fmt: skip
    scenario = restamp._scenario(record)
    assert scenario["op"] == "flash_decode" and scenario["shape"] == record["shape"]
    base = {"variants": {"flash_decode/fused": {"hash": "f0", "code": "x"}}, "launches": [[_launch()]]}
    now = {"variants": {"flash_decode/fused": {"hash": "f1", "code": "y"}}, "launches": [[_launch()]]}
    records = [{"op": "flash_decode", "variant": "fused"}]
    assert restamp.decide(records, base, now, [scenario]) == {"flash_decode/fused": ("same launches", "f1")}
    now["launches"] = [[_launch("other ptx")]]
    assert restamp.decide(records, base, now, [scenario]) == {"flash_decode/fused": ("changed", None)}


def test_copy_engine_schedules_are_traced_and_tell_configurations_apart() -> None:
    """A copy-engine record's schedule (the variant's prepare and run against a stand-in channel) is the
    same traced twice, and another configuration of the same key gives another schedule."""
    scenario = {"variant": "copy_engine", "world_size": 2, "gather_dim": 1, "b_layout": "nk", "M": 256,
                "N": 512, "K": 1024, "num_sms": 132,
                "params": {"gather_first": False, "signal": "memop", "chunks": 2, "accumulate": "fp32",
                           "order": "rotated"}}  # fmt: skip
    first = fingerprint._copy_engine_call(scenario)
    assert first == fingerprint._copy_engine_call(scenario) and first[0]["events"] > 20
    one_chunk = dict(scenario, params=dict(scenario["params"], chunks=1))
    assert fingerprint._copy_engine_call(one_chunk) != first
    params = {"streams": 2, "gemms": "range", "signal": "triton", "chunks": 1, "accumulate": "out"}
    fanout = {**scenario, "variant": "ce_fanout", "world_size": 4, "gather_dim": 0, "params": params}
    assert fingerprint._copy_engine_call(fanout)[0]["events"] > 20


def test_gemm_rs_copy_engine_schedules_are_traced_and_tell_configurations_apart() -> None:
    """``gemm_rs``'s ``copy_engine`` is traced as a schedule too (its workspace's own CUDA events named in
    creation order): the same twice; another stream count, scatter dim or world size gives another one."""
    scenario = {"op": "gemm_rs", "variant": "copy_engine", "world_size": 4, "scatter_dim": 0,
                "b_layout": "nk", "dtype": "bf16", "M": 512, "N": 256, "K": 1024, "num_sms": 132,
                "params": {"streams": 3, "signal": "triton"}}  # fmt: skip
    first = fingerprint._copy_engine_call(scenario)
    assert first == fingerprint._copy_engine_call(scenario) and first[0]["events"] > 20
    others = (
        dict(scenario, params={"streams": 1, "signal": "triton"}), dict(scenario, scatter_dim=1),
        dict(scenario, world_size=2, params={"streams": 1, "signal": "triton"}),
    )  # fmt: skip
    for other in others:
        assert fingerprint._copy_engine_call(other) != first, other


def test_bsp_schedules_are_traced_with_their_collective() -> None:
    """``ag_gemm``'s ``bsp`` (a collective, then the GEMM) is traced as a schedule: the same twice, and
    another layout or world size (another collective or another gather) gives another one."""
    scenario = {"variant": "bsp", "world_size": 2, "gather_dim": 1, "b_layout": "nk", "M": 256, "N": 512,
                "K": 1024, "num_sms": 132, "params": {}}  # fmt: skip
    first = fingerprint._copy_engine_call(scenario)
    assert first == fingerprint._copy_engine_call(scenario) and first[0]["events"] >= 5
    for other in (dict(scenario, gather_dim=0), dict(scenario, world_size=4), dict(scenario, b_layout="kn")):
        assert fingerprint._copy_engine_call(other) != first, other


_TOY = {  # a tree with one op, one variant and a shared host module, as restamp reads it
    "autotaxer/__init__.py": "",
    "autotaxer/runtime/__init__.py": "",
    "autotaxer/kernels/__init__.py": "",
    "autotaxer/ops/__init__.py": "from ._base import Op, RunContext, Variant, Workspace\n"
    "from .toy import OP\n\n\ndef get_op(name):\n    return OP\n",
    "autotaxer/ops/_base.py": "class Op:\n    pass\n\n\nclass Variant:\n    pass\n\n\nclass Workspace:\n"
    "    pass\n\n\nclass RunContext:\n    def iris(self):\n        from ._heap import heap\n\n"
    "        return heap()\n",
    "autotaxer/ops/_heap.py": "def heap():\n    return 'heap'\n",
    "autotaxer/ops/_shared.py": '"""Shared."""\n\n\ndef helper(x):\n    return x + 1\n',
    "autotaxer/ops/toy/__init__.py": "from ._op import Toy\nfrom .fast import FastVariant\n\nOP = Toy()\n"
    "OP.variants = {'fast': FastVariant()}\n",
    "autotaxer/ops/toy/_op.py": "from .._base import Op\n\n\nclass Toy(Op):\n    name = 'toy'\n",
    "autotaxer/ops/toy/fast.py": "from .._base import Variant\nfrom .._shared import helper\n\n\n"
    "class FastVariant(Variant):\n    def run(self, ctx, x):\n        ctx.iris()\n        return helper(x)\n",
    "autotaxer/ops/toy/_bench.py": "from .fast import FastVariant\n\nROW = FastVariant\n",
}


def _toy_tree(root: Path, moved: bool = False, edit: tuple[str, str] | None = None) -> Path:
    """The toy tree at ``root``; ``moved``: the variant's module and the shared module in other packages
    (imports fixed, code the same) and the integration module out of ``autotaxer.ops``; ``edit``: a
    replacement in every file."""
    files = dict(_TOY)
    hash_rules = Path(restamp.__file__).parents[1] / "runtime" / "kernel_hash.py"
    if moved:
        files["autotaxer/ops/common/__init__.py"] = ""
        files["autotaxer/ops/common/shared.py"] = files.pop("autotaxer/ops/_shared.py")
        files["autotaxer/ops/toy/variants/__init__.py"] = ""
        files["autotaxer/ops/toy/variants/fast.py"] = (
            files.pop("autotaxer/ops/toy/fast.py")
            .replace("from .._base", "from ..._base")
            .replace("from .._shared", "from ...common.shared")
        )
        files["autotaxer/ops/toy/__init__.py"] = files["autotaxer/ops/toy/__init__.py"].replace(
            ".fast", ".variants.fast"
        )
        files["autotaxer/layers/__init__.py"] = ""
        files["autotaxer/layers/toy_bench.py"] = files.pop("autotaxer/ops/toy/_bench.py").replace(
            "from .fast", "from autotaxer.ops.toy.variants.fast"
        )
        files["autotaxer/runtime/kernel_hash.py"] = hash_rules.read_text()  # today's rules
    else:  # an older tree, stamped under other rules (it has no shared modules in its hash)
        files["autotaxer/runtime/kernel_hash.py"] = "def kernel_source_hash(op, variant):\n    return 'old'\n"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace(*edit) if edit else text)
    return root


def test_code_moved_between_packages_is_moved_under_the_tools_own_rules(tmp_path: Path) -> None:
    """The base tree's hash had other rules; both trees' code is read under the tool's (the shared module
    and the module behind ``ctx.iris()`` in): a variant module and a shared module moved to other
    packages, and an integration module out of ``autotaxer.ops``, re-stamp as ``moved``; a code change
    in the shared module (which the old rules did not cover) is ``changed``."""
    request = {"variants": [["toy", "fast"]], "launches": []}
    base = restamp._fingerprint(request, _toy_tree(tmp_path / "base"), tmp_path)
    moved = restamp._fingerprint(request, _toy_tree(tmp_path / "moved", moved=True), tmp_path)
    records = [{"op": "toy", "variant": "fast"}]
    assert base["variants"]["toy/fast"]["hash"] == "old"
    new_hash = moved["variants"]["toy/fast"]["hash"]
    assert restamp.decide(records, base, moved, []) == {"toy/fast": ("moved", new_hash)}
    for edit in (("x + 1", "x + 2"), ("return 'heap'", "return 'other'")):
        changed_tree = _toy_tree(tmp_path / f"changed{edit[1][-3:-1]}", moved=True, edit=edit)
        changed = restamp._fingerprint(request, changed_tree, tmp_path)
        assert restamp.decide(records, base, changed, [])["toy/fast"] == ("changed", None), edit
