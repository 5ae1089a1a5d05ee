"""scripts/gpu/restart_check.py, the GPU run's router-restart check, on a simulated deployment started by `pdctl up`:
its four loads answer every turn, and after each restart the new router finds the decode released."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.conftest import free_port
from tests.support.sim_topology import sim_yaml

ROOT = Path(__file__).resolve().parents[2]
PDCTL = str(Path(sys.executable).with_name("pdctl"))


def test_restart_check_on_simulated_engines(tmp_path: Path) -> None:
    name = f"rc-{uuid.uuid4().hex[:8]}"
    router_port = free_port()
    topo = tmp_path / "t.yaml"
    topo.write_text(sim_yaml(name, tmp_path / "work", [(free_port(), free_port())], [(free_port(), free_port())],
                             f"port: {router_port}"))
    env = {**os.environ, "PDCTL_HOME": str(tmp_path / "home")}
    up = subprocess.run([PDCTL, "up", "-t", str(topo)], env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        out = tmp_path / "out.json"
        done = subprocess.run(
            [sys.executable, str(ROOT / "scripts/gpu/restart_check.py"), "-t", str(topo), "--cli", PDCTL,
             "--router", f"http://127.0.0.1:{router_port}", "--conversations", "8", "--streams", "4", "--turns", "2",
             "--words", "600", "--timeout", "30", "--json", str(out)],
            env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        legs = json.loads(out.read_text())["legs"]
    finally:
        subprocess.run([PDCTL, "down", "-t", str(topo)], env=env, capture_output=True, timeout=60)

    assert list(legs) == ["fresh", "again", "up --set", "SIGKILL+up"]
    for leg in legs.values():
        assert (leg["load"]["ok"], leg["load"]["errors"], leg["load"]["timeouts"]) == (16, 0, 0), leg["load"]
    for restarted in ("up --set", "SIGKILL+up"):
        leg = legs[restarted]
        assert leg["up_exit"] == 0, leg["up_tail"]
        assert leg["kv_before"] > 0.05  # the load before left its conversations pinned on the decode
        assert leg["released_s"] is not None and leg["kv_first"] <= 0.05, leg  # the new router found it released
