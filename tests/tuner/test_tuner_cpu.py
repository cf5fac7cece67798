"""``autotaxer tune --device cpu`` end to end: real spawned gloo ranks, a real SQLite tuning database.

Covers world sizes 2 and 3, the planted hang/crash/wrong variants (the watchdog survives them, they are
recorded as failed with reasons, never win), resume after SIGKILL, ``--retune`` and bad input.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotaxer._problem import ProblemKey
from autotaxer.testing.planted import ENV as PLANTED  # the planted faults, in every spawned process

AUTOTAXER = str(Path(sys.executable).with_name("autotaxer"))


def _shapes(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "shapes.csv"
    path.write_text(text)
    return path


def _tune(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [AUTOTAXER, "tune", "--device", "cpu", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _run_args(shapes: Path, db: str, world_size: int = 2) -> list[str]:
    """The options of every tune run here: ``--world-size``, ``--shapes`` and ``--db``."""
    return ["--world-size", str(world_size), "--shapes", str(shapes), "--db", db]


def _trials(url: str, key: ProblemKey) -> list:
    import optuna

    return optuna.load_study(study_name=key.text, storage=optuna.storages.RDBStorage(url)).get_trials()


def _key(ws: int, m: int, n: int, k: int, gather_dim: int) -> ProblemKey:
    return ProblemKey.make("ag_gemm", "cpu", ws, "fp32", {"M": m, "N": n, "K": k}, {"gather_dim": gather_dim})


def _winners(url: str) -> list:
    from autotaxer.storage import open_database

    db = open_database(url)
    try:
        return db.winners()
    finally:
        db.close()


@pytest.mark.slow
def test_planted_hang_crash_and_wrong_are_survived_and_recorded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim\n16,8,8,fp32,0\n")
    # grid: a fixed order (bsp, hang, crash, the cpu_chunked points, wrong) so every fault is hit once.
    variants = "planted_hang,planted_crash,cpu_chunked,planted_wrong"
    args = [*_run_args(shapes, url), "--sampler", "grid"]
    proc = _tune([*args, "--trial-timeout", "4", "--variants", variants, "--quiet"], env=PLANTED)
    assert proc.returncode == 0, proc.stderr
    trials = {t.params["variant"]: t for t in _trials(url, _key(2, 16, 8, 8, 0))}
    all_trials = _trials(url, _key(2, 16, 8, 8, 0))
    assert len(all_trials) == 1 + 3 + 8  # bsp, three planted, chunks {1,2,4,8} x 2 orders
    assert trials["planted_hang"].state.name == "FAIL"
    assert trials["planted_hang"].user_attrs["failure"].startswith("timeout")
    assert trials["planted_crash"].state.name == "FAIL"
    assert "SIGSEGV" in trials["planted_crash"].user_attrs["failure"]
    assert trials["planted_wrong"].state.name == "FAIL"
    assert trials["planted_wrong"].user_attrs["failure"].startswith("validation failed")
    # Tuning went on after the crash: every cpu_chunked point ran on a relaunched group.
    chunked = [t for t in all_trials if t.params["variant"] == "cpu_chunked"]
    assert all(t.state.name == "COMPLETE" and t.user_attrs["rel_err"] < 1e-5 for t in chunked)
    (winner,) = _winners(url)
    assert winner.variant in ("bsp", "cpu_chunked")
    assert winner.trials == 12 and winner.device_type == "cpu" and winner.key.gpu_model == "cpu"
    assert winner.env["confirmed"] == "interleaved"  # its times: winner and bsp re-timed side by side
    assert "planted_crash" in proc.stderr and "SIGSEGV" in proc.stderr  # reported in the log too


@pytest.mark.slow
def test_a_kernel_wait_that_gave_up_is_a_failed_trial_naming_the_silent_peer(tmp_path: Path) -> None:
    """``planted_never_signal``: rank 0's (planted) kernel wait on rank 1 gives up; the trial fails with the
    op, variant, key and peer named, not by the process watchdog, and tuning goes on."""
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim\n16,8,8,fp32,0\n")
    args = [*_run_args(shapes, url), "--sampler", "grid", "--quiet"]
    proc = _tune([*args, "--variants", "planted_never_signal", "--trial-timeout", "60"], env=PLANTED)
    assert proc.returncode == 0, proc.stderr
    trials = {t.params["variant"]: t for t in _trials(url, _key(2, 16, 8, 8, 0))}
    failure = trials["planted_never_signal"].user_attrs["failure"]
    assert trials["planted_never_signal"].state.name == "FAIL"
    assert failure.startswith("rank 0: PeerTimeoutError: ag_gemm planted_never_signal at ag_gemm|cpu|2"), (
        failure
    )
    assert "rank 1, which never signalled" in failure
    assert trials["bsp"].state.name == "COMPLETE"


@pytest.mark.slow
def test_sampler_draws_of_a_variant_far_behind_are_not_launched_with_reach(tmp_path: Path) -> None:
    """``--reach 1.25``: once ``planted_slow``'s two seeds ran (20-21 ms behind BSP), no draw of it runs;
    each is pruned naming the ratio, and with nothing else in reach left to run the search ends after
    FILL_AFTER such asks, saying so. ``--reach 0`` (CPU's default) launches the draws."""
    from autotaxer.tuner.run import FILL_AFTER
    from autotaxer.tuner.study import split_params

    key = _key(2, 16, 8, 8, 0)
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim\n16,8,8,fp32,0\n")
    runs, notes = {}, {}
    for reach in ("1.25", "0"):
        url = f"sqlite:///{tmp_path}/reach{reach}.sqlite"
        args = [*_run_args(shapes, url), "--variants", "planted_slow", "--trials", "6", "--reach", reach]
        proc = _tune([*args, "--jsonl"], env=PLANTED)
        assert proc.returncode == 0, proc.stderr
        runs[reach] = _trials(url, key)
        done = [json.loads(line) for line in proc.stdout.splitlines() if '"shape_done"' in line]
        notes[reach] = [d["note"] for d in done]
    slow = {r: [t for t in ts if t.params.get("variant") == "planted_slow"] for r, ts in runs.items()}
    ran = {r: [t for t in ts if t.state.name == "COMPLETE"] for r, ts in slow.items()}
    assert sorted(split_params(t.params)[1]["delay_ms"] for t in ran["1.25"]) == [20, 21]  # its seeds
    reasons = [t.user_attrs.get("pruned", "") for t in slow["1.25"] if t.state.name == "PRUNED"]
    out = [r for r in reasons if r.startswith("out of reach: planted_slow's fastest trial")]
    assert out and "past --reach 1.25" in out[0]
    assert all(r in out or r.startswith("duplicate of trial") for r in reasons)  # a seed drawn again
    pruned = [t for t in runs["1.25"] if t.state.name == "PRUNED"]  # its draws and repeats of the rest
    assert len(pruned) == FILL_AFTER and notes["1.25"] == ["every configuration in reach has run"]
    assert len(ran["0"]) == 5  # 6 trials: BSP and five of its points


def test_reach_must_be_off_or_a_ratio_above_one(tmp_path: Path) -> None:
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim\n16,8,8,fp32,0\n")
    for bad in ("1", "0.5", "-1", "nan", "inf"):
        proc = _tune([*_run_args(shapes, f"sqlite:///{tmp_path}/r.sqlite"), "--reach", bad])
        assert proc.returncode == 2 and "--reach: must be 0 (off) or a finite ratio > 1" in proc.stderr, (
            bad,
            proc.stderr,
        )
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_tune_world_size_2_tpe_stores_trials_and_winners(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim\n32,16,16,fp32,0\n16,8,16,fp32,1\n")
    args = [*_run_args(shapes, url), "--trials", "8", "--seed", "1"]
    proc = _tune([*args, "--jsonl"])
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    summary = events[-1]
    assert summary["event"] == "summary" and summary["shapes"] == 2 and summary["trials_run"] == 16
    assert summary["mean_overhead_ms"] > 0 and summary["trials_per_min"] > 0
    assert events[0] == {"event": "note", "message": f"database: {url}"}  # where the results go
    first = next(e for e in events if e["event"] == "shape_start")
    assert [e["trial"] for e in events if e["event"] == "trial" and e["key"] == first["key"]][-1] == 8
    ran = [e for e in events if e["event"] == "trial" and e["state"] == "COMPLETE"]
    assert ran and all(e["check_ms"] > 0 and e["prepare_ms"] >= 0 for e in ran)
    winners = {w.key: w for w in _winners(url)}
    for key in (_key(2, 32, 16, 16, 0), _key(2, 16, 8, 16, 1)):
        trials = _trials(url, key)
        finished = [t for t in trials if t.state.name in ("COMPLETE", "FAIL")]
        assert len(finished) == 8
        assert trials[0].params == {"variant": "bsp"}  # the baseline is measured first
        assert all(t.state.name == "COMPLETE" and t.user_attrs["rel_err"] < 1e-5 for t in finished)
        assert all(t.user_attrs["overhead_ms"] > 0 for t in finished)
        # where the overhead went: the workspace's set-up and the first call with the reference check
        for t in finished:
            phases = t.user_attrs["prepare_ms"], t.user_attrs["check_ms"]
            assert all(p >= 0 for p in phases) and t.user_attrs["check_ms"] > 0
        assert winners[key].variant in ("bsp", "cpu_chunked") and winners[key].trials == 8
        assert winners[key].speedup == pytest.approx(winners[key].bsp_us / winners[key].median_us)
        assert winners[key].env["timing"] == "eager" and winners[key].env["torch"]  # how it was measured
        assert winners[key].env["chain"] == "dependent" and winners[key].env["confirmed"] == "interleaved"
        assert float(winners[key].env["link_us"]) > 0  # the link's cost, subtracted from each time
        assert winners[key].env["fastest_form"] == "bsp"  # the only form on CPU: what untuned keys get


def test_warm_start_table_records_run_right_after_the_baseline(tmp_path: Path) -> None:
    from autotaxer.records import WinnerRecord
    from autotaxer.table_file import write_table

    key = _key(2, 32, 16, 16, 0)
    earlier = {"chunks": 4, "order": "ascending"}
    table = tmp_path / "earlier.json"
    write_table(
        [WinnerRecord(key=key, variant="cpu_chunked", params=earlier, median_us=5.0, bsp_us=6.0, trials=9)],
        table,
    )
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim\n32,16,16,fp32,0\n")
    args = [*_run_args(shapes, url), "--trials", "2", "--warm-start", str(table)]
    proc = _tune([*args, "--jsonl"])
    assert proc.returncode == 0, proc.stderr
    notes = [json.loads(line) for line in proc.stdout.splitlines() if '"note"' in line]
    assert any("1 earlier winner(s) queued first" in n["message"] for n in notes), notes
    params = [t.params for t in _trials(url, key)]
    assert params == [
        {"variant": "bsp"},
        {"variant": "cpu_chunked", **{f"cpu_chunked.{k}": v for k, v in earlier.items()}},
    ]


@pytest.mark.slow
def test_world_size_3_and_a_finished_run_resumes_as_a_no_op(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim\n12,8,24,fp32,1\n")
    key = _key(3, 12, 8, 24, 1)
    args = [*_run_args(shapes, url, 3), "--trials", "6", "--quiet"]
    proc = _tune(args)
    assert proc.returncode == 0, proc.stderr
    finished = [t for t in _trials(url, key) if t.state.name in ("COMPLETE", "FAIL")]
    assert len(finished) == 6 and all(t.state.name == "COMPLETE" for t in finished)
    (first,) = _winners(url)
    assert first.key == key and first.trials == 6
    before = len(_trials(url, key))
    again = _tune(args)  # finished: nothing runs, nothing changes
    assert again.returncode == 0, again.stderr
    assert "1 shape(s) already tuned, no trial to run (--retune to start over)" in again.stderr
    assert f"database: {url}" in again.stderr
    assert len(_trials(url, key)) == before and _winners(url) == [first]


@pytest.mark.slow
def test_world_size_8_headline_command_survives_a_hang(tmp_path: Path) -> None:
    """`autotaxer tune --world-size 8` (issue 6's command) on 8 gloo ranks: both layouts, a planted hang
    (gather_dim=0) that the watchdog kills (the group is relaunched with 8 ranks, the second layout runs on
    it) and every other point validated."""
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim\n16,8,8,fp32,0\n8,8,16,fp32,1\n")
    args = [*_run_args(shapes, url, 8), "--sampler", "grid", "--quiet"]
    # a trial at 8 ranks takes ~1 s on a loaded 2-core machine: 6 s lets the hangs end soon
    args += ["--variants", "planted_hang,cpu_chunked", "--trial-timeout", "6"]
    proc = _tune(args, env=PLANTED, timeout=600)
    assert proc.returncode == 0, proc.stderr
    winners = {w.key: w for w in _winners(url)}
    # bsp + cpu_chunked's valid points: 2 rows per rank allow chunks 1-2 (gather_dim=0), 8 rows 1-8
    # (gather_dim=1), each in 2 orders
    for key, points in ((_key(8, 16, 8, 8, 0), 1 + 4), (_key(8, 8, 8, 16, 1), 1 + 8)):
        by_state: dict[str, list] = {}
        for t in _trials(url, key):
            by_state.setdefault(t.state.name, []).append(t)
        if key["gather_dim"] == 0:
            (hang,) = by_state["FAIL"]
            assert hang.params["variant"] == "planted_hang" and hang.user_attrs["failure"].startswith(
                "timeout"
            )
        else:
            assert "FAIL" not in by_state and all(
                t.params["variant"] != "planted_hang" for t in by_state["COMPLETE"]
            )
        done = by_state["COMPLETE"]
        assert len(done) == points and all(t.user_attrs["rel_err"] < 1e-5 for t in done)
        assert winners[key].variant in ("bsp", "cpu_chunked") and winners[key].key.world_size == 8


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(p) for p in text)
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow
def test_resume_after_sigkill_continues_without_duplicates(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim\n16,8,8,fp32,0\n")
    key = _key(2, 16, 8, 8, 0)
    cmd = [AUTOTAXER, "tune", "--device", "cpu", *_run_args(shapes, url)]
    cmd += ["--sampler", "grid", "--variants", "planted_hang,cpu_chunked", "--trial-timeout", "5", "--jsonl"]
    env = {**os.environ, **PLANTED}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:  # wait for the baseline; the next trial (planted_hang) then hangs
            event = json.loads(line)
            if event["event"] == "trial":
                assert event["variant"] == "bsp"
                break
        time.sleep(1.0)
        workers = _children(proc.pid)
        assert len([p for p in workers if _alive(p)]) >= 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers), "workers outlived the killed tuner"
    running = [t for t in _trials(url, key) if t.state.name == "RUNNING"]
    assert [t.params["variant"] for t in running] == ["planted_hang"]

    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    trials = _trials(url, key)
    # nothing that finished ran twice; the interrupted planted_hang ran once more (its own hang is final)
    assert len(trials) == 1 + 1 + 1 + 8
    by_state: dict[str, list] = {}
    for t in trials:
        by_state.setdefault(t.state.name, []).append(t)
    assert set(by_state) == {"COMPLETE", "FAIL"}
    interrupted, hung = by_state["FAIL"]
    assert interrupted.params["variant"] == hung.params["variant"] == "planted_hang"
    assert (
        interrupted.user_attrs["failure"].startswith("interrupted") and interrupted.user_attrs["interrupted"]
    )
    assert "interrupted" not in hung.user_attrs and "interrupted" not in hung.user_attrs["failure"]
    assert len(by_state["COMPLETE"]) == 9
    (winner,) = _winners(url)
    assert winner.trials == 10  # the interrupted trial is not counted


# -- bad input: clear message, exit 2, nothing written (in-process through typer's CliRunner) --------


def _app():
    import typer

    from autotaxer.cli.tune import register

    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:
        pass

    return app


@pytest.mark.parametrize(
    ("csv", "extra", "message"),
    [
        ("M,N,K\n8,8,abc\n", [], "shapes.csv:2: field 'K'"),
        ("M,N,K\n9,8,8\n", [], "shapes.csv:2: field 'M'"),  # 9 rows do not split over 2 ranks
        ("M,N,K\n8,8,8\n", ["--variants", "bsp,nope"], "unknown variant(s) nope"),
        ("M,N,K\n8,8,8\n", ["--variants", ""], "names no variant"),
        ("M,N,K\n8,8,8\n", ["--variants", "bsp,bsp"], "bsp named more than once"),
        ("M,N,K\n8,8,8\n", ["--variants", "bsp,,cpu_chunked"], "an empty name in"),
        ("M,N,K\n8,8,8\n", ["--sampler", "anneal"], "--sampler"),
        ("M,N,K\n8,8,8\n", ["--trials", "0"], "--trials"),
        ("M,N,K\n8,8,8\n", ["--seed", "-1"], "--seed: must be an integer from 0 to 4294967295"),
        ("M,N,K\n8,8,8\n", ["--seed", str(2**70)], "--seed: must be an integer from 0 to 4294967295"),
        ("M,N,K\n8,8,8\n", ["--trial-timeout", "nan"], "--trial-timeout: must be a finite number"),
        ("M,N,K\n8,8,8\n", ["--trial-timeout", "inf"], "--trial-timeout: must be a finite number"),
        ("M,N,K\n8,8,8\n", ["--timeout", "nan"], "--timeout: must be a finite number"),
        ("M,N,K\n8,8,8\n", ["--timeout", "-3"], "--timeout: must be a finite number"),
        ("M,N,K\n8,8,8\n", ["--device", "tpu"], "--device"),
        (
            "M,N,K\n1099511627776,8,8\n",
            [],
            "shapes.csv:2: field 'M': 1099511627776 is larger than 2147483647",
        ),
        ("M,N,K\n8,8,9223372036854775808\n", [], "shapes.csv:2: field 'K': 9223372036854775808 is larger"),
        ("M,N,K\n1073741824,65536,65536\n", [], "shapes.csv:2: field 'M': needs about"),  # cannot fit
        ("M,N,K\n8,8,8\n", ["--world-size", "99999999999999999999"], "--world-size"),
        (
            "M,N,K\n8,8,8\n",
            ["--warm-start", "no_such_table.json"],
            "--warm-start: no_such_table.json: cannot read",
        ),
    ],
)
def test_bad_input_exits_2_before_anything_is_written(
    tmp_path: Path, csv: str, extra: list, message: str
) -> None:
    shapes = _shapes(tmp_path, csv)
    db_file = tmp_path / "t.sqlite"
    args = ["tune", *_run_args(shapes, f"sqlite:///{db_file}"), "--device", "cpu"]
    result = CliRunner().invoke(_app(), [*args, *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not db_file.exists()


def test_cuda_without_enough_gpus_is_refused(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 64:
        pytest.skip("a machine with 64 GPUs")
    shapes = _shapes(tmp_path, "M,N,K\n64,8,8\n")
    db_file = tmp_path / "t.sqlite"
    args = ["tune", *_run_args(shapes, f"sqlite:///{db_file}", 64), "--device", "cuda"]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 2
    assert "needs 64 GPUs" in result.output
    assert not db_file.exists()


@pytest.mark.slow
def test_inside_torchrun_rank_0_tunes_and_the_others_follow(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(tmp_path, "M,N,K,dtype\n16,8,8,fp32\n")
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # torchrun, wherever its script was installed
    cmd = [*torchrun, "--standalone", "--nproc-per-node", "2", "--no-python", AUTOTAXER, "tune"]
    cmd += ["--device", "cpu", *_run_args(shapes, url), "--trials", "4", "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "launched 1" in proc.stderr  # the launch's own ranks: nothing spawned
    finished = [t for t in _trials(url, _key(2, 16, 8, 8, 0)) if t.state.name == "COMPLETE"]
    assert len(finished) == 4
    (winner,) = _winners(url)
    assert winner.trials == 4


@pytest.mark.slow
def test_variants_of_one_op_leave_the_other_ops_rows_their_bsp_forms(tmp_path: Path) -> None:
    """``--variants`` over a shapes file of both ops names each op's own (``autotaxer bench`` does the
    same): ``cpu_chunked`` is tried at the ``ag_gemm`` row, and the ``gemm_rs`` row, which has no such
    variant, is tuned over its BSP forms instead of the run being refused."""
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(
        tmp_path, "op,M,N,K,dtype,scatter_dim\nag_gemm,32,16,16,fp32,\ngemm_rs,32,16,16,fp32,0\n"
    )
    proc = _tune([*_run_args(shapes, url), "--trials", "3", "--variants", "cpu_chunked", "--quiet"])
    assert proc.returncode == 0, proc.stderr
    tried = {w.key.op: {t.params["variant"] for t in _trials(url, w.key)} for w in _winners(url)}
    assert tried == {"ag_gemm": {"bsp", "cpu_chunked"}, "gemm_rs": {"bsp"}}


def test_both_weight_layouts_are_tuned_exported_and_imported_apart(tmp_path: Path) -> None:
    """A shapes file with ``b_layout``: one study and one winner per layout, the nn.Linear layout's
    inputs made as ``weight.t()``; export and import keep the field."""
    url = f"sqlite:///{tmp_path}/t.sqlite"
    shapes = _shapes(tmp_path, "M,N,K,dtype,gather_dim,b_layout\n32,16,16,fp32,0,nk\n32,16,16,fp32,0,kn\n")
    proc = _tune([*_run_args(shapes, url), "--trials", "4", "--quiet"])
    assert proc.returncode == 0, proc.stderr
    kn = _key(2, 32, 16, 16, 0)
    nk = ProblemKey.make(
        "ag_gemm", "cpu", 2, "fp32", {"M": 32, "N": 16, "K": 16}, {"gather_dim": 0, "b_layout": "nk"}
    )
    winners = {w.key: w for w in _winners(url)}
    assert (
        set(winners) == {kn, nk} and nk.text.endswith("gather_dim=0,b_layout=nk") and kn.text.endswith("=0")
    )
    for key in (kn, nk):
        assert len([t for t in _trials(url, key) if t.state.name in ("COMPLETE", "FAIL")]) == 4
    out = tmp_path / "table.json"
    runner = CliRunner()
    from autotaxer.cli import app

    assert runner.invoke(app, ["export", "--db", url, "--out", str(out)]).exit_code == 0
    assert '"b_layout": "nk"' in out.read_text()
    from autotaxer.table_file import read_table

    assert {r.key for r in read_table(out)} == {kn, nk}
    copy_url = f"sqlite:///{tmp_path}/copy.sqlite"
    assert runner.invoke(app, ["import", str(out), "--db", copy_url]).exit_code == 0
    assert {w.key for w in _winners(copy_url)} == {kn, nk}
