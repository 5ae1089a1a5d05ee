"""Fixtures every test area shares. Area-specific fixtures live in that area's own conftest.py."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_port


@pytest.fixture
def port() -> Callable[[], int]:
    return free_port


@pytest.fixture(scope="session")
def wheelhouse() -> Iterator[Path]:
    """pdctl's dependencies as wheels, offline (tests/support/wheelhouse.py), in a directory every user can read."""
    from tests.support.wheelhouse import build_wheelhouse, pdctl_requirements

    root = Path(tempfile.mkdtemp(prefix="pdctl-wheelhouse-"))
    root.chmod(0o755)
    try:
        yield build_wheelhouse(root / "wheels", pdctl_requirements())
    finally:
        shutil.rmtree(root, ignore_errors=True)


def offline_pip_env(wheels: Path) -> dict[str, str]:
    """Environment for a pip that installs only from `wheels`: no index, no config files, no network."""
    from tests.support.wheelhouse import PIP_OFFLINE

    return {**PIP_OFFLINE, "PIP_FIND_LINKS": str(wheels)}
