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


def system_site_env(root: Path) -> dict[str, str]:
    """Env under which this interpreter's packages count as the host's system site-packages.

    Provisioning tests make node venvs with `--system-site-packages` and expect pdctl's dependencies there, as on
    a GPU host whose system Python has torch. When the tests themselves run in a venv, a venv made from it sees the
    *base* interpreter's packages instead, which lack them; so the user site (enabled exactly when system
    site-packages are) of a private PYTHONUSERBASE gets a .pth that adds the test interpreter's site dirs.
    """
    import site
    import sys

    user_site = root / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    user_site.mkdir(parents=True, exist_ok=True)
    dirs = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (user_site / "pdctl-tests.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in dirs))
    return {"PYTHONUSERBASE": str(root)}
