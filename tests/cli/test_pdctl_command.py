"""The demo's clean-up line names a pdctl the user's shell can run: `pdctl` only when PATH finds this one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pdctl.cli.output import pdctl_command

MINE = Path(sys.executable).parent / "pdctl"


def test_pdctl_on_the_users_path_is_named_pdctl(monkeypatch: pytest.MonkeyPatch) -> None:
    assert MINE.exists()  # the test venv's console script
    monkeypatch.setenv("PDCTL_USER_PATH", f"{MINE.parent}:/usr/bin")
    assert pdctl_command() == "pdctl"


def test_a_venv_the_user_did_not_activate_is_named_by_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{MINE.parent}:/usr/bin")  # as scripts/demo runs it: the venv put first
    monkeypatch.setenv("PDCTL_USER_PATH", "/usr/bin:/bin")  # the user's own shell
    assert pdctl_command() == str(MINE)
