"""Agent-shaped sessions: what a coding agent sends, played open loop.

Every session starts with the same system prompt and tool schema (one shared prefix for all sessions) followed by
its own task; each later turn appends the model's previous output and a tool result of `tool_tokens` (drawn
from a range); between turns the agent thinks or runs the tool for a random time; sessions arrive over time as a
Poisson process (open loop) instead of a fixed set of clients. The anchor-shaped sweep (pdctl.bench.traffic.workload)
stays the other profile. Turn k+1's prompt is exactly turn k's prompt, the reply and the tool result, so the
conversation machinery (and KV reuse) is the same as the sweep's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from pdctl.bench.results.records import RequestRecord
from pdctl.bench.traffic.client import ClientOptions, player
from pdctl.bench.traffic.workload import TEXT_APIS, Api, Conversation, ConversationPlan, Segment
from pdctl.errors import UsageError

TOKEN_ID_LOW = 1000
AGENT_LENGTH = 0  # the `length` agent sessions report in records: they have no sweep length


@dataclass(frozen=True)
class Range:
    """A uniform draw from [low, high]; low == high is a fixed value."""

    low: float
    high: float

    @classmethod
    def parse(cls, text: str, name: str) -> Range:
        parts = text.split("-", 1)
        try:
            low, high = float(parts[0]), float(parts[-1])
        except ValueError:
            raise UsageError(f"{name} {text!r} is not a number or a range", hint=f"e.g. {name} 500 or 200-2000") \
                from None
        if low < 0 or high < low:
            raise UsageError(f"{name} {text!r} must be >= 0 with low <= high", hint=f"e.g. {name} 200-2000")
        return cls(low, high)

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def draw(self, rng: random.Random) -> float:
        return self.low if self.low == self.high else rng.uniform(self.low, self.high)


@dataclass(frozen=True)
class AgentSpec:
    sessions: int = 8
    turns: int = 6
    system_tokens: int = 6000  # system prompt + tool schema, the same for every session
    task_tokens: int = 300
    tool_tokens: Range = Range(200, 2000)
    output_tokens: int = 200
    think_s: Range = Range(0.5, 3.0)  # agent thinking / tool running between a reply and the next turn
    arrival_rate: float = 1.0  # sessions per second (Poisson); 0 = all at once
    api: Api = "completions"
    seed: int = 0
    token_id_high: int = 30000

    def __post_init__(self) -> None:
        for name in ("sessions", "turns", "system_tokens", "task_tokens", "output_tokens"):
            if getattr(self, name) < 1:
                raise UsageError(f"agent {name} must be at least 1, got {getattr(self, name)}")
        if self.arrival_rate < 0:
            raise UsageError(f"agent arrival rate must be >= 0, got {self.arrival_rate:g}")
        if self.api in TEXT_APIS:
            raise UsageError(f"agent sessions are token-id prompts (--api completions), not --api {self.api}")


def shared_prefix(spec: AgentSpec) -> tuple[int, ...]:
    """The system prompt and tool schema every session starts with (from the seed alone)."""
    rng = random.Random(f"agent-prefix-{spec.seed}")
    return tuple(rng.randrange(TOKEN_ID_LOW, spec.token_id_high) for _ in range(spec.system_tokens))


def build_sessions(spec: AgentSpec) -> list[ConversationPlan]:
    """Every session: shared prefix + its own task, then one tool result per later turn."""
    prefix = shared_prefix(spec)
    plans = []
    for i in range(spec.sessions):
        rng = random.Random(f"agent-{spec.seed}-{i}")

        def ids(n: int, rng: random.Random = rng) -> tuple[int, ...]:
            return tuple(rng.randrange(TOKEN_ID_LOW, spec.token_id_high) for _ in range(max(1, n)))

        first: Segment = prefix + ids(spec.task_tokens)
        tools: tuple[Segment, ...] = tuple(ids(round(spec.tool_tokens.draw(rng))) for _ in range(spec.turns - 1))
        plans.append(ConversationPlan(f"n{spec.sessions}-s{i}", AGENT_LENGTH, i, first, tools))
    return plans


def arrivals(spec: AgentSpec) -> list[float]:
    """Each session's start offset in seconds: a Poisson process at `arrival_rate` (all at 0 when it is 0)."""
    rng = random.Random(f"agent-arrivals-{spec.seed}")
    t, out = 0.0, []
    for _ in range(spec.sessions):
        out.append(t)
        if spec.arrival_rate > 0:
            t += rng.expovariate(spec.arrival_rate)
    return out


def think_times(spec: AgentSpec, index: int) -> list[float]:
    rng = random.Random(f"agent-think-{spec.seed}-{index}")
    return [spec.think_s.draw(rng) for _ in range(spec.turns - 1)]


async def play_sessions(
    spec: AgentSpec, opts: ClientOptions, leg: str, time_scale: float = 1.0,
    on_record: Callable[[RequestRecord], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[RequestRecord]:
    """Play every session open loop: each starts at its arrival, thinks between turns; `time_scale` divides the
    arrival and think times (a simulator at --speed 10 wants 10). One record per request, turn 0 cold."""
    plans = build_sessions(spec)
    starts = arrivals(spec)
    opts = ClientOptions(**{**opts.__dict__, "api": spec.api, "output_tokens": spec.output_tokens})
    t0 = time.monotonic()
    async with player(opts, leg, spec.sessions, on_record, transport) as p:

        async def session(plan: ConversationPlan, start: float) -> None:
            await asyncio.sleep(max(0.0, t0 + start / time_scale - time.monotonic()))
            conv = Conversation(plan, spec.api, f"{leg}-{plan.key}")
            thinks = think_times(spec, plan.index)
            while not conv.done:
                if not await p.turn(conv, plan.index):
                    return
                if not conv.done:
                    await asyncio.sleep(thinks[conv.turn - 1] / time_scale)

        await asyncio.gather(*(session(plan, s) for plan, s in zip(plans, starts, strict=True)))
    return p.records
