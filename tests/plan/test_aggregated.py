"""`mode: aggregated` planned: one engine per decode instance; one alone takes the clients itself, two or more sit
behind the router in its aggregated mode. The 2P2D golden file pins the whole plan."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pdctl.plan import entry, plan
from pdctl.router.config import RouterConfig
from pdctl.topology import load
from tests.plan.test_plan import GOLDEN, ROOT, SELF_PYTHON


def test_the_2p2d_aggregated_plan_is_golden() -> None:
    """`PDCTL_UPDATE_GOLDEN=1 pytest tests/plan` rewrites the file; review the diff before committing."""
    got = [s.to_json() for s in plan(load(ROOT / "configs/p5en-2p2d.yaml", ["mode=aggregated"]), SELF_PYTHON)]
    golden = GOLDEN / "p5en-2p2d-aggregated.json"
    if os.environ.get("PDCTL_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(golden.read_text())


def test_two_decodes_are_two_engines_behind_an_aggregated_router() -> None:
    topo = load(ROOT / "configs/p5en-2p2d.yaml", ["mode=aggregated"])
    a0, a1, router = plan(topo, SELF_PYTHON)
    assert [(s.name, s.role, s.node, s.url) for s in (a0, a1, router)] == [
        ("aggregated-0", "decode", "decode-a", "http://10.0.1.12:8200"),
        ("aggregated-1", "decode", "decode-b", "http://10.0.1.13:8200"),
        ("router", "router", "router-node", "http://10.0.1.14:8000"),
    ]
    for engine in (a0, a1):
        assert "--kv-transfer-config" not in engine.argv and "--no-enable-prefix-caching" not in engine.argv
        # behind the router an engine takes the deployment's key, which only the router and pdctl hold
        assert engine.secret_env == {"VLLM_API_KEY": "~/.pdctl/p5en-2p2d/engine.key"}
        assert "VLLM_API_KEY" not in engine.env
    assert list(router.argv) == [
        "~/.pdctl/venv/bin/python", "-m", "pdctl.router", "serve", "--host", "10.0.1.14", "--port", "8000",
        "--mode", "aggregated", "--decode", "http://10.0.1.12:8200", "--decode", "http://10.0.1.13:8200",
        "--model", "Qwen", "--engine-key-file", "~/.pdctl/p5en-2p2d/engine.key",
    ]
    assert entry(plan(topo, SELF_PYTHON)) == router
    assert topo.has_router() and [(r, i) for r, i, _ in topo.instances()] == [("decode", 0), ("decode", 1)]


def test_the_aggregated_router_argv_is_a_valid_router_config() -> None:
    sets = ["mode=aggregated", "router.api_key_env=CLIENT_KEY", "router.conversation_headers=[X-Thread]"]
    *_, router = plan(load(ROOT / "configs/p5en-2p2d.yaml", sets), SELF_PYTHON)
    args = list(router.argv[4:])
    assert args[args.index("--api-key-env"):][:4] == ["--api-key-env", "CLIENT_KEY", "--conversation-header",
                                                      "X-Thread"]
    decode = tuple(args[i + 1] for i, a in enumerate(args) if a == "--decode")
    config = RouterConfig(prefill=(), decode=decode, mode="aggregated", model="Qwen")
    assert config.decode == ("http://10.0.1.12:8200", "http://10.0.1.13:8200")


def test_one_decode_stays_one_engine_without_a_router(tmp_path: Path) -> None:
    topo = load(ROOT / "configs/local-sim.yaml", ["mode=aggregated"])
    (engine,) = plan(topo, SELF_PYTHON)
    assert not topo.has_router() and engine.name == "aggregated-0" and engine.secret_env == {}
    assert entry([engine]) == engine


def test_prefill_instances_do_not_run_in_aggregated_mode() -> None:
    topo = load(ROOT / "configs/p5en-2p2d.yaml", ["mode=aggregated"])
    assert all(s.role != "prefill" for s in plan(topo, SELF_PYTHON))
    assert topo.prefix_caching_for(topo.decode[1])
