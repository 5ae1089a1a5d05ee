"""A simulated deployment topology on free 127.0.0.1 ports with a private PDCTL_HOME; taken down at the end."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from pdctl.lifecycle.changes.down import down
from pdctl.topology import load
from tests.conftest import free_port


@pytest.fixture
def sim_topology(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("PDCTL_HOME", str(tmp_path / "home"))
    path = tmp_path / "topo.yaml"
    path.write_text(
        f"""name: bench-{uuid.uuid4().hex[:8]}
engine: sim
nodes:
  - {{name: local, address: 127.0.0.1, transport: local}}
model: {{id: Qwen/Qwen3-32B, served_name: Qwen, max_model_len: 32768, max_num_seqs: 8, block_size: 16}}
prefill:
  - {{node: local, port: {free_port()}, side_channel_port: {free_port()}, prefix_caching: false}}
decode:
  - {{node: local, port: {free_port()}, side_channel_port: {free_port()}}}
router: {{node: local, port: {free_port()}, local_prefill_tokens: 0, min_read_tokens: 0}}  # every warm turn through
# the P/D handshake, and its D->P read however short the history (the cheapest-source rule, issue 29, is off)
sim: {{speed: 100, num_blocks: 4000}}
python: {{venv: null}}
work_dir: {tmp_path / "work"}
"""
    )
    yield path
    down(load(path), Console(stderr=True, color_system=None))
