"""Re-stamp shipped records after a refactor, where the evidence says the kernels did not change.

``python -m autotaxer.tools.restamp --base REV [--tables tuning_db] [--write]``

Records carry ``kernel_source_hash`` of their variant's sources, so moving a kernel between modules or
sharing a ``@triton.jit`` piece between two kernels makes every record stale, although the GPU runs the
same code. This command compares the tree at ``REV`` with the working tree (:mod:`._fingerprint` runs in
each) and, per variant of the tables' records, decides:

- ``unchanged``: the source hash is the same; nothing to do.
- ``moved``: the same top-level code (imports and docstrings left out) in other modules, or packages:
  both trees' modules are found by this tool's own hash rules (:mod:`._fingerprint`), so a base tree
  stamped under other rules (a narrower scope) compares by its code, not by what its scope took in.
- ``same launches``: for every shipped record of a traced variant (:data:`TRACED`), the tree makes the
  same launches in both trees. Triton variants (``ag_gemm``'s push, pull, push_tma, push_ws, push_ws_fwd;
  ``flash_decode``'s fused and bsp; ``gemm_rs``'s push and push_tma): their launchers' every
  launch (grid, options, every argument) and each launched kernel's PTX for sm_90 (helpers inlined; line
  information off, the entry's name left out), so the GPU runs identical code. Copy-engine variants
  (``copy_engine`` of both ops, ``ce_fanout``) and ``ag_gemm``'s ``bsp``: the variant's ``prepare`` and
  ``run`` against a stand-in channel and collectives issue the same schedule (every copy, collective, flag
  raise and wait, epoch advance, event and stream wait, and tensor call with its arguments, in order, on
  the same streams).
- ``changed``: neither holds; the records stay stale and need re-tuning.
- ``stale before``: the record's hash was not the base tree's either.

The report's ``same launches`` column counts, for a traced variant, the scenarios (distinct keys and
params of its records) whose launches are the same in both trees, whatever the verdict.

Only ``--write`` rewrites the tables (``moved`` and ``same launches`` records get the new hash);
without it the command only reports. Exit 0, or 1 when a record is ``changed``. ``--accept-changed
EVIDENCE`` also re-stamps ``changed`` records, for a change measured not to alter what the kernels
compute and to cost (almost) nothing: each such record keeps ``EVIDENCE`` (a committed results file and
what it measured) in ``env["restamped"]``, after the evidence of an earlier re-stamp (``; earlier: ...``),
so the exception stays visible in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: Variants whose records are checked launch by launch, by op (their launches are Triton kernels).
TRACED = {
    "ag_gemm": ("push", "pull", "push_tma", "push_ws", "push_ws_fwd", "copy_engine", "ce_fanout", "bsp"),
    "flash_decode": ("fused", "bsp"),
    "gemm_rs": ("push", "push_tma", "copy_engine"),
}
#: Top-level folders the package installs under ``autotaxer.*`` (``package-dir`` in pyproject.toml).
REMAPPED = ("kernels", "migrations", "tuning_db")
_FINGERPRINT = Path(__file__).with_name("_fingerprint.py")


def _scenario(record: dict[str, Any]) -> dict[str, Any]:
    if record["op"] == "gemm_rs":
        return {
            "op": "gemm_rs", "variant": record["variant"], "world_size": record["world_size"],
            "dtype": record["dtype"], "scatter_dim": record["layout"].get("scatter_dim", 0),
            "b_layout": record["layout"].get("b_layout", "kn"),
            **{d: record["shape"][d] for d in ("M", "N", "K")},
            "num_sms": record.get("num_sms") or 132, "params": record["params"],
        }  # fmt: skip
    if record["op"] == "flash_decode":
        return {
            "op": "flash_decode", "variant": record["variant"], "world_size": record["world_size"],
            "dtype": record["dtype"], "shape": record["shape"], "params": record["params"],
        }  # fmt: skip
    return {
        "variant": record["variant"], "world_size": record["world_size"],
        "gather_dim": record["layout"].get("gather_dim", 0),
        "b_layout": record["layout"].get("b_layout", "kn"),
        **{d: record["shape"][d] for d in ("M", "N", "K")}, "num_sms": record.get("num_sms") or 132,
        "params": record["params"],
    }  # fmt: skip


def _base_tree(repo: Path, rev: str, into: Path) -> Path:
    """The tree at ``rev`` under ``into``, importable as ``autotaxer`` (remapped folders linked in)."""
    archive = into / "base.tar"
    subprocess.run(["git", "-C", str(repo), "archive", "--output", str(archive), rev], check=True)
    root = into / "base"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    for name in REMAPPED:
        link = root / "autotaxer" / name
        if (root / name).is_dir() and not link.exists():
            link.symlink_to(root / name, target_is_directory=True)
    return root


def _fingerprint(request: dict[str, Any], tree: Path | None, cwd: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    # compiled kernels go to a cache of this run (under ``cwd``), not the user's
    env["TRITON_CACHE_DIR"] = str(cwd / ("triton-cache-base" if tree is not None else "triton-cache"))
    if tree is not None:  # the tree first; a PYTHONPATH given (e.g. another Triton) stays after it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-P", str(_FINGERPRINT)], input=json.dumps(request), capture_output=True,
        text=True, env=env, cwd=cwd,
    )  # fmt: skip
    if done.returncode:
        where = tree or "the working tree"
        raise SystemExit(f"restamp: fingerprinting {where} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def difference(old: Any, new: Any) -> str | None:
    """What differs between one scenario's launches in the two trees (None: nothing)."""
    for launches in (old, new):
        if not isinstance(launches, list) or not launches:
            return f"no launches: {launches!r}"[:300]
    if len(old) != len(new):
        return f"{len(old)} launches, now {len(new)}"
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        for field in sorted(set(a) | set(b)):
            if a.get(field) != b.get(field):
                return f"launch {i}: {field} {str(a.get(field))[:120]} -> {str(b.get(field))[:120]}"
    return None


