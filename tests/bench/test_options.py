"""`bench_options`: the command line's values checked and turned into `BenchOptions`, before anything runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pdctl.bench.leg.legs import DEFAULT_LEGS, LegSpec, leg_topology
from pdctl.bench.runner.options import PROFILES, BenchArgs, bench_options, estimate_line
from pdctl.bench.traffic.workload import WorkloadSpec
from pdctl.errors import UsageError
from pdctl.plan import plan
from pdctl.remote.sshconnect import SshOptions

TOPO = Path(__file__).parents[2] / "configs" / "local-sim.yaml"


def test_the_profile_fills_what_is_not_given_and_ssh_passes_through(tmp_path: Path) -> None:
    ssh = SshOptions(ssh_config=tmp_path / "config", known_hosts=tmp_path / "known")
    opts = bench_options(BenchArgs(TOPO, overrides=["sim.speed=50"], turns=3, clients=1), ssh=ssh)
    quick = PROFILES["quick"]
    assert opts.workload == WorkloadSpec(lengths=quick.lengths, conversations=quick.conversations, turns=3,
                                         user_tokens=quick.user_tokens, output_tokens=quick.output_tokens)
    assert (opts.clients, opts.legs, opts.base_overrides, opts.ssh) == (1, list(DEFAULT_LEGS), ["sim.speed=50"], ssh)
    assert (opts.no_redeploy, opts.warmup, opts.client, opts.capacity) == (False, True, "auto", None)


def test_a_sweep_is_a_capacity_run_on_token_ids() -> None:
    opts = bench_options(BenchArgs(TOPO, api="chat", sweep="sessions=1,2", turns=4))
    assert opts.capacity is not None and opts.capacity.sessions == (1, 2)
    assert opts.capacity.agent.turns == 4 and opts.workload.api == "completions"
    assert estimate_line(opts) == (
        "capacity run: 2 leg(s) x 2 session counts, 4 turns per session; no time estimate (it depends on where "
        "the SLO breaks)"
    )


def test_no_redeploy_benches_the_running_deployment_as_one_leg() -> None:
    assert bench_options(BenchArgs(TOPO, no_redeploy=True)).legs == []
    assert bench_options(BenchArgs(TOPO, no_redeploy=True, legs=["now"])).legs == [LegSpec("now", ())]


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (BenchArgs(TOPO, api="grpc"), "--api 'grpc' is not chat, completions, responses or messages",
         "pass --api chat, --api completions, --api responses or --api messages"),
        (BenchArgs(TOPO, client="there"), "--client 'there' is not auto, local or router-node",
         "pass --client local"),
        (BenchArgs(TOPO, clients=0), "--clients must be >= 1 and --rate >= 0", ""),
        (BenchArgs(TOPO, lengths=""), "--lengths is empty", "e.g. --lengths 2000,8000,16000"),
    ],
)
def test_bad_values_are_usage_errors(args: BenchArgs, message: str, hint: str) -> None:
    with pytest.raises(UsageError) as info:
        bench_options(args)
    assert (info.value.message, info.value.hint, info.value.exit_code) == (message, hint, 2)


def test_the_eviction_profile_brings_its_legs_slo_and_agent_shape() -> None:
    opts = bench_options(BenchArgs(TOPO, profile="evict"))
    cap = opts.capacity
    assert cap is not None and cap.evict and cap.sessions == () and cap.runs == 2
    assert (cap.slo.ttft_p90, cap.slo.itl_p99) == (500.0, 200.0)
    assert (cap.agent.think_s.low, cap.agent.think_s.high, cap.agent.arrival_rate) == (2.0, 8.0, 2.0)
    assert [leg.name for leg in opts.legs] == ["off", "on-prefill", "on", "agg"]
    assert "prefill[*].prefix_caching=true" in opts.legs[0].overrides  # OFF with the prefill's cache on
    given = bench_options(BenchArgs(TOPO, profile="evict", think_s="1", legs=["x:router.port=18001"], runs=1))
    assert given.capacity is not None and given.capacity.agent.think_s.high == 1.0 and given.capacity.runs == 1
    assert [leg.name for leg in given.legs] == ["x"]
    with pytest.raises(UsageError) as e:
        bench_options(BenchArgs(TOPO, profile="evict", runs=0))
    assert e.value.message == "--runs must be >= 1, got 0"


def test_a_capacity_runs_itl_slo_is_the_routers_budget_on_the_routers_clock() -> None:
    # local-sim.yaml runs its simulators at speed 10: the SLO's 150 modelled ms are 15 ms of the router's wall clock.
    opts = bench_options(BenchArgs(TOPO, profile="evict", slo="ttft_p90=500,itl_p99=150", overrides=["sim.speed=5"]))
    assert opts.base_overrides == ["router.itl_slo_ms=150", "sim.speed=5"]
    on = next(leg for leg in opts.legs if leg.name == "on")
    _, _, router = plan(leg_topology(TOPO, opts.base_overrides, on), sys.executable)
    assert router.argv[router.argv.index("--itl-slo-ms") + 1] == "30"
    # The command's own --set wins; an SLO without an ITL bound leaves the router's budget alone.
    given = bench_options(BenchArgs(TOPO, profile="evict", overrides=["router.itl_slo_ms=80"]))
    assert leg_topology(TOPO, given.base_overrides, on).router.itl_slo_ms == 80
    ttft_only = bench_options(BenchArgs(TOPO, sweep="sessions=1", slo="ttft_p90=500"))
    assert ttft_only.base_overrides == []
