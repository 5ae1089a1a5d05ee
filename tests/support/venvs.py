"""Stand-in venvs for lifecycle tests: `bin/python` is a shell script, so an engine can crash, hang or print."""

from __future__ import annotations

from pathlib import Path


def script_venv(root: Path, body: str) -> str:
    """A venv at `root` whose `bin/python` runs the sh `body` with pdctl's argv; returns the venv path."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(f"#!/bin/sh\n{body}\n")
    python.chmod(0o755)
    return str(root)
