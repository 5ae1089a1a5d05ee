"""`up`'s check on instances sharing a GPU: KV at the TCP fallback's rate fails the deployment, CUDA IPC passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdctl.errors import LaunchError
from pdctl.lifecycle.bringup.nixl_check import START_MARK, check_shared_gpu_rate, kv_rate_gbps, shared_gpu_problem
from pdctl.plan import plan
from pdctl.remote.local import LocalTransport
from pdctl.topology import load

ROOT = Path(__file__).parents[2]
# vLLM 0.26.0's line; the numbers of the slow one are those measured on one H200 with UCX's defaults.
LINE = ("(APIServer pid=2378) INFO 12-01 10:27:50 [metrics.py:103] KV Transfer metrics: Num successful transfers={n}, "
        "Avg xfer time (ms)={ms}, P90 xfer time (ms)={ms}, Avg post time (ms)=1.0, P90 post time (ms)=1.0, "
        "Avg MB per transfer={mb}, Throughput (MB/s)=1.0, Avg number of descriptors=576.0\n")
SLOW = LINE.format(n=1, ms=7500.0, mb=3400.0)  # 3.4 GB in 7.5 s
FAST = LINE.format(n=2, ms=60.0, mb=3400.0)


def test_the_rate_is_bytes_over_transfer_time() -> None:
    assert kv_rate_gbps(SLOW) == pytest.approx(3400 * 2**20 / 7.5e9)
    assert kv_rate_gbps("no metrics here\n") is None


def test_the_slow_path_is_refused_with_the_shared_gpu_named() -> None:
    topo = load(ROOT / "configs/h200-1gpu.yaml")
    rate, problem = shared_gpu_problem(topo, {"decode-0": SLOW, "prefill-0": ""})
    assert rate == pytest.approx(0.475, abs=0.001)
    assert problem == ("KV moves at 0.48 GB/s between instances sharing a GPU (GPU 0 of `gpu-host`: decode[0], "
                       "prefill[0]): UCX's TCP fallback, not CUDA IPC (below 2 GB/s)")
    assert shared_gpu_problem(topo, {"decode-0": SLOW, "prefill-0": FAST})[1] is None


def test_up_check_reads_the_logs_since_the_last_start(tmp_path: Path) -> None:
    topo = load(ROOT / "configs/h200-1gpu.yaml", [f"work_dir={tmp_path}"])
    engines = [s for s in plan(topo) if s.role != "router"]
    hosts = {"gpu-host": LocalTransport("gpu-host")}
    logs = {s.name: Path(s.log_path) for s in engines}
    for path in logs.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    # an earlier start moved KV fast; this one is on the slow path
    logs["decode-0"].write_text(f"{START_MARK} 1\n{FAST}{START_MARK} 2\n{SLOW}")
    logs["prefill-0"].write_text(f"{START_MARK} 2\n")
    with pytest.raises(LaunchError) as err:
        check_shared_gpu_rate(topo, engines, hosts, wait_s=0)
    assert err.value.message.startswith("KV moves at 0.48 GB/s between instances sharing a GPU")
    assert "mode: aggregated" in (err.value.hint or "")
    logs["prefill-0"].write_text(f"{START_MARK} 2\n{FAST}")
    assert check_shared_gpu_rate(topo, engines, hosts, wait_s=0) == pytest.approx(2 * 3400 * 2**20 / 120e6)
    own = load(ROOT / "configs/h200x2-local.yaml")
    assert check_shared_gpu_rate(own, plan(own), hosts, wait_s=0) is None
