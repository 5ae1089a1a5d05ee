"""The argv and environment `pdctl plan` gives a sim engine are exactly what `python -m pdctl.sim` accepts."""

from __future__ import annotations

from pathlib import Path

from pdctl.plan import plan
from pdctl.sim.config import parse_args
from pdctl.topology import load

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "local-sim.yaml"


def test_local_sim_plan_parses() -> None:
    topo = load(CONFIG)
    engines = [s for s in plan(topo) if s.role in ("prefill", "decode")]
    assert {s.role for s in engines} == {"prefill", "decode"}
    for spec in engines:
        assert spec.argv[1:4] == ("-m", "pdctl.sim", "serve")
        cfg = parse_args(list(spec.argv[3:]), env=spec.env)
        assert cfg.role == spec.role and cfg.ignored_args == ()
        assert f"http://{cfg.host}:{cfg.port}" == spec.url
        assert cfg.side_channel_port in spec.ports
        assert cfg.model_name == topo.model.name and cfg.block_size == (topo.model.block_size or 16)
        assert cfg.kv.bidirectional == topo.connector.bidirectional_kv_xfer
        assert cfg.kv.decoder_kv_blocks_ttl == topo.connector.decoder_kv_blocks_ttl
        assert cfg.speed == topo.sim.speed and cfg.num_gpu_blocks == topo.sim.num_blocks
        assert cfg.prefix_caching  # on by default on both roles
