"""``autotaxer db upgrade|current``: schema migrations of the tuning database."""

from __future__ import annotations

import typer

from ._common import DbOption, FormatOption, OutputFormat, QuietOption, open_db, print_json

db_app = typer.Typer(help="Manage the tuning database schema.", no_args_is_help=True, rich_markup_mode=None)


def _report(database, fmt: OutputFormat) -> None:
    from autotaxer.storage._migrate import head_revision

    current, head = database.current_revision(), head_revision()
    if fmt is OutputFormat.json:
        print_json(
            {"url": database.display_url, "revision": current, "head": head, "up_to_date": current == head}
        )
        return
    state = "up to date" if current == head else f"behind (head is {head})"
    typer.echo(f"{database.display_url}: revision {current or 'none'}, {state}")


@db_app.command("upgrade")
def upgrade(db: DbOption = None, fmt: FormatOption = OutputFormat.human, quiet: QuietOption = False) -> None:
    """Create the database or migrate it to the newest schema.

    With Optuna's tables, so any number of tuners can then start on it at once (opening a database for
    writing migrates it too).
    """
    from autotaxer.storage import DatabaseError

    with open_db(db, upgrade=True) as database:
        try:
            database.optuna_storage().engine.dispose()
        except DatabaseError as e:  # bad input, as every refused database
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
        if not quiet:
            _report(database, fmt)


@db_app.command("current")
def current(db: DbOption = None, fmt: FormatOption = OutputFormat.human) -> None:
    """Show the database's schema revision without migrating it."""
    with open_db(db, read_only=True) as database:
        _report(database, fmt)


def register(app: typer.Typer) -> None:
    """Add the ``db`` group to ``app``."""
    app.add_typer(db_app, name="db")
