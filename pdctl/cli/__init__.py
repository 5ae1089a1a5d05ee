"""pdctl's command line, a thin shell over the library: `root` holds the app, `validate` and `plan`; one module
per command group registers the rest (bench, demo, doctor, init_cmd, lifecycle, router). Shared: `options` (each
option declared once), `errors` (the one error boundary), `output` (consoles, JSON), `support` (which topology)."""

from pdctl.cli.root import app, main

__all__ = ["app", "main"]
