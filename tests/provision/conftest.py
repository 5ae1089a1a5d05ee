"""Fixtures the provisioning tests share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.provision.support import host_root


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root, layout = host_root(tmp_path, "a")
    spec = {"a": {"root": layout.root, "path": list(layout.path), "env": dict(layout.env)}}
    (tmp_path / "layout.json").write_text(json.dumps(spec))
    monkeypatch.setenv("PDCTL_HOST_LAYOUT", str(tmp_path / "layout.json"))
    return root
