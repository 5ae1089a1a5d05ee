"""scripts/capacity_bound.py's pure functions: the agent workload's turns, the work per GPU, the fixed point."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pdctl.sim import steps

SCRIPT = Path(__file__).parents[2] / "scripts" / "capacity_bound.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("capacity_bound", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["capacity_bound"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


cb = load()
C = steps.H200_GRAPHS


def test_the_agent_workload_turn_by_turn() -> None:
    w = cb.Workload()
    assert [w.prompt(k) for k in range(6)] == [6300, 7100, 7900, 8700, 9500, 10300]
    assert w.shared == 23 * 256 and w.think_s == pytest.approx(1.75 * 5 / 6)
    cold, warm = cb.turn(w, 0), cb.turn(w, 3)
    assert (cold.new, cold.context, cold.readback_tokens) == (412, 5888, 0)
    # a warm turn computes the tool result + the last output token the engine never put in KV
    assert (warm.new, warm.context) == (601, 7900 + 199)
    assert warm.chunk_ms == steps.chunk_ms(C, 601, 8099)
    # from its own prefix cache an engine recomputes the last turn's partial block: 8099 - 31 x 256 = 163 tokens
    assert (warm.local_new, warm.local_ms) == (601 + 163, steps.chunk_ms(C, 764, 7936))
    assert (cold.local_new, cold.context) == (412, 5888)
    assert warm.decode_ms == pytest.approx(sum(steps.alone_tpot_ms(C, 8700 + i) - C.base_ms for i in range(199)))
    assert warm.readback_tokens == 8099 - 5888 and warm.private_blocks == math.ceil(8899 / 256) - 23
    assert cb.turn(w, 5, 1000.0).prompt == 10300 + 400  # the last turn with a longer tool result


def test_utilization_tpot_and_the_fixed_point_of_one_aggregated_engine() -> None:
    w = cb.Workload()
    work = sum(cb.turn(w, k).local_ms + cb.turn(w, k).decode_ms for k in range(6)) / 6
    at = cb.aggregated(w, 10)
    state = at(20.0)  # 10 sessions each turning every 20 s: 0.5 turns/s
    (gpu,) = state.gpus
    assert gpu.rho == pytest.approx(0.5 * work / 1000)
    assert gpu.tpot_ms == pytest.approx(C.base_ms / (1 - gpu.rho))
    assert cb.tpot(0.5) == 2 * C.base_ms and cb.tpot(1.0) == math.inf
    assert cb.md1_wait(0.5, 100.0) == 50.0
    fixed = cb.solve(at)
    assert fixed.cycle_s == pytest.approx(at(fixed.cycle_s).cycle_s, rel=1e-6)
    unloaded = at(math.inf)
    assert unloaded.gpus[0].rho == 0 and unloaded.gpus[0].tpot_ms == C.base_ms
    assert unloaded.ttft_ms == pytest.approx(C.request_ms + 1.5 * C.base_ms
                                             + sum(cb.turn(w, k).local_ms for k in range(1, 6)) / 5)
    assert cb.demand(at).gpus[0].rho > fixed.gpus[0].rho  # the closed loop stretches the cycle instead


def test_two_engines_split_the_sessions_and_pd_moves_prefill_work_to_its_prefill() -> None:
    w = cb.Workload()
    one, two = cb.solve(cb.aggregated(w, 16)), cb.solve(cb.two_aggregated(w, 32))
    assert [g.rho for g in two.gpus] == pytest.approx([one.gpus[0].rho] * 2)
    pd = cb.disaggregated(w, 32)(10.0)
    p, d = pd.gpus
    turns = [cb.turn(w, k) for k in range(6)]
    assert p.rho == pytest.approx(3.2 * sum(C.base_ms + t.chunk_ms for t in turns) / 6 / 1000)
    assert d.rho == pytest.approx(3.2 * sum(t.decode_ms + t.first_ms for t in turns) / 6 / 1000)
    assert d.pin_blocks == 32 * turns[-1].private_blocks and p.pin_blocks == 0
    best = cb.best_split(w, 32)
    assert best.split is not None and 0 < best.split < 1
    assert abs(best.gpus[0].rho - best.gpus[1].rho) < 0.02  # the split balances the two GPUs


def test_largest_and_the_report() -> None:
    w = cb.Workload()
    n = cb.largest(w, "agg", lambda s, d: max(g.rho for g in d.gpus) < 1)
    assert max(g.rho for g in cb.evaluate(w, "agg", n)[1].gpus) < 1 <= cb.evaluate(w, "agg", n + 1)[1].gpus[0].rho
    lines = cb.report(w, [8], 500.0)
    assert lines[-6].startswith("| arrangement | demand rho < 1 |") and lines[-4].startswith(f"| agg | {n} | ")