def decide(records: list[dict[str, Any]], base: dict[str, Any], now: dict[str, Any],
           scenarios: list[dict[str, Any]]) -> dict[str, tuple[str, str | None]]:  # fmt: skip
    """``op/variant`` -> (verdict, the new hash where records may take it)."""
    traces: dict[str, list[bool]] = defaultdict(list)
    for scenario, old, new in zip(scenarios, base["launches"], now["launches"], strict=True):
        traces[f"{scenario.get('op', 'ag_gemm')}/{scenario['variant']}"].append(difference(old, new) is None)
    verdicts: dict[str, tuple[str, str | None]] = {}
    for name in sorted({f"{r['op']}/{r['variant']}" for r in records}):
        old, new = base["variants"].get(name), now["variants"].get(name)
        if old is None or new is None:
            verdicts[name] = ("changed (variant missing in one tree)", None)
        elif old["hash"] == new["hash"]:
            verdicts[name] = ("unchanged", None)
        elif old["code"] == new["code"]:
            verdicts[name] = ("moved", new["hash"])
        elif traces.get(name) and all(traces[name]):
            verdicts[name] = ("same launches", new["hash"])
        else:
            verdicts[name] = ("changed", None)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autotaxer.tools.restamp", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--base", required=True, help="git revision the records were stamped at")
    parser.add_argument("--tables", type=Path, default=Path("tuning_db"), help="folder of table JSON files")
    parser.add_argument("--write", action="store_true", help="rewrite the tables (default: report only)")
    parser.add_argument("--explain", action="store_true", help="show a changed variant's first difference")
    parser.add_argument(
        "--accept-changed",
        metavar="EVIDENCE",
        help="re-stamp changed records too, keeping EVIDENCE (the measurement that justifies it) in each",
    )
    args = parser.parse_args(argv)
    repo = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())  # fmt: skip
    files = sorted(args.tables.glob("*.json"))
    tables = {f: json.loads(f.read_text(encoding="utf-8")) for f in files}
    records = [r for t in tables.values() for r in t["records"]]
    traced = [r for r in records if r["variant"] in TRACED.get(r["op"], ())]
    unique = {json.dumps(_scenario(r), sort_keys=True) for r in traced}
    scenarios = [json.loads(s) for s in sorted(unique)]
    request = {"variants": sorted({(r["op"], r["variant"]) for r in records}), "launches": scenarios}
    with tempfile.TemporaryDirectory(prefix="restamp-") as tmp:
        base_root = _base_tree(repo, args.base, Path(tmp))
        with ThreadPoolExecutor(2) as pool:
            base_f = pool.submit(_fingerprint, request, base_root, Path(tmp))
            now_f = pool.submit(_fingerprint, request, None, Path(tmp))
            base, now = base_f.result(), now_f.result()
    verdicts = decide(records, base, now, scenarios)
    status = 0
    same: dict[str, list[bool]] = defaultdict(list)  # per variant: each traced scenario's launches the same?
    for scenario, a, b in zip(scenarios, base["launches"], now["launches"], strict=True):
        same[f"{scenario.get('op', 'ag_gemm')}/{scenario['variant']}"].append(difference(a, b) is None)
    print(f"{'variant':<28} {'records':>7} {'same launches':>13}  verdict")
    for name, (verdict, new_hash) in verdicts.items():
        old_hash = base["variants"].get(name, {}).get("hash")
        mine = [r for r in records if f"{r['op']}/{r['variant']}" == name]
        stale = sum(r.get("kernel_hash") not in (old_hash, None) for r in mine)
        note = f" ({stale} stale before {args.base})" if stale else ""
        traced = f"{sum(same[name])}/{len(same[name])}" if same.get(name) else "-"
        print(f"{name:<28} {len(mine):>7} {traced:>13}  {verdict}{note}")
        status |= verdict.startswith("changed") and not args.accept_changed
        if verdict == "changed" and args.explain:
            for scenario, a, b in zip(scenarios, base["launches"], now["launches"], strict=True):
                if f"{scenario.get('op', 'ag_gemm')}/{scenario['variant']}" == name and (
                    why := difference(a, b)
                ):
                    print(f"    {json.dumps(scenario, sort_keys=True)}: {why}")
                    break
        accepted = verdict.startswith("changed") and args.accept_changed
        if accepted:
            new_hash = now["variants"].get(name, {}).get("hash")
        if new_hash and args.write:
            for r in mine:
                if r.get("kernel_hash") == old_hash:
                    r["kernel_hash"] = new_hash
                    if accepted:
                        env = r.setdefault("env", {})
                        earlier = env.get("restamped")
                        env["restamped"] = args.accept_changed + (f"; earlier: {earlier}" if earlier else "")
    if args.write:
        for f, table in tables.items():
            tmp_file = f.with_suffix(".json.tmp")
            tmp_file.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
            tmp_file.replace(f)
        print(f"wrote {len(tables)} table(s) under {args.tables}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
