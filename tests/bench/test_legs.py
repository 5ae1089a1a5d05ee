"""A leg's endpoints come from the plan `up` started for it: the bench plans each leg's topology once."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pdctl import plan as planning
from pdctl.bench.leg import legs
from pdctl.bench.leg.legs import endpoints
from pdctl.cli import app
from pdctl.plan import ProcessSpec, plan
from pdctl.topology import Topology, load


def test_endpoints_are_those_of_the_specs_given(sim_topology: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    topo = load(sim_topology)
    specs = [dataclasses.replace(s, url=f"http://10.9.9.9:{i}") for i, s in enumerate(plan(topo))]
    monkeypatch.setattr(legs, "plan", lambda topo: pytest.fail("planned again"))
    ep = endpoints(topo, specs)
    by_role = {s.role: s for s in specs}
    assert (ep.router_url, ep.prefill_urls, ep.decode_urls) == (
        by_role["router"].url, (by_role["prefill"].url,), (by_role["decode"].url,))


@pytest.mark.slow
def test_each_leg_is_planned_once(sim_topology: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planned: list[Topology] = []  # held, so that no two topologies share an id

    def counted(topo: Topology) -> list[ProcessSpec]:
        planned.append(topo)
        return planning.plan(topo)

    monkeypatch.setattr(legs, "plan", counted)
    monkeypatch.setattr(importlib.import_module("pdctl.lifecycle.bringup.pipeline"), "plan", counted)
    args = ["bench", "-t", str(sim_topology), "--lengths", "128", "--conversations", "1", "--turns", "2",
            "--user-tokens", "16", "--output-tokens", "4", "--clients", "1", "--no-warmup",
            "--out", str(sim_topology.parent / "out")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    _base, *leg_topologies = planned  # the base first: whether it runs before the bench
    flags = [t.connector.bidirectional_kv_xfer for t in leg_topologies]
    # leg off, leg on: once each, but for the bench's one retry of a leg whose deploy failed (it says so); a
    # loaded CI machine hit one
    retries = (result.output + (result.stderr if result.stderr_bytes is not None else "")).count("retrying once")
    assert len(flags) == 2 + retries and [k for k, _ in itertools.groupby(flags)] == [False, True], (flags, retries)
