"""The cost model end to end (router process, simulated engines on loopback): the rule before it until its rates
are measured, then the decode alone on an idle decode, the prefill when the decode's step would break the ITL
budget or outgrow its streams' step by the local turn's stall, recompute where the read link is slower than
compute, the rule before it again for a restarted decode; every choice in /stats and /metrics; the simulator's
integrity oracle at 0 throughout."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from pdctl.router.documents import RouterStats
from pdctl.router.wire import KvChoice
from tests.router.conftest import RouterProc, corrupt, router_process
from tests.router.faults import kill
from tests.router.talk import Conversation
from tests.support.sim_procs import sim_pair, start_sim

TEXT = " ".join(f"w{i}" for i in range(120))  # a first turn of ~120 tokens
MORE = " ".join(f"m{i}" for i in range(60))  # a warm turn's new text: over the rates' 32-token minimum


def _choice(r: RouterProc) -> dict[str, Any]:
    doc = r.stats()
    RouterStats.from_json(doc)  # the document its readers parse
    out: dict[str, Any] = doc["kv_choice"]
    return out


def _until(pred: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _metric(r: RouterProc, line_start: str) -> float:
    text = httpx.get(f"{r.url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


def _measured(r: RouterProc) -> list[Conversation]:
    """Two conversations, their cold turns and then local turns on the idle decode until every rate the model
    needs counts (its first own choice)."""
    convs = [Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=6) for _ in range(2)]
    for c in convs:
        assert c.turn(f"{uuid.uuid4().hex} {TEXT}").reason == "new_conversation"
    for i in range(10):
        if _choice(r)["basis"]["model"]:
            break
        assert convs[i % 2].turn(f"{MORE} c{i}").status == 200
    assert _choice(r)["basis"]["model"], f"the model never chose: its rates were not measured: {_choice(r)}"
    return convs


def test_the_model_runs_idle_turns_alone_and_refuses_a_busy_decode_past_the_itl_budget(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=5, threshold=0) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "4096",
                       "--local-policy", "cost", "--itl-slo-ms", "0.01") as r,
    ):
        convs = [Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=6) for _ in range(2)]
        for c in convs:  # cold turns: the prefill's rate, the P->D pull's, the decode's step
            assert c.turn(f"{uuid.uuid4().hex} {TEXT}").reason == "new_conversation"
        # The client reads a stream's end a moment before the router counts it done: until then the decode is busy.
        _until(lambda: r.stats()["decode"][0]["outstanding"] == 0, "the cold turns never finished on the decode")
        first = convs[0].turn(f"{MORE} a")
        # Nothing measured yet for the decode alone: the rule before the model (load: the decode is idle).
        assert (first.outcome, first.reason) == ("hit", "decode_local"), first.reuse
        assert KvChoice.parse(first.headers.get("x-pd-kv-choice")) == KvChoice("decode_cache", "default")
        _until(lambda: _choice(r)["basis"]["default"] == 1, "the turn's choice never reached /stats")
        assert _choice(r)["basis"] == {"model": 0, "default": 1, "probe": 0}
        convs[1].turn(f"{MORE} b")  # the decode's second local sample

        for i in range(8):  # a few more turns until every rate it needs counts (each takes two samples)
            if _choice(r)["basis"]["model"]:
                break
            assert convs[i % 2].turn(f"{MORE} c{i}").status == 200
        assert _choice(r)["basis"]["model"], "the model never chose: its rates were not measured"
        stats = _choice(r)
        rates = stats["rates"]["engines"]
        assert rates[pd.decode_url]["tokens_per_s"] and rates[pd.prefill_url]["tokens_per_s"], rates
        assert rates[pd.decode_url]["step_ms"], rates
        assert any(link["direction"] == "p_to_d" for link in stats["rates"]["links"]), stats["rates"]

        _until(lambda: r.stats()["decode"][0]["outstanding"] == 0, "the earlier turns never finished on the decode")
        idle = convs[0].turn(f"{MORE} d")  # an idle decode: nothing else to stall, the local turn is cheapest
        assert (idle.outcome, idle.reason) == ("hit", "decode_local"), idle.reuse
        said = KvChoice.parse(idle.headers.get("x-pd-kv-choice"))
        assert said is not None and (said.source, said.basis, said.refused) == ("decode_cache", "model", None)
        assert said.predicted_ms is not None and said.predicted_ms > 0

        other = Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=150)  # ~1 s of decoding
        streaming = threading.Thread(target=other.turn, args=(f"{uuid.uuid4().hex} other",))
        streaming.start()
        _until(lambda: r.stats()["decode"][0]["outstanding"] >= 1, "the other stream never started")
        busy = convs[0].turn(f"{MORE} e")  # any stall breaks a 0.01 ms budget: through the prefill
        streaming.join()
        assert (busy.outcome, busy.reason) == ("hit", "verified"), busy.reuse
        said = KvChoice.parse(busy.headers.get("x-pd-kv-choice"))
        assert said is not None and (said.source, said.basis, said.refused) == ("decode_read", "model", "itl")
        assert busy.status == 200 and busy.text

        # A turn's choice is counted once its response is out: the client may read its end a moment before.
        _until(lambda: _choice(r)["local_refused"]["itl"] >= 1, f"no refusal counted: {_choice(r)}")
        stats = _choice(r)
        assert stats["mix"]["decode_cache"] >= 3 and stats["mix"]["decode_read"] >= 1, stats
        assert stats["measured_turns"] >= 1 and stats["error_window"] >= 1, stats
        assert _metric(r, 'pdctl_router_kv_choice_total{basis="model",source="decode_cache"}') >= 1
        assert _metric(r, 'pdctl_router_kv_choice_local_refused_total{why="itl"}') >= 1
        assert _metric(r, 'pdctl_router_kv_choice_ttft_seconds_count{kind="measured"') >= 1
        assert _metric(r, 'pdctl_router_rate{') > 0
        assert corrupt(pd.prefill, pd.decode) == 0


def test_a_busy_decode_refuses_a_local_turn_whose_stall_outgrows_its_streams_step(tmp_path: Path) -> None:
    # An ITL budget nothing breaks: what sends the busy decode's turn through the prefill is its stall alone, a
    # prefill of ~600 tokens in a batch whose step (the other stream's gap) is a few dozen ms.
    with (
        sim_pair(tmp_path, speed=5, threshold=0) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "4096",
                       "--local-policy", "cost", "--itl-slo-ms", "100000") as r,
    ):
        convs = _measured(r)
        idle = convs[0].turn(" ".join(f"t{i}" for i in range(600)))  # idle: nobody to stall, however long
        said = KvChoice.parse(idle.headers.get("x-pd-kv-choice"))
        assert said is not None and (said.source, said.refused) == ("decode_cache", None), said

        other = Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=150)  # ~1 s of decoding
        streaming = threading.Thread(target=other.turn, args=(f"{uuid.uuid4().hex} other",))
        streaming.start()
        _until(lambda: r.stats()["decode"][0]["outstanding"] >= 1, "the other stream never started")
        busy = convs[1].turn(" ".join(f"u{i}" for i in range(600)))
        streaming.join()
        said = KvChoice.parse(busy.headers.get("x-pd-kv-choice"))
        assert said is not None and (said.source, said.basis, said.refused) == ("decode_read", "model", "stall")
        assert (busy.outcome, busy.reason) == ("hit", "verified"), busy.reuse
        assert busy.status == 200 and busy.text
        _until(lambda: _choice(r)["local_refused"]["stall"] >= 1, f"no refusal counted: {_choice(r)}")
        assert _choice(r)["local_refused"]["itl"] == 0
        assert _metric(r, 'pdctl_router_kv_choice_local_refused_total{why="stall"}') == 1
        assert corrupt(pd.prefill, pd.decode) == 0


def test_a_decode_that_chunks_its_prompts_runs_a_long_turn_beside_a_stream_in_bounded_steps(tmp_path: Path) -> None:
    # A 1200-token turn beside another stream, on a decode whose steps compute at most 64 tokens, the prefill 5 s
    # late a request, --local-stall-ratio 2. A router told the decode's budget prices each step's chunk (a few ms on
    # a step of several) within the bound: the decode alone, chosen by the model. A router not told prices the
    # whole prompt in one step (20-odd ms more): refused for its stall. Same engines, same turn.
    with (
        sim_pair(tmp_path, speed=5, threshold=0, decode_args=["--max-num-batched-tokens", "64"],
                 prefill_args=["--extra-latency-ms", "5000"]) as pd,
    ):
        for told, expected in ((["--decode-batch-tokens", "64"], ("decode_cache", "model", None)),
                               ([], ("decode_read", "model", "stall"))):
            with router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "4096",
                                "--local-policy", "cost", "--itl-slo-ms", "100000", "--local-stall-ratio", "2",
                                *told) as r:
                convs = _measured(r)
                decode = _choice(r)["rates"]["engines"][pd.decode_url]
                assert decode["step_ms"] and decode["gap_ms"], decode  # its streams' step and largest gap

                other = Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=300)
                streaming = threading.Thread(target=other.turn, args=(f"{uuid.uuid4().hex} other",))
                streaming.start()
                _until(lambda r=r: r.stats()["decode"][0]["outstanding"] >= 1, "the other stream never started")
                busy = convs[1].turn(" ".join(f"u{i}" for i in range(1200)))
                streaming.join()
                said = KvChoice.parse(busy.headers.get("x-pd-kv-choice"))
                assert said is not None and (said.source, said.basis, said.refused) == expected, (said, _choice(r))
                assert busy.status == 200 and busy.text and busy.outcome == "hit", busy.reuse
        assert corrupt(pd.prefill, pd.decode) == 0


def test_a_read_slower_than_recompute_is_recomputed(tmp_path: Path) -> None:
    # Every D->P read on this prefill waits 300 ms: slower than computing a short history.
    with (
        sim_pair(tmp_path, threshold=0, prefill_args=["--kv-pull-delay-ms", "300"]) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--min-read-tokens", "16") as r,
    ):
        convs = [Conversation(r.url, True, True, "body", uuid.uuid4().hex, max_tokens=4) for _ in range(3)]
        for c in convs:  # cold: the prefill's compute rate
            assert c.turn(f"{uuid.uuid4().hex} {TEXT}").reason == "new_conversation"
        for c in convs[:2]:  # nothing measured of the link: they read (the rule before the model)
            warm = c.turn(f"{MORE} a")
            assert (warm.outcome, warm.reason) == ("hit", "verified"), warm.reuse
            assert "read=" in warm.reuse and ";read=0;" not in warm.reuse, warm.reuse
        stats = _choice(r)
        assert any(link["direction"] == "d_to_p" for link in stats["rates"]["links"]), stats["rates"]

        later = convs[2].turn(f"{MORE} b")  # the link measured slower than compute: the prefill recomputes
        assert (later.outcome, later.reason) == ("miss", "read_not_worth"), later.reuse
        said = KvChoice.parse(later.headers.get("x-pd-kv-choice"))
        assert said is not None and (said.source, said.basis) == ("recomputed", "model"), said
        assert later.status == 200 and later.text
        _until(lambda: _choice(r)["mix"]["recomputed"] >= 1, f"no recompute counted: {_choice(r)}")
        assert _choice(r)["basis"]["model"] >= 1
        again = convs[2].turn(f"{MORE} c")  # the next turn of it is warm all the same
        assert again.status == 200 and again.outcome in ("hit", "miss"), again.reuse
        assert corrupt(pd.prefill, pd.decode) == 0


def test_a_restarted_decode_starts_again_from_the_rule_before_the_model(tmp_path: Path) -> None:
    with (
        sim_pair(tmp_path, speed=5, threshold=0) as pd,
        router_process(tmp_path, [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "4096") as r,
    ):
        convs = _measured(r)
        before = _choice(r)["rates"]["engines"][pd.decode_url]
        assert before["tokens_per_s"], before

        kill(pd.decode)  # and a new one on the same ports: a new engine id, none of the old KV
        decode = start_sim(tmp_path, "decode", name="decode-again", port=pd.decode.port,
                           side_port=pd.decode.side_port, speed=5)
        try:
            gone = convs[0].turn(f"{MORE} b")
            assert (gone.outcome, gone.reason) == ("miss", "decode_restarted"), gone.reuse
            after = _choice(r)["rates"]["engines"][pd.decode_url]
            assert after["generation"] > before["generation"] and not after["tokens_per_s"], after
            model, default = _choice(r)["basis"]["model"], _choice(r)["basis"]["default"]
            warm = convs[0].turn(f"{MORE} c")  # nothing measured of the new process: the rule before the model
            assert (warm.outcome, warm.reason) == ("hit", "decode_local"), warm.reuse
            _until(lambda: _choice(r)["basis"]["default"] > default, f"no default choice counted: {_choice(r)}")
            assert _choice(r)["basis"]["model"] == model
            assert corrupt(pd.prefill, decode) == 0
        finally:
            decode.stop()


def test_without_a_stall_bound_a_short_turn_beside_other_streams_probes_the_decode_before_its_rates_are_measured(
        tmp_path: Path) -> None:
    # --local-stall-ratio 0: the decode's local rates get measured on a decode that is never idle (a probe); the
    # default sends the same turn through the prefill (refused unmeasured).
    for ratio, local, basis, refused in (("0", True, "probe", None), ("1.2", False, "default", "unmeasured")):
        (tmp_path / ratio).mkdir()
        with (
            sim_pair(tmp_path / ratio, speed=5, threshold=0) as pd,
            router_process(tmp_path / ratio, [pd.prefill_url], [pd.decode_url], "--local-prefill-tokens", "4096",
                           "--local-policy", "cost", "--local-stall-ratio", ratio) as r,
        ):
            assert _choice(r)["local_stall_ratio"] == float(ratio)
            conv = Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=6)
            assert conv.turn(f"{uuid.uuid4().hex} {TEXT}").reason == "new_conversation"
            other = Conversation(r.url, False, True, "body", uuid.uuid4().hex, max_tokens=150)  # ~1 s of decoding
            streaming = threading.Thread(target=other.turn, args=(f"{uuid.uuid4().hex} other",))
            streaming.start()
            _until(lambda: r.stats()["decode"][0]["outstanding"] >= 1, "the other stream never started")
            warm = conv.turn(f"{MORE} a")  # ~60 tokens: within the 512 a decode may take unmeasured
            streaming.join()
            said = KvChoice.parse(warm.headers.get("x-pd-kv-choice"))
            assert said is not None and (said.source == "decode_cache", said.basis, said.refused) == (
                local, basis, refused), said
            assert warm.status == 200 and warm.outcome == "hit", warm.reuse
            assert corrupt(pd.prefill, pd.decode) == 0
