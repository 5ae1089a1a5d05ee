"""Sim deployments inside a real Slurm cluster (tests/support/slurm.py): three hosts, so that prefill, decode
and router each run on their own host with their own address."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.lifecycle.conftest import console, pdctl_home, topology_yaml  # noqa: F401
from tests.support.slurm import SlurmLab, running_slurm

WriteTopo = Callable[..., Path]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmLab]:
    with running_slurm(tmp_path_factory.mktemp("slurm"), count=3) as cluster:
        yield cluster


@pytest.fixture
def write_topo(tmp_path: Path, pdctl_home: Path, cluster: SlurmLab) -> Iterator[WriteTopo]:  # noqa: F811
    """Write a sim topology with nodes p, d, r and the given `slurm:` block; jobs left by a test are cancelled."""
    names: list[str] = []

    def write(slurm: str, extra: str = "", nodes: list[dict[str, object]] | None = None, **kw: object) -> Path:
        name = f"sl-{uuid.uuid4().hex[:8]}"
        names.append(name)
        path = tmp_path / f"{name}.yaml"
        nodes = nodes or [{"name": n} for n in ("p", "d", "r")]
        text = topology_yaml(name, tmp_path / "work", nodes=nodes, placement=("p", "d", "r"),  # type: ignore[arg-type]
                             extra_yaml=f"slurm: {slurm}\n{extra}", **kw)
        path.write_text(text)
        return path

    yield write
    for name in names:
        cluster.cmd("scancel", "--name", f"pdctl-{name}")
