"""`--local-policy load`: a warm short turn runs on its decode while that decode is not busy, and goes through the
(idle) prefill while the decode has --local-busy-streams requests in flight."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

from tests.router.conftest import corrupt, router_process
from tests.router.talk import Conversation
from tests.support.sim_procs import sim_pair

LONG = " ".join(f"w{i}" for i in range(120))


def test_a_busy_decode_sends_the_warm_turn_to_the_prefill(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=5, threshold=0) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "64",
                       "--local-policy", "load", "--local-busy-streams", "1") as r,
    ):
        conv = Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=2)
        assert conv.turn(f"{uuid.uuid4().hex} {LONG}").reason == "new_conversation"
        idle = conv.turn("and day 2?")
        assert (idle.outcome, idle.reason) == ("hit", "decode_local"), idle.reuse  # nothing else on the decode

        other = Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=150)  # ~1 s of decoding
        streaming = threading.Thread(target=other.turn, args=(f"{uuid.uuid4().hex} other",))
        streaming.start()
        deadline = time.monotonic() + 10
        while r.stats()["decode"][0]["outstanding"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        busy = conv.turn("and day 3?")
        streaming.join()
        assert (busy.outcome, busy.reason) == ("hit", "verified"), busy.reuse  # through the prefill
        assert busy.status == 200 and busy.text
        assert corrupt(pd.prefill, pd.decode) == 0
