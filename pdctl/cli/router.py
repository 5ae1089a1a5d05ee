"""`pdctl router ...`: the router's own command line (pdctl.router.serve), behind pdctl's error boundary."""

from __future__ import annotations

import typer

from pdctl.cli.support import call


def register(app: typer.Typer) -> None:
    from pdctl.router.serve import router_app

    app.add_typer(router_app(call), name="router")
