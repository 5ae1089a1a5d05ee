"""Reading the router's members file (its format: pdctl.router.wire.Members). `pdctl up` writes it through the
node's transport and sends SIGHUP (pdctl.lifecycle.changes.membership): a membership change restarts nothing."""

from __future__ import annotations

import json
from pathlib import Path

from pdctl.errors import UsageError
from pdctl.router.wire import Members

__all__ = ["Members", "parse", "read"]


def parse(text: str, where: str) -> Members:
    """The members `text` describes; a UsageError naming `where` and the bad part otherwise."""
    try:
        return Members.from_json(json.loads(text))
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}", hint="`pdctl up` rewrites it") from None


def read(path: str) -> Members | None:
    """The members file at `path`, or None where there is none."""
    try:
        text = Path(path).expanduser().read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"--members-file {path}: cannot read it ({exc.strerror})",
                         hint="`pdctl up` writes it") from None
    return parse(text, f"--members-file {path}")
