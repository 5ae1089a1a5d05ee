"""pdctl's command line: `root` holds the app and the top-level commands, one module per command group
registers the rest, and `support` holds what they share (options, output, the error boundary)."""

from pdctl.cli.root import app, main

__all__ = ["app", "main"]
