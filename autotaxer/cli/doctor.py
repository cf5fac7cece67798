"""``autotaxer doctor``: what this machine offers (GPUs, peer access, Iris, versions, database)."""

from __future__ import annotations

import os
from typing import Any

import typer

from ._common import DbOption, FormatOption, OutputFormat, print_json


def gpu_report() -> dict[str, Any]:
    """Visible GPUs with their capability and the peer-access matrix."""
    import torch

    from autotaxer._target import cuda_target

    if not torch.cuda.is_available():
        return {"available": False, "count": 0, "devices": [], "peer_access": []}
    n = torch.cuda.device_count()
    devices = []
    for i in range(n):
        props = torch.cuda.get_device_properties(i)
        target = cuda_target(i)
        devices.append(
            {
                "index": i,
                "name": props.name,
                "gpu_model": target.gpu_model,
                "arch": target.arch,
                "capability": f"{props.major}.{props.minor}",
                "sms": target.num_sms,
                "memory_gib": round(props.total_memory / 2**30, 1),
            }
        )
    peers = [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)]
    return {"available": True, "count": n, "devices": devices, "peer_access": peers}


def iris_report() -> dict[str, Any]:
    """Whether Iris imports, its version, and the allocator autotaxer would use."""
    import torch

    from autotaxer._target import _version

    report: dict[str, Any] = {"version": _version("tokenspeed-iris"), "importable": False, "error": None}
    try:
        import iris  # noqa: F401

        report["importable"] = True
    except Exception as e:  # report any import failure; doctor must not crash
        report["error"] = f"{type(e).__name__}: {e}"
    user = os.environ.get("IRIS_ALLOCATOR")
    if user:
        report["allocator"], report["allocator_source"] = user, "IRIS_ALLOCATOR"
    elif torch.version.hip is None:
        report["allocator"], report["allocator_source"] = "vmem_chunked", "autotaxer default on NVIDIA"
    else:
        report["allocator"], report["allocator_source"] = "torch", "Iris default"
    return report


def database_report(url: str | None) -> dict[str, Any]:
    """The database URL and its schema revision (a missing SQLite file is not created)."""
    from sqlalchemy.engine import make_url

    from autotaxer.storage import DatabaseError, default_url, open_database
    from autotaxer.storage._engine import sqlite_file
    from autotaxer.storage._migrate import head_revision

    url = url or default_url()
    report: dict[str, Any] = {"url": url, "head": head_revision(), "revision": None, "status": "ok"}
    try:
        parsed = make_url(url)
        report["url"] = parsed.render_as_string(hide_password=True)
        path = sqlite_file(parsed)
        if path is not None and not path.exists():
            report["status"] = "not created yet (created on first use)"
            return report
        with open_database(url, read_only=True) as database:
            report["revision"] = database.current_revision()
        if report["revision"] != report["head"]:
            report["status"] = "behind: run `autotaxer db upgrade`"
    except (DatabaseError, ValueError) as e:
        report["status"] = f"error: {e}"
    return report


def doctor(db: DbOption = None, fmt: FormatOption = OutputFormat.human) -> None:
    """Report GPUs, peer access, Iris, versions and the database; exit 2 when the database is refused."""
    from autotaxer._target import software_versions

    report = {
        "versions": software_versions(),
        "gpus": gpu_report(),
        "iris": iris_report(),
        "database": database_report(db),
    }
    if fmt is OutputFormat.json:
        print_json(report)
    else:
        _print_human(report)
    if report["database"]["status"].startswith("error:"):  # the whole report printed, then the verdict
        raise typer.Exit(2)


def _print_human(report: dict[str, Any]) -> None:
    echo = typer.echo
    echo("versions: " + ", ".join(f"{k} {v or '-'}" for k, v in report["versions"].items()))
    gpus = report["gpus"]
    if not gpus["available"]:
        echo("gpus: none visible (CPU only: --device cpu works; GPU variants do not)")
    else:
        echo(f"gpus: {gpus['count']}")
        for d in gpus["devices"]:
            echo(
                f"  [{d['index']}] {d['name']} ({d['gpu_model']}, {d['arch']}, capability {d['capability']}, "
                f"{d['sms']} SMs, {d['memory_gib']} GiB)"
            )
        echo("peer access (row can access column):")
        for i, row in enumerate(gpus["peer_access"]):
            echo(f"  {i}: " + " ".join("Y" if ok else "-" for ok in row))
    iris = report["iris"]
    state = "importable" if iris["importable"] else f"NOT importable ({iris['error']})"
    allocator = f"allocator {iris['allocator']} ({iris['allocator_source']})"
    echo(f"iris: {iris['version'] or 'not installed'}, {state}, {allocator}")
    dbr = report["database"]
    echo(
        f"database: {dbr['url']}: revision {dbr['revision'] or 'none'} (head {dbr['head']}), {dbr['status']}"
    )


def register(app: typer.Typer) -> None:
    """Add ``doctor`` to ``app``."""
    app.command("doctor")(doctor)
