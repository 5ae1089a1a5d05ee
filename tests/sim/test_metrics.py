"""The step model's counters and the KV high-water mark on a real simulator's /metrics: they move by what
pdctl.sim.steps says the requests cost."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from pdctl.sim import steps
from tests.support.sim_procs import SERVED, sim_process

STEP_MODEL = ["--step-model", "h200-graphs"]


def complete(url: str, prompt: list[int], max_tokens: int) -> int:
    r = httpx.post(f"{url}/v1/completions", json={"model": SERVED, "prompt": prompt, "max_tokens": max_tokens},
                   timeout=30)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["completion_tokens"])


def decode_ms(context: int, tokens: int) -> float:
    """`tokens` decode steps alone, the first against `context` tokens in KV."""
    return sum(steps.alone_tpot_ms(steps.H200_GRAPHS, context + i) for i in range(tokens))


def test_step_counters_and_kv_peak_move_by_the_step_model(tmp_path: Path) -> None:
    with sim_process(tmp_path, "decode", speed=1000, block_size=16, num_blocks=500, args=STEP_MODEL) as sim:
        assert sim.metric("pdctl_sim_steps_total") == 0
        assert sim.metric("pdctl_sim_kv_num_gpu_blocks") == 500
        prompt = list(range(5000, 6000))
        assert complete(sim.url, prompt, 5) == 5
        # alone: one prefill step of the 1000 prompt tokens (it samples the first token), then 4 decode steps
        cold = steps.step_ms(steps.H200_GRAPHS, [(1000, 0)]) + decode_ms(1000, 4)
        assert sim.metric("pdctl_sim_steps_total") == 5
        assert sim.metric("pdctl_sim_step_prefill_tokens_total") == 1000
        assert sim.metric("pdctl_sim_step_decode_tokens_total") == 4
        assert sim.metric("pdctl_sim_step_modelled_ms_total") == pytest.approx(cold)
        assert sim.metric("pdctl_sim_kv_blocks_peak") == 63  # 1000 + 4 tokens in blocks of 16
        assert sim.metric("pdctl_sim_kv_blocks_in_use") == 0  # finished: its blocks are free (and cached)

        # the same prompt again: 62 cached blocks (992 tokens), so 8 tokens to compute after them
        assert complete(sim.url, prompt, 5) == 5
        warm = steps.step_ms(steps.H200_GRAPHS, [(8, 992)]) + decode_ms(1000, 4)
        assert sim.metric("pdctl_sim_steps_total") == 10
        assert sim.metric("pdctl_sim_step_prefill_tokens_total") == 1008
        assert sim.metric("pdctl_sim_step_decode_tokens_total") == 8
        assert sim.metric("pdctl_sim_step_modelled_ms_total") == pytest.approx(cold + warm)
        assert sim.metric("pdctl_sim_kv_blocks_peak") == 63  # one request at a time never held more


def test_without_the_step_model_there_are_no_step_counters(tmp_path: Path) -> None:
    with sim_process(tmp_path, "decode", speed=1000, num_blocks=500) as sim:
        assert complete(sim.url, list(range(100, 400)), 3) == 3
        text = httpx.get(f"{sim.url}/metrics", timeout=10).text
        assert "pdctl_sim_steps_total{" not in text and "pdctl_sim_step_modelled_ms_total{" not in text
        assert sim.metric("pdctl_sim_kv_blocks_peak") == 19  # 300 + 2 tokens in blocks of 16
