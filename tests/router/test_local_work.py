"""`--local-policy work`: a warm turn runs on its decode while the prompt tokens in flight there are no more than
the prefill's plus the hop's cost, and goes through the prefill while the decode is still computing another
conversation's long local turn."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

from tests.router.conftest import corrupt, router_process
from tests.router.talk import Conversation, Reply
from tests.support.sim_procs import sim_pair

LONG = " ".join(f"w{i}" for i in range(1000, 2000))  # 1000 tokens: more than the hop's cost of 512
START = " ".join(f"w{i}" for i in range(100, 200))  # a few blocks for the decode's prefix cache to hold


def test_work_runs_the_long_turn_locally_and_the_next_one_through_the_idle_prefill(tmp_path: Path) -> None:
    with (
        # Every decode request waits 1 s (wall) before its first token: the long local turn's prompt stays in
        # flight on the decode while the second conversation's turn is placed.
        sim_pair(tmp_path, speed=5, threshold=0, decode_args=["--extra-latency-ms", "5000"]) as pd,
        # The router bounds a text turn's new tokens by its bytes (pdctl.router.turn.history): 1000 words, ~6000 bytes.
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "8000",
                       "--local-policy", "work") as r,
    ):
        long = Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=2)
        short = Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=2)
        assert long.turn(f"{uuid.uuid4().hex} {START}").reason == "new_conversation"
        assert short.turn(f"{uuid.uuid4().hex} {START}").reason == "new_conversation"

        replies: list[Reply] = []
        computing = threading.Thread(target=lambda: replies.append(long.turn(f" {LONG}")))
        computing.start()
        deadline = time.monotonic() + 10
        while r.stats()["decode"][0]["work"] < 1000 and time.monotonic() < deadline:
            time.sleep(0.01)
        loaded = short.turn(" and day 2?")
        computing.join()
        assert (replies[0].outcome, replies[0].reason) == ("hit", "decode_local"), replies[0].reuse  # idle decode
        assert (loaded.outcome, loaded.reason) == ("hit", "verified"), loaded.reuse  # through the prefill
        assert loaded.status == 200 and loaded.text and replies[0].text
        stats = r.stats()
        assert stats["decode"][0]["work"] == 0 and stats["prefill"][0]["work"] == 0  # all counted off again
        assert corrupt(pd.prefill, pd.decode) == 0
