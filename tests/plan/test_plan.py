"""The plan is pure and pinned: the seed deployment's commands, and a golden file per shipped config."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.plan import plan
from pdctl.sim.config import parse_args
from pdctl.topology import load

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
SELF_PYTHON = "/usr/bin/python3"

SEED_KV = (
    '{"kv_connector":"NixlConnector","kv_role":"%s","kv_buffer_device":"cuda","kv_load_failure_policy":"fail",'
    '"kv_connector_extra_config":{"backends":["LIBFABRIC"],"kv_recompute_threshold":64,'
    '"decoder_kv_blocks_ttl":480,"bidirectional_kv_xfer":true}}'
)
SEED_MODEL = [
    "serve", "Qwen/Qwen3-32B", "--served-model-name", "Qwen", "--dtype", "bfloat16",
    "--tensor-parallel-size", "8", "--max-model-len", "32768", "--max-num-seqs", "8",
]


def test_seed_deployment_is_reproduced_exactly() -> None:
    decode, prefill, router = plan(load(ROOT / "configs/p5en-1p1d.yaml"), SELF_PYTHON)

    assert prefill.name == "prefill-0" and prefill.host == "10.0.1.10"
    assert list(prefill.argv) == [
        "~/.pdctl/venv/bin/vllm", *SEED_MODEL, "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
        "--host", "10.0.1.10", "--port", "8100",
        "--kv-transfer-config", SEED_KV % "kv_producer",
    ]
    assert prefill.env["FI_PROVIDER"] == "efa"
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.1.10"
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert prefill.env["PDCTL_DEPLOYMENT"] == "p5en-1p1d"
    assert prefill.env["VLLM_SERVER_DEV_MODE"] == "1"  # the router's POST /reset_prefix_cache calls the engines'

    assert decode.name == "decode-0" and decode.host == "10.0.1.11"
    assert list(decode.argv) == [
        "~/.pdctl/venv/bin/vllm", *SEED_MODEL, "--enable-prompt-tokens-details", "--host", "10.0.1.11",
        "--port", "8200",
        "--kv-transfer-config", SEED_KV % "kv_consumer",
    ]
    assert decode.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.1.11"

    assert router.node == "router-node" and router.ports == (8000,)
    assert router.argv[:4] == ("~/.pdctl/venv/bin/python", "-m", "pdctl.router", "serve")
    assert "--prefill" in router.argv and "http://10.0.1.10:8100" in router.argv
    assert "http://10.0.1.11:8200" in router.argv
    assert [p.name for p in (decode, prefill, router)] == ["decode-0", "prefill-0", "router"]


def test_kv_transfer_config_is_valid_json_with_roles() -> None:
    specs = plan(load(ROOT / "configs/p5en-2p2d.yaml"), SELF_PYTHON)
    roles = {s.name: json.loads(s.argv[s.argv.index("--kv-transfer-config") + 1])["kv_role"]
             for s in specs if s.role != "router"}
    assert roles == {"decode-0": "kv_consumer", "decode-1": "kv_consumer",
                     "prefill-0": "kv_producer", "prefill-1": "kv_producer"}


def test_sim_engine_differs_only_in_argv() -> None:
    topo = load(ROOT / "configs/local-sim.yaml")
    _, prefill, router = plan(topo, SELF_PYTHON)
    assert prefill.argv[:4] == (SELF_PYTHON, "-m", "pdctl.sim", "serve")
    assert prefill.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "15600"
    assert json.loads(prefill.argv[prefill.argv.index("--kv-transfer-config") + 1])["kv_role"] == "kv_producer"
    assert prefill.health_url == "http://127.0.0.1:18100/health"
    assert router.argv[:3] == (SELF_PYTHON, "-m", "pdctl.router")


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_golden_plan(config: Path) -> None:
    """`PDCTL_UPDATE_GOLDEN=1 pytest tests/plan` rewrites the files; review the diff before committing."""
    got = [s.to_json() for s in plan(load(config), SELF_PYTHON)]
    golden = GOLDEN / f"{config.stem}.json"
    if os.environ.get("PDCTL_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(golden.read_text())


def test_plan_command_json_is_the_same_plan() -> None:
    result = CliRunner().invoke(app, ["plan", "--json", "-t", str(ROOT / "configs/p5en-1p1d.yaml")])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert [p["name"] for p in printed] == ["decode-0", "prefill-0", "router"]
    assert printed[1]["argv"][-1] == SEED_KV % "kv_producer"


def test_plan_command_prints_the_commands() -> None:
    result = CliRunner().invoke(app, ["plan", "-t", str(ROOT / "configs/p5en-1p1d.yaml")], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "FI_PROVIDER=efa" in result.output
    assert (" ~/.pdctl/venv/bin/vllm serve Qwen/Qwen3-32B --served-model-name Qwen --dtype bfloat16 "
            "--tensor-parallel-size 8 --max-model-len 32768 --max-num-seqs 8 --no-enable-prefix-caching "
            "--enable-prompt-tokens-details --host 10.0.1.10 --port 8100 --kv-transfer-config") in result.output
    assert 'VLLM_API_KEY="$(cat ~/.pdctl/p5en-1p1d/engine.key)"' in result.output


def _block_size_arg(argv: tuple[str, ...]) -> str | None:
    return argv[argv.index("--block-size") + 1] if "--block-size" in argv else None


def test_ucx_vllm_defaults_to_the_measured_block_size() -> None:
    decode, prefill, router = plan(load(ROOT / "configs/h200x2-local.yaml"), SELF_PYTHON)
    assert _block_size_arg(prefill.argv) == _block_size_arg(decode.argv) == "256"
    assert _block_size_arg(router.argv) == "256"  # the router verifies and truncates in the engines' blocks


def test_explicit_block_size_and_efa_keep_theirs() -> None:
    explicit = plan(load(ROOT / "configs/h200x2-local.yaml", ["model.block_size=16"]), SELF_PYTHON)
    assert [_block_size_arg(s.argv) for s in explicit] == ["16", "16", "16"]
    efa = plan(load(ROOT / "configs/p5en-1p1d.yaml"), SELF_PYTHON)
    assert [_block_size_arg(s.argv) for s in efa] == [None, None, "16"]


def test_local_prefill_reaches_the_router_and_needs_prefix_verification() -> None:
    from pdctl.errors import TopologyError
    from pdctl.router.config import RouterConfig

    _, _, router = plan(load(ROOT / "configs/local-sim.yaml"), SELF_PYTHON)
    assert "--local-prefill-tokens" not in router.argv  # on by default: the router's own default (pdctl.defaults)
    assert RouterConfig(prefill=("http://p",), decode=("http://d",)).local_prefill_tokens == 4096
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.local_prefill_tokens=0"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--local-prefill-tokens") + 1] == "0"  # off reaches the router too
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.verify_prefix=false"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--local-prefill-tokens") + 1] == "0"  # the default needs the ids
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.local_prefill_tokens=1024"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--local-prefill-tokens") + 1] == "1024"
    with pytest.raises(TopologyError, match="local_prefill_tokens needs verify_prefix"):
        load(ROOT / "configs/local-sim.yaml", ["router.local_prefill_tokens=1024", "router.verify_prefix=false"])
    assert "--local-policy" not in router.argv  # cost, the router's default
    sets = ["router.local_prefill_tokens=1024", "router.local_policy=load", "router.local_busy_streams=6"]
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", sets), SELF_PYTHON)
    i = router.argv.index("--local-policy")
    assert list(router.argv[i:i + 4]) == ["--local-policy", "load", "--local-busy-streams", "6"]


def test_itl_slo_ms_reaches_the_router_where_it_differs_from_its_default() -> None:
    from pdctl.errors import TopologyError
    from pdctl.router.config import RouterConfig

    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["sim.speed=1"]), SELF_PYTHON)
    assert "--itl-slo-ms" not in router.argv
    assert RouterConfig(prefill=("http://p",), decode=("http://d",)).itl_slo_ms == 200.0
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.itl_slo_ms=50", "sim.speed=1"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--itl-slo-ms") + 1] == "50"
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.itl_slo_ms=50",
                                                                "router.local_prefill_tokens=0"]), SELF_PYTHON)
    assert "--itl-slo-ms" not in router.argv  # nothing runs on a decode alone: no budget to keep
    with pytest.raises(TopologyError, match="itl_slo_ms"):
        load(ROOT / "configs/local-sim.yaml", ["router.itl_slo_ms=0"])


def test_local_stall_ratio_reaches_the_router_only_where_it_differs_from_its_default() -> None:
    from pdctl.errors import TopologyError

    _, _, router = plan(load(ROOT / "configs/local-sim.yaml"), SELF_PYTHON)
    assert "--local-stall-ratio" not in router.argv
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.local_stall_ratio=1.2"]), SELF_PYTHON)
    assert "--local-stall-ratio" not in router.argv
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.local_stall_ratio=0"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--local-stall-ratio") + 1] == "0"
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.local_stall_ratio=0",
                                                                "router.local_prefill_tokens=0"]), SELF_PYTHON)
    assert "--local-stall-ratio" not in router.argv  # nothing runs on a decode alone: no stall to bound
    with pytest.raises(TopologyError, match="local_stall_ratio"):
        load(ROOT / "configs/local-sim.yaml", ["router.local_stall_ratio=-0.5"])


def test_the_decodes_token_budget_reaches_the_router_where_every_decode_sets_one() -> None:
    # The router chunks a local turn's prompt by it (cost.Turn.steps); where a decode takes the engine's default
    # (8192 or 2048 by GPU) the router is told nothing and prices a whole prompt in one step.
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml"), SELF_PYTHON)
    assert "--decode-batch-tokens" not in router.argv
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["model.max_num_batched_tokens=1024"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--decode-batch-tokens") + 1] == "1024"
    # The decode alone, as configs/h200-1gpu-evict.yaml sets it.
    decode, prefill, router = plan(load(ROOT / "configs/local-sim.yaml", ["decode.0.model.max_num_batched_tokens=384"]),
                                   SELF_PYTHON)
    assert (decode.role, prefill.role) == ("decode", "prefill")
    assert router.argv[router.argv.index("--decode-batch-tokens") + 1] == "384"
    assert decode.argv[decode.argv.index("--max-num-batched-tokens") + 1] == "384"
    assert "--max-num-batched-tokens" not in prefill.argv
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["model.max_num_batched_tokens=1024",
                                                                "router.local_prefill_tokens=0"]), SELF_PYTHON)
    assert "--decode-batch-tokens" not in router.argv  # nothing runs on a decode alone: nothing to chunk


def test_the_itl_budget_is_given_to_the_router_on_its_own_clock() -> None:
    # itl_slo_ms is modelled time on simulated engines; the router times their steps in wall time, `speed` times
    # shorter: the ITL it checks a local prefill against is the SLO / speed, as the bench's ITL is wall x speed.
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["sim.speed=2"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--itl-slo-ms") + 1] == "100"
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["sim.speed=4", "router.itl_slo_ms=300"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--itl-slo-ms") + 1] == "75"
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["sim.speed=.inf"]), SELF_PYTHON)
    assert "--itl-slo-ms" not in router.argv  # no delays at all: nothing to scale


def test_conversation_headers_reach_the_router_in_order() -> None:
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml"), SELF_PYTHON)
    assert "--conversation-header" not in router.argv  # the router's own default list
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.conversation_headers=[X-Thread, X-Session-ID]"]),
                        SELF_PYTHON)
    given = [router.argv[i + 1] for i, a in enumerate(router.argv) if a == "--conversation-header"]
    assert given == ["X-Thread", "X-Session-ID"]


def _budget_arg(argv: tuple[str, ...]) -> str | None:
    return argv[argv.index("--max-num-batched-tokens") + 1] if "--max-num-batched-tokens" in argv else None


def test_the_token_budget_is_the_engines_unless_set_and_an_instance_may_set_its_own() -> None:
    assert [_budget_arg(s.argv) for s in plan(load(ROOT / "configs/h200x2-local.yaml"), SELF_PYTHON)] == \
        [None, None, None]
    shared = plan(load(ROOT / "configs/h200x2-local.yaml", ["model.max_num_batched_tokens=4096"]), SELF_PYTHON)
    assert [_budget_arg(s.argv) for s in shared] == ["4096", "4096", None]
    prefill_only = ["prefill[0].model.max_num_batched_tokens=2048"]
    for config in ("h200x2-local", "local-sim"):  # vLLM and the simulator take the same flag
        decode, prefill, _ = plan(load(ROOT / f"configs/{config}.yaml", prefill_only), SELF_PYTHON)
        assert (_budget_arg(decode.argv), _budget_arg(prefill.argv)) == (None, "2048")
    cfg = parse_args(list(prefill.argv[3:]), env=prefill.env)
    assert cfg.max_num_batched_tokens == 2048 and cfg.ignored_args == ()


def test_prefix_caching_is_on_by_default_and_an_instance_may_turn_it_off() -> None:
    for config in ("h200x2-local", "local-sim"):
        decode, prefill, _ = plan(load(ROOT / f"configs/{config}.yaml"), SELF_PYTHON)
        assert "--no-enable-prefix-caching" not in decode.argv + prefill.argv
        decode, prefill, _ = plan(load(ROOT / f"configs/{config}.yaml", ["prefill[0].prefix_caching=false"]),
                                  SELF_PYTHON)
        assert "--no-enable-prefix-caching" in prefill.argv and "--no-enable-prefix-caching" not in decode.argv
    off = plan(load(ROOT / "configs/local-sim.yaml", ["prefill[0].prefix_caching=false"]), SELF_PYTHON)[1]
    assert not parse_args(list(off.argv[3:]), env=off.env).prefix_caching


def test_the_pin_budget_and_the_release_reach_the_router() -> None:
    from pdctl.errors import TopologyError
    from pdctl.router.config import RouterConfig

    _, _, router = plan(load(ROOT / "configs/local-sim.yaml"), SELF_PYTHON)
    assert not {"--pin-budget-tokens", "--pin-budget-fraction", "--no-release"} & set(router.argv)  # the defaults
    defaults = RouterConfig(prefill=("http://p",), decode=("http://d",))
    assert (defaults.pin_budget_tokens, defaults.pin_budget_fraction, defaults.release) == (0, 0.5, True)
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.pin_budget_tokens=65536"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--pin-budget-tokens") + 1] == "65536"
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.pin_budget_fraction=0"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--pin-budget-fraction") + 1] == "0"
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.release=false"]), SELF_PYTHON)
    assert "--no-release" in router.argv and "--pin-budget-tokens" not in router.argv
    with pytest.raises(TopologyError, match="pin_budget_fraction"):
        load(ROOT / "configs/local-sim.yaml", ["router.pin_budget_fraction=1.5"])


def test_the_overflow_threshold_reaches_the_router_only_when_it_is_not_the_default() -> None:
    from pdctl.defaults import OVERFLOW_KV
    from pdctl.errors import TopologyError
    from pdctl.router.config import RouterConfig

    _, _, router = plan(load(ROOT / "configs/local-sim.yaml"), SELF_PYTHON)
    assert "--overflow-kv" not in router.argv
    assert RouterConfig(prefill=("http://p",), decode=("http://d",)).overflow_kv == OVERFLOW_KV
    other = 0.7 if OVERFLOW_KV != 0.7 else 0.6
    for value, flag in ((str(other), f"{other:g}"), ("0", "0"), ("null", "0")):
        if flag == f"{OVERFLOW_KV:g}":
            continue
        _, _, router = plan(load(ROOT / "configs/local-sim.yaml", [f"router.overflow_kv={value}"]), SELF_PYTHON)
        assert router.argv[router.argv.index("--overflow-kv") + 1] == flag
    with pytest.raises(TopologyError, match="overflow_kv"):
        load(ROOT / "configs/local-sim.yaml", ["router.overflow_kv=1.5"])


def test_min_read_tokens_reaches_the_router_where_it_differs_from_its_default() -> None:
    from pdctl.errors import TopologyError
    from pdctl.router.config import RouterConfig

    _, _, router = plan(load(ROOT / "configs/local-sim.yaml"), SELF_PYTHON)
    assert "--min-read-tokens" not in router.argv  # 256: the router's own default (pdctl.defaults)
    assert RouterConfig(prefill=("http://p",), decode=("http://d",)).min_read_tokens == 256
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.min_read_tokens=0"]), SELF_PYTHON)
    assert router.argv[router.argv.index("--min-read-tokens") + 1] == "0"
    with pytest.raises(TopologyError, match="min_read_tokens"):
        load(ROOT / "configs/local-sim.yaml", ["router.min_read_tokens=-1"])


def test_the_otlp_endpoint_reaches_the_router_only_when_set() -> None:
    from pdctl.errors import PdctlError
    from pdctl.router.server.options import config_parameters

    _, _, router = plan(load(ROOT / "configs/local-sim.yaml"), SELF_PYTHON)
    assert "--otlp-endpoint" not in router.argv
    _, _, router = plan(load(ROOT / "configs/local-sim.yaml", ["router.otlp_endpoint=http://collector:4318"]),
                        SELF_PYTHON)
    i = router.argv.index("--otlp-endpoint")
    assert router.argv[i + 1] == "http://collector:4318"
    assert "otlp_endpoint" in {p.name for p in config_parameters()}
    with pytest.raises(PdctlError):
        load(ROOT / "configs/local-sim.yaml", ["router.otlp_endpoint=collector:4318"])
