"""One GPU for several instances: allowed when each caps its memory and the caps sum below 0.95; exit 2 otherwise."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.plan import plan
from pdctl.topology import load

runner = CliRunner()
ROOT = Path(__file__).parents[2]

SHARED = """\
name: one-gpu
engine: vllm
nodes:
  - name: a
    address: 127.0.0.1
    transport: local
    gpus: 1
model:
  id: Qwen/Qwen3-8B
  gpu_memory_utilization: 0.45
prefill:
  - node: a
    gpus: [0]
    port: 8100
    side_channel_port: 5600
decode:
  - node: a
    gpus: [0]
    port: 8200
    side_channel_port: 5601
router:
  node: a
  port: 8000
"""


def validate(tmp_path: Path, text: str) -> tuple[int, str]:
    path = tmp_path / "topo.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["validate", "-t", str(path)], env={"COLUMNS": "300"})
    return result.exit_code, " ".join(result.output.split())


def test_capped_instances_share_a_gpu(tmp_path: Path) -> None:
    code, output = validate(tmp_path, SHARED)
    assert code == 0, output
    assert "ok one-gpu: 1 prefill, 1 decode" in output


def test_an_uncapped_instance_keeps_the_old_error_with_the_fix(tmp_path: Path) -> None:
    code, output = validate(tmp_path, SHARED.replace("  gpu_memory_utilization: 0.45\n", ""))
    assert code == 2, output
    assert ("topo.yaml:17: decode[0].gpus: GPU 0 of node `a` is already given to prefill[0] (give each instance its "
            "own GPUs, or share this one: set model.gpu_memory_utilization so that the instances on it sum below 0.95 "
            "(e.g. 0.45 each))") in output, output
    assert "Traceback" not in output


def test_caps_that_sum_to_the_limit_are_refused(tmp_path: Path) -> None:
    code, output = validate(tmp_path, SHARED.replace("0.45", "0.5"))
    assert code == 2, output
    assert ("topo.yaml:18: decode[0].gpus: GPU 0 of node `a` is shared by prefill[0], decode[0], whose "
            "gpu_memory_utilization sums to 1, not below 0.95 (lower model.gpu_memory_utilization "
            "(e.g. 0.45 each))") in output, output


def test_an_aggregated_topology_runs_one_engine_so_nothing_is_shared(tmp_path: Path) -> None:
    text = SHARED.replace("0.45", "0.9").replace("engine: vllm", "engine: vllm\nmode: aggregated")
    code, output = validate(tmp_path, text)
    assert code == 0, output


def test_instances_on_a_shared_gpu_get_cuda_ipc_reads() -> None:
    """UCX turns cuda_ipc's get off without NVLink; on one GPU NIXL's reads then crawl over TCP (0.45 GB/s)."""
    specs = plan(load(ROOT / "configs/h200-1gpu.yaml"))
    engines = {s.name: s.env for s in specs if s.role != "router"}
    assert {name: env.get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY") for name, env in engines.items()} == {
        "decode-0": "y", "prefill-0": "y"}
    own = plan(load(ROOT / "configs/h200x2-local.yaml"))
    assert not any("UCX_CUDA_IPC_ENABLE_GET_ZCOPY" in s.env for s in own)


def test_the_environment_can_override_the_shared_gpu_setting() -> None:
    topo = load(ROOT / "configs/h200-1gpu.yaml", ["env.all={UCX_CUDA_IPC_ENABLE_GET_ZCOPY: n}"])
    assert {s.env.get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY") for s in plan(topo) if s.role != "router"} == {"n"}
