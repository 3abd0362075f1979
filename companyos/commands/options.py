"""Options shared by every command group."""

from __future__ import annotations

import typer

DbOption = typer.Option(None, "--db", help="SQLAlchemy URL of the store (default: $COMPANYOS_DB "
                        "or sqlite:///companyos.db)")
JsonOption = typer.Option(False, "--json", help="Print one JSON document instead of tables.")
