"""One SSH test host (a network namespace with a real sshd) for the CLI's SSH options."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.netns import SshLab, running_lab


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    with running_lab(tmp_path_factory.mktemp("ssh-lab"), count=1) as lab:
        yield lab
