"""Agent-shaped sessions: a shared prefix, tool results and previous output per turn, open-loop arrivals."""

from __future__ import annotations

import pytest

from pdctl.bench.traffic import agent
from pdctl.bench.traffic.agent import AgentSpec, Range
from pdctl.bench.traffic.workload import Conversation
from pdctl.errors import UsageError


def test_sessions_share_the_system_prompt_and_differ_after_it() -> None:
    spec = AgentSpec(sessions=3, turns=4, system_tokens=100, task_tokens=10, tool_tokens=Range(5, 9))
    plans = agent.build_sessions(spec)
    firsts = [tuple(p.first) for p in plans]
    assert all(f[:100] == agent.shared_prefix(spec) for f in firsts)
    assert len({f[100:] for f in firsts}) == 3 and all(len(f) == 110 for f in firsts)
    assert all(len(p.users) == 3 and all(5 <= len(u) <= 9 for u in p.users) for p in plans)
    assert agent.build_sessions(spec) == plans  # deterministic from the seed


def test_each_turn_appends_the_previous_output_and_a_tool_result() -> None:
    spec = AgentSpec(sessions=1, turns=3, system_tokens=20, task_tokens=5, tool_tokens=Range(4, 4))
    conv = Conversation(agent.build_sessions(spec)[0], "completions", "c")
    first = conv.body("m", 2)["prompt"]
    conv.advance("", [7, 8])
    second = conv.body("m", 2)["prompt"]
    assert second[: len(first)] == first and second[len(first):len(first) + 2] == [7, 8]
    assert len(second) == len(first) + 2 + 4


def test_arrivals_are_open_loop_and_think_times_in_range() -> None:
    spec = AgentSpec(sessions=50, turns=3, arrival_rate=10.0, think_s=Range(0.5, 1.5))
    starts = agent.arrivals(spec)
    assert starts[0] == 0.0 and starts == sorted(starts) and 2.0 < starts[-1] < 10.0  # ~49 gaps of 0.1 s
    assert all(0.5 <= t <= 1.5 for i in range(50) for t in agent.think_times(spec, i))
    assert agent.arrivals(AgentSpec(sessions=4, arrival_rate=0)) == [0.0] * 4


def test_ranges_and_bad_specs() -> None:
    assert Range.parse("200-2000", "--tool-tokens") == Range(200, 2000)
    assert Range.parse("3", "--think-s") == Range(3, 3)
    with pytest.raises(UsageError) as e:
        Range.parse("9-2", "--tool-tokens")
    assert e.value.message == "--tool-tokens '9-2' must be >= 0 with low <= high"
    with pytest.raises(UsageError) as e:
        AgentSpec(api="chat")
    assert e.value.message == "agent sessions are token-id prompts (--api completions), not --api chat"
