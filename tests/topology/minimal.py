"""The smallest valid topology (a sim engine on one local node), for tests that break one value of it."""

MINIMAL = """\
name: demo
engine: sim
nodes:
  - name: a
    transport: local
model:
  id: Qwen/Qwen3-32B
prefill:
  - {node: a, port: 8100, side_channel_port: 5600}
decode:
  - {node: a, port: 8200, side_channel_port: 5601}
router:
  node: a
  port: 8000
python:
  venv: null
"""
