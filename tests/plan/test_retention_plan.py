"""The retention knobs travel from the topology to the router's command line, and bad values are refused there."""

from __future__ import annotations

import pytest

from pdctl.defaults import RETAIN_HIGH_KV, RETAIN_TARGET_KV
from pdctl.errors import TopologyError, UsageError
from pdctl.plan import plan, run_dir
from pdctl.router.config import RouterConfig
from pdctl.topology import load
from tests.plan.test_plan import ROOT, SELF_PYTHON


def test_the_retention_marks_reach_the_router_only_when_they_are_not_the_default() -> None:
    topo = load(ROOT / "configs/local-sim.yaml")
    router = plan(topo, SELF_PYTHON)[-1]
    assert "--retain-high-kv" not in router.argv
    config = RouterConfig(prefill=("http://p",), decode=("http://d",))
    assert (config.retain_high_kv, config.retain_target_kv) == (RETAIN_HIGH_KV, RETAIN_TARGET_KV)
    assert router.argv[router.argv.index("--state-dir") + 1] == run_dir(topo, topo.router.node)
    set_ = ["router.retain_high_kv=0.95", "router.retain_target_kv=0.7"]
    router = plan(load(ROOT / "configs/local-sim.yaml", set_), SELF_PYTHON)[-1]
    at = router.argv.index("--retain-high-kv")
    assert router.argv[at : at + 4] == ("--retain-high-kv", "0.95", "--retain-target-kv", "0.7")


@pytest.mark.parametrize("sets, match", [
    (["router.retain_high_kv=1.5"], "retain_high_kv"),
    (["router.retain_target_kv=0"], "retain_target_kv"),
    (["router.retain_high_kv=0.5", "router.retain_target_kv=0.6"], "must be below retain_high_kv"),
])
def test_bad_retention_marks_are_refused_by_the_topology(sets: list[str], match: str) -> None:
    with pytest.raises(TopologyError, match=match):
        load(ROOT / "configs/local-sim.yaml", sets)


def test_bad_retention_marks_are_refused_by_the_router() -> None:
    with pytest.raises(UsageError, match="--retain-target-kv must be above 0 and below --retain-high-kv"):
        RouterConfig(prefill=("http://p",), decode=("http://d",), retain_high_kv=0.5, retain_target_kv=0.5)
    with pytest.raises(UsageError, match="--shutdown-release-timeout"):
        RouterConfig(prefill=("http://p",), decode=("http://d",), shutdown_release_timeout=-1)
    assert RouterConfig(prefill=("http://p",), decode=("http://d",), retain_high_kv=0).retain_high_kv == 0
