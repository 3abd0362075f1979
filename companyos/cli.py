"""The `companyos` command line: run agents, serve them, replay and analyse what they did."""

from __future__ import annotations

import typer

from companyos.config import resolve_db

app = typer.Typer(help="CompanyOS: an event-sourced RL environment of messy enterprise workflows.",
                  no_args_is_help=True, add_completion=False)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")

DbOption = typer.Option(None, "--db", help="SQLAlchemy URL of the store (default: $COMPANYOS_DB "
                        "or sqlite:///companyos.db)")


@db_app.command("upgrade")
def db_upgrade(db: str | None = DbOption) -> None:
    """Create the store or bring it to the newest migration."""
    from eventstore import EventStore
    from eventstore.migrate import head_revision

    url = resolve_db(db)
    EventStore.open(url).close()
    typer.echo(f"{url}: at migration {head_revision()}")


def main() -> None:
    app()
