"""The README's model exits cleanly under torchrun on 2 gloo ranks, every launch.

A process group still referenced after ``destroy_process_group`` keeps its gloo threads running at
interpreter exit, where the C++ teardown aborted about one launch in 20 (``terminate called without an
active exception``, SIGABRT, torchrun exit 1): ``torch._dynamo``, which autotaxer's first dispatch imports,
imports ``torch.distributed.nn.functional``, whose default arguments pinned the default group
(:mod:`autotaxer._default_group`); a runtime of another group held that group (forgotten at exit now). The
first tests check the cause (no gloo thread left once the groups are destroyed), the last the symptom over
20 launches.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _readme import model_snippet

#: Runs my_model.py as ``python my_model.py`` would, then names the threads this process still has.
PROBE = """\
import os, runpy
runpy.run_path("my_model.py", run_name="__main__")
names = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
print(f"threads after the model: {names}", flush=True)
"""


#: A model that dispatches in a process group of its own (a TP group), then destroys every group; the
#: threads left are listed by the first exit handler, which runs last.
SUBGROUP = """\
import atexit, os
import torch
import torch.distributed as dist

def threads():
    names = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    print(f"threads at exit: {names}", flush=True)

atexit.register(threads)
import autotaxer
dist.init_process_group("gloo")
tp = dist.new_group([0, 1])
c = autotaxer.dispatch("ag_gemm", torch.randn(8, 16), torch.randn(16, 8), gather_dim=0, group=tp)
print(f"rank {dist.get_rank()}: c {tuple(c.shape)}", flush=True)
dist.destroy_process_group()
del tp  # the model's own reference: the one left is autotaxer's
"""


def _workdir(tmp_path: Path) -> Path:
    """A folder with the README's ``my_model.py`` and the table it loads (``my-table.json``, empty)."""
    from autotaxer.table_file import write_table

    (tmp_path / "my_model.py").write_text(model_snippet())
    write_table([], tmp_path / "my-table.json")
    return tmp_path


def _torchrun(cwd: Path, script: str) -> subprocess.CompletedProcess:
    from autotaxer.testing import free_port

    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # torchrun, wherever its script was installed
    cmd = [*torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), script]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are listed from /proc")
def test_no_gloo_thread_outlives_the_models_process_group(tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    (work / "probe.py").write_text(PROBE)
    proc = _torchrun(work, "probe.py")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    left = re.findall(r"threads after the model: \[[^\]]*\]", proc.stdout)  # ranks' lines may interleave
    assert len(left) == 2, out
    assert not any("gloo" in line for line in left), left


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are listed from /proc")
def test_a_runtime_of_another_group_lets_that_group_end_before_exit(tmp_path: Path) -> None:
    (tmp_path / "tp.py").write_text(SUBGROUP)
    proc = _torchrun(tmp_path, "tp.py")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    left = re.findall(r"threads at exit: \[[^\]]*\]", proc.stdout)  # ranks' lines may interleave
    assert len(left) == 2 and proc.stdout.count("c (16, 8)") == 2, out
    assert not any("gloo" in line for line in left), left


@pytest.mark.slow
def test_the_readme_model_exits_0_in_20_launches(tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    with ThreadPoolExecutor(2) as pool:  # two launches at a time: 4 ranks on the machine
        procs = list(pool.map(lambda _: _torchrun(work, "my_model.py"), range(20)))
    failed = [p.stdout + p.stderr for p in procs if p.returncode != 0]
    assert not failed, f"{len(failed)} of 20 launches failed; the first:\n{failed[0]}"
    assert all(p.stdout.count("rank ") == 2 for p in procs)
