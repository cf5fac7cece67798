"""Fingerprints of one source tree's kernels, for :mod:`autotaxer.tools.restamp` (run as a script, once per
tree, with ``autotaxer`` importable from that tree; prints JSON).

Reads a JSON request on stdin: ``{"variants": [[op, variant], ...], "launches": [scenario, ...]}``
and answers, per ``op/variant``:
- ``hash``: the tree's ``kernel_source_hash`` (what records are stamped with);
- ``code``: sha256 over the sorted normalized top-level statements of the modules the hash covers,
  imports and docstrings left out (equal for two trees that only move code between modules);
and per launch scenario (a shipped record of a Triton variant), every kernel launch its launcher makes,
recorded instead of launched: the kernel's PTX for sm_90 (no line information; the entry's name left out),
the grid, the launch options and each runtime argument (tensors by dtype, shape, strides and 16-byte
alignment; scalars by value; constexprs are in the PTX).
Nothing needs a GPU: tensors are CPU tensors that are never read, and kernels compile without a driver.
Self-contained on purpose: it must run against an older tree that does not have it.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import json
import os
import pkgutil
import sys
from pathlib import Path
from typing import Any


def _own_kernel_hash() -> Any:
    """This tool's own ``runtime/kernel_hash.py``, loaded from its file (standard library only), not from
    the tree being fingerprinted, whose ``autotaxer`` may be older."""
    path = Path(__file__).resolve().parents[1] / "runtime" / "kernel_hash.py"
    spec = importlib.util.spec_from_file_location("_restamp_kernel_hash", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_strip_docstrings = _own_kernel_hash().strip_docstrings


class _BoundNames(ast.NodeTransformer):
    """Imports inside functions as the names they bind, without the module they come from (which a move
    changes); top-level imports are left out by :func:`code_digest`."""

    def visit_Import(self, node: ast.Import) -> ast.AST:
        return ast.Expr(ast.Constant("import " + ",".join(a.asname or a.name for a in node.names)))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        return ast.Expr(ast.Constant("import " + ",".join(a.asname or a.name for a in node.names)))


def code_digest(paths: list[str]) -> str:
    """sha256 over the sorted ``ast.dump`` of every top-level non-import statement of ``paths`` (imports
    inside them reduced to the names they bind)."""
    parts: list[str] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        _strip_docstrings(tree)
        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)) or isinstance(stmt, ast.Pass):
                continue
            parts.append(ast.dump(_BoundNames().visit(stmt), include_attributes=False))
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()


def _kernel_names() -> dict[str, Any]:
    """Every public-or-private top-level object of every ``autotaxer.kernels`` module, by name."""
    import autotaxer.kernels as root

    found: dict[str, Any] = {}
    for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            found.setdefault(name, obj)
    return found


def _describe(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), list(value.shape), list(value.stride()), value.data_ptr() % 16]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if all(hasattr(value, a) for a in ("base", "shape", "strides", "block_shape")):  # a TMA descriptor
        return ["descriptor", _describe(value.base), list(value.shape), list(value.strides),
                list(value.block_shape)]  # fmt: skip
    return repr(type(value).__name__)


@functools.cache
def _sm90() -> Any:
    """:mod:`autotaxer.tools.sm90` of this tool's own tree (loaded by path: the tree under test may not
    have it)."""
    spec = importlib.util.spec_from_file_location("_restamp_sm90", Path(__file__).with_name("sm90.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ptx(fn: Any, args: tuple, kwargs: dict) -> str:
    """``fn``'s PTX for sm_90 as launched with these arguments (specialised as Triton's JIT does; line
    information off, so moving code between files or lines changes nothing), its name replaced, comments
    and spacing dropped."""
    text = _sm90().compile_for_hopper(fn, args, kwargs).asm["ptx"].replace(fn.__name__, "ENTRY")
    lines = (" ".join(line.split("//", 1)[0].split()) for line in text.splitlines())  # comments, spacing
    return "\n".join(line for line in lines if line)


class _Recorder:
    def __init__(self) -> None:
        self.launches: list[dict[str, Any]] = []

    def __call__(self, fn: Any, grid: Any, args: tuple, kwargs: dict) -> None:
        options = {k: v for k, v in kwargs.items() if k not in fn.arg_names}
        rest = fn.params[len(args) :]
        bound = list(args) + [kwargs[p.name] if p.name in kwargs else p.default for p in rest]
        ptx = _ptx(fn, args, kwargs)
        self.launches.append({
            "grid": list(grid) if isinstance(grid, tuple) else grid,
            "options": options,
            # constexprs are compiled into the PTX; the runtime arguments are compared here
            "args": [_describe(v) for p, v in zip(fn.params, bound, strict=True) if not p.is_constexpr],
            "ptx": hashlib.sha256(ptx.encode()).hexdigest(),
        })  # fmt: skip


def _record_launches() -> _Recorder:
    from triton.runtime.jit import JITFunction

    recorder = _Recorder()

    def getitem(self: Any, grid: Any):
        return lambda *args, **kwargs: recorder(self, grid, args, kwargs)

    class _Compiled:  # what ``warmup`` returns: launching it does nothing
        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kwargs: None

    def warmup(self: Any, *args: Any, grid: Any, **kwargs: Any) -> Any:
        recorder(self, grid, args, kwargs)
        return _Compiled()

    JITFunction.__getitem__ = getitem
    JITFunction.warmup = warmup  # Gluon's kernels are JITFunctions too
    return recorder


def _fused_call(names: dict[str, Any], scenario: dict[str, Any]) -> None:
    """The launches of ``ag_gemm_<variant>`` for a shipped record's key and params, rank 0: ``push``,
    ``pull``, ``push_tma`` through their launchers; ``push_ws``/``push_ws_fwd`` as their launcher decides
    (``push``'s kernel where the Gluon consumer cannot take the call, else both kernels compiled)."""
    import torch

    ws, gd = scenario["world_size"], scenario["gather_dim"]
    m, n, k = scenario["M"], scenario["N"], scenario["K"]
    params = {p: v for p, v in scenario["params"].items() if p in names["FusedConfig"].__dataclass_fields__}
    config = names["FusedConfig"](**params)
    ms, ks = names["shard_dims"](m, k, ws, gd)
    dtype = torch.bfloat16
    if scenario.get("b_layout", "kn") == "kn":
        b = torch.empty(k, n, dtype=dtype)
    else:
        b = torch.empty(n, k, dtype=dtype).t()
    geo = names["geometry"](config, ms, ks)
    tensors = dict(
        a_shard=torch.empty(ms, ks, dtype=dtype), b=b, out=torch.empty(m, n, dtype=dtype),
        inbox=torch.empty(*names["inbox_shape"](ms, ks, ws), dtype=dtype),
        flags=torch.zeros(names["flags_count"](geo, ws), dtype=torch.int32),
        sync=torch.zeros(names["SYNC_WORDS"], dtype=torch.int64),
        heap_bases=torch.zeros(ws, dtype=torch.int64),
    )  # fmt: skip
    common = dict(rank=0, world_size=ws, gather_dim=gd, config=config, num_sms=scenario["num_sms"])
    variant = scenario["variant"]
    if variant in ("push_ws", "push_ws_fwd"):
        consumer = names["ws_config"](config)
        why = names["ws_config_error"](consumer, 2) or names["tensors_error"](
            tensors["a_shard"], b, tensors["inbox"], gd, consumer
        )
        if why is None:
            transport = "forward" if variant == "push_ws_fwd" else "sms"
            call = names["PushWsCall"](**tensors, **common, transport=transport)
            call.compile(tensors["a_shard"], b, tensors["out"])
            return
        variant = "push"
    names[f"ag_gemm_{variant}"](**tensors, **common)


def main() -> None:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # before Triton reads its knobs
    request = json.load(sys.stdin)
    from autotaxer.runtime import kernel_hash

    answer: dict[str, Any] = {"variants": {}, "launches": []}
    for op, variant in request["variants"]:
        try:
            modules = kernel_hash._variant_modules(op, variant)
        except KeyError:
            continue
        answer["variants"][f"{op}/{variant}"] = {
            "hash": kernel_hash.kernel_source_hash(op, variant),
            "code": code_digest([str(path) for _, path in modules]),
        }
    if request["launches"]:
        names = _kernel_names()
        recorder = _record_launches()
        for scenario in request["launches"]:
            before = len(recorder.launches)
            try:
                _fused_call(names, scenario)
                answer["launches"].append(recorder.launches[before:])
            except Exception as exc:  # noqa: BLE001 - reported per scenario, compared as text
                answer["launches"].append(f"error: {type(exc).__name__}: {exc}")
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
