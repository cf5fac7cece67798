"""The package's layers: lower layers never import upper ones, no two modules import each other (directly
or around a loop, lazy imports inside functions included), nothing stable imports ``experimental``."""

from __future__ import annotations

from pathlib import Path

from _imports import imported

ROOT = Path(__file__).resolve().parents[1]

#: Layer of each part of the package (the first name under ``autotaxer``); a module imports only its own
#: layer or lower ones. kernels < the problem's vocabulary < ops and storage < runtime < tuner and the
#: integration layer < what is built on the integrations (functions, layers, benchmark) < the commands,
#: tools and test helpers.
LAYERS = {
    "kernels": 0,
    "_problem": 1, "_target": 1, "__init__": 1, "records": 1, "_json_object": 1, "output_file": 1,
    "_default_group": 1, "_capture": 1,
    "table_file": 2, "storage": 2, "ops": 2,
    "shapes": 3, "measure": 3, "_launch": 3,
    "runtime": 4,
    "tuner": 5, "integrations": 5,
    "functional": 6, "nn": 6, "benchmark": 6, "async_tp": 6,
    "report": 7, "models": 7,
    "cli": 8, "__main__": 8, "tools": 8, "testing": 8,
}  # fmt: skip


def _modules() -> dict[str, tuple[Path, str]]:
    """Every module of the installed package: name -> (file, the package its relative imports start in)."""
    found: dict[str, tuple[Path, str]] = {}
    for top, prefix in (("autotaxer", ()), ("kernels", ("autotaxer",))):
        for path in (ROOT / top).rglob("*.py"):
            parts = [*prefix, *path.relative_to(ROOT).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
                package = ".".join(parts)
            else:
                package = ".".join(parts[:-1])
            found[".".join(parts)] = (path, package)
    return found


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The package's modules ``name`` imports anywhere in its code, relative imports resolved."""
    path, package = MODULES[name]
    return {m for m in imported(path, package) if m in MODULES and m != name}


def _part(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_part_of_the_package_has_a_layer() -> None:
    assert {_part(m) for m in MODULES} <= set(LAYERS)


#: Upward imports allowed, each with its reason: lazy (inside a function) and only on the path that needs it.
ALLOWED_UPWARD = {
    # RuntimeConfig(tune_misses=...): the package's front door (above every part: it re-exports them all)
    # wires the runtime to the tuner that tunes a miss at its first call; the runtime asks it for one
    ("autotaxer", "autotaxer.tuner.in_group"),
}


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{m} -> {t}"
        for m in MODULES
        for t in _imports(m)
        if LAYERS[_part(t)] > LAYERS[_part(m)] and (m, t) not in ALLOWED_UPWARD
    ]
    assert upward == []


def test_the_runtime_never_imports_the_tuner() -> None:
    up = [f"{m} -> {t}" for m in MODULES if _part(m) == "runtime" for t in _imports(m) if _part(t) == "tuner"]
    assert up == []


def test_kernels_import_nothing_of_the_package_but_kernels() -> None:
    outside = [
        f"{m} -> {t}" for m in MODULES if _part(m) == "kernels" for t in _imports(m) if _part(t) != "kernels"
    ]
    assert outside == []


def test_no_import_cycles() -> None:
    graph = {m: _imports(m) for m in MODULES}
    # a package imports its own submodules (registration); its submodules importing the package's
    # __init__ for a name is the same file set, not a loop between layers
    for m, targets in graph.items():
        graph[m] = {t for t in targets if not (t.startswith(m + ".") or m.startswith(t + "."))}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_nothing_stable_imports_experimental_code() -> None:
    stable = [m for m in MODULES if ".experimental" not in m and _part(m) not in ("tools", "testing")]
    leaks = [f"{m} -> {t}" for m in stable for t in _imports(m) if ".experimental" in t]
    assert leaks == []
