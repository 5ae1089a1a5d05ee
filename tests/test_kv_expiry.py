"""The handle-lifetime rule is one: the topology check refuses exactly what the router refuses, and the router's
margin can never be below the engine's own refusal margin."""

from __future__ import annotations

import itertools

import pytest

from pdctl.errors import TopologyError, UsageError
from pdctl.kv_expiry import ENGINE_EXPIRY_MARGIN_S, ROUTER_EXPIRY_MARGIN_S
from pdctl.plan import plan
from pdctl.router.config import RouterConfig
from pdctl.sim.kv import EXPIRY_MARGIN_S as SIM_ENGINE_MARGIN
from pdctl.topology import parse

TOPO = """\
name: demo
engine: sim
nodes:
  - {name: a, transport: local}
model:
  id: m/m
prefill:
  - {node: a, port: 8100, side_channel_port: 5600}
decode:
  - {node: a, port: 8200, side_channel_port: 5601}
connector:
  decoder_kv_blocks_ttl: TTL
router:
  node: a
  handle_ttl: HANDLE
python:
  venv: null
"""


def router_accepts(argv: tuple[str, ...]) -> bool:
    opts = dict(itertools.pairwise(argv))
    try:
        RouterConfig(prefill=("http://p",), decode=("http://d",), handle_ttl=float(opts["--handle-ttl"]),
                     decoder_kv_blocks_ttl=float(opts["--decoder-kv-blocks-ttl"]))
    except UsageError:
        return False
    return True


@pytest.mark.parametrize(("ttl", "handle"), [(5, 3), (10, 9), (11, 10.5), (12, 3), (30, 20), (480, 450)])
def test_topology_check_and_router_agree(ttl: int, handle: float) -> None:
    text = TOPO.replace("TTL", str(ttl)).replace("HANDLE", str(handle))
    try:
        topo = parse(text, "topo.yaml")
    except TopologyError:
        valid = False
        # what the router would get had the check let it through
        argv = ("--handle-ttl", str(handle), "--decoder-kv-blocks-ttl", str(ttl))
    else:
        valid = True
        argv = next(s for s in plan(topo) if s.role == "router").argv
    assert valid == router_accepts(argv)
    assert valid == (ttl > ROUTER_EXPIRY_MARGIN_S)


def test_short_ttl_is_refused_with_the_numbers() -> None:
    with pytest.raises(TopologyError) as refused:
        parse(TOPO.replace("TTL", "5").replace("HANDLE", "3"), "topo.yaml")
    assert refused.value.problems[0].render() == (
        "topo.yaml:12: connector.decoder_kv_blocks_ttl: decoder_kv_blocks_ttl 5s leaves no usable handle: the "
        "router stops using a handle 10s before the decode frees its blocks (the engine declines reads within 5s, "
        "plus 5s for the request in flight) (set decoder_kv_blocks_ttl well above 10s (default 480) and handle_ttl "
        "below it)"
    )


def test_router_margin_below_the_engines_is_refused() -> None:
    with pytest.raises(UsageError) as refused:
        RouterConfig(prefill=("http://p",), decode=("http://d",), decoder_kv_blocks_ttl=5, expiry_margin=1)
    assert refused.value.message == (
        "invalid router options: --expiry-margin (1s) must be at least the engine's own 5s (vLLM's prefill "
        "declines reads of a handle that close to expiry)"
    )


def test_margins_derive_from_the_engines() -> None:
    assert ENGINE_EXPIRY_MARGIN_S == SIM_ENGINE_MARGIN  # the simulator plays vLLM's pull_scheduler
    assert RouterConfig(prefill=("http://p",), decode=("http://d",)).expiry_margin == ROUTER_EXPIRY_MARGIN_S
    assert ROUTER_EXPIRY_MARGIN_S > ENGINE_EXPIRY_MARGIN_S
