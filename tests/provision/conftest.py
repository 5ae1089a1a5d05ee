"""Fixtures the provisioning tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.provision.support import layout_host


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return layout_host(tmp_path, "a", monkeypatch)
