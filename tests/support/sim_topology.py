"""The YAML of a simulated deployment on this machine (local transport, no venv, fast engines), for tests and
scripts that scale it: its engines' (port, side channel port) pairs and its router's settings are the caller's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

Ports = Sequence[tuple[int, int]]


def _instances(ports: Ports) -> str:
    return "\n".join(f"  - {{node: local, port: {p}, side_channel_port: {s}}}" for p, s in ports)


def sim_yaml(name: str, work: Path, prefill: Ports, decode: Ports, router: str) -> str:
    """`router`: the body of the router's mapping after `node: local`, e.g. `port: 8000, replicas: 3`."""
    return f"""name: {name}
engine: sim
nodes:
  - {{name: local, address: 127.0.0.1, transport: local}}
model: {{id: Qwen/Qwen3-32B, served_name: Qwen, max_model_len: 32768, max_num_seqs: 8, block_size: 16}}
prefill:
{_instances(prefill)}
decode:
{_instances(decode)}
router: {{node: local, {router}}}
sim: {{speed: 200, num_blocks: 4000}}
python: {{venv: null}}
work_dir: {work}
"""
