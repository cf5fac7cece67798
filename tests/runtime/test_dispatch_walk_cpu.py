"""The walk of a cached call (issue 50): from ``dispatch("ag_gemm", ...)`` to the variant's launch, a call
whose plan is cached enters at most 10 of the package's source files (``autotaxer/`` and ``kernels/``),
one gloo rank (world size 1, CPU, fp32: the baseline ``bsp`` serves it, no table), for both entry points
(:func:`autotaxer.dispatch` and ``Runtime.dispatch``)."""

from __future__ import annotations

from autotaxer.testing import run_ranks

#: the most source files of the package a cached call may enter (issue 50's target)
MAX_FILES = 10


def _walk(ctx) -> dict[str, list[str]]:
    """The package's files each entry point's cached call enters, in the order first entered."""
    import sys
    from pathlib import Path

    import autotaxer.kernels
    import torch

    import autotaxer

    roots = tuple(
        str(Path(m.__file__).resolve().parent) for m in (autotaxer, autotaxer.kernels)
    )  # the editable install maps autotaxer.kernels to the top-level kernels/ folder
    rt = autotaxer.init(autotaxer.RuntimeConfig(env_tables=False, shipped_tables=False, persist_misses=False))
    a, b = torch.randn(8, 16), torch.randn(16, 12)
    calls = {
        "autotaxer.dispatch": lambda: autotaxer.dispatch("ag_gemm", a, b, gather_dim=0),
        "Runtime.dispatch": lambda: rt.dispatch("ag_gemm", a, b, gather_dim=0),
    }
    out: dict[str, list[str]] = {"decision": [rt.plan("ag_gemm", a, b, gather_dim=0).decision.variant]}
    for name, call in calls.items():
        call()  # the first call of the signature: decided, agreed, planned
        entered: list[str] = []

        def profile(frame, event, arg, entered=entered) -> None:
            if event == "call":
                path = str(Path(frame.f_code.co_filename).resolve())
                if path.startswith(roots) and path not in entered:
                    entered.append(path)

        sys.setprofile(profile)
        try:
            result = call()
        finally:
            sys.setprofile(None)
        assert torch.allclose(result, a @ b, atol=1e-5, rtol=1e-5)
        out[name] = entered
    autotaxer.runtime.dispatch.shutdown()
    return out


#: the file each entry point enters first: the public entry decides the path one layer up, then the hot path
FIRST = {"autotaxer.dispatch": "integrations/dispatch.py", "Runtime.dispatch": "runtime/dispatch.py"}


def test_a_cached_dispatch_enters_at_most_ten_files_of_the_package() -> None:
    (walks,) = run_ranks(_walk, 1, "cpu", timeout=120)
    assert walks.pop("decision") == ["bsp"]
    for name, files in walks.items():
        assert files, f"{name}: the profile saw no file of the package (the roots are wrong)"
        listing = "\n  ".join(files)
        assert len(files) <= MAX_FILES, f"{name} entered {len(files)} files:\n  {listing}"
        assert files[0].endswith(FIRST[name]), f"{name} entered first:\n  {listing}"
        hot = any(f.endswith("runtime/dispatch.py") for f in files)
        assert hot, f"{name} skipped the hot path:\n  {listing}"
