"""The simulated prefill runs pdctl.prefix_check before it reads a decode's blocks, as pdctl's patched vLLM does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pdctl.prefix_check import FIELD, REPORT, spec
from tests.sim.helpers import as_hit, output_ids, prefill, two_hop, wait_until
from tests.support.sim_procs import SimPair, sim_pair

CORRUPT = "pdctl_sim_corrupt_reuse_total"
READS = "vllm:nixl_xfer_time_seconds_count"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimPair]:
    with sim_pair(tmp_path_factory.mktemp("sim-check"), speed=1000, threshold=0) as p:
        yield p


def checked(handle: dict[str, Any], held: list[int], partial: bool = True) -> dict[str, Any]:
    """The handle as the router sends it for the prefill to verify: nothing to read until the check says so."""
    n = handle["remote_num_tokens"]
    return {**as_hit(handle), "remote_num_tokens": 0, FIELD: spec(held, n, 16, partial)}


def turn(pair: SimPair, first: int) -> tuple[list[int], dict[str, Any]]:
    prompt = list(range(first, first + 600))
    chunks, handle = two_hop(pair, {"prompt": prompt}, max_tokens=8)
    return prompt + output_ids(chunks), handle


def test_an_extended_prompt_is_verified_and_read(pair: SimPair) -> None:
    held, handle = turn(pair, 20000)
    reads = pair.prefill.metric(READS)
    r = prefill(pair.prefill_url, {"prompt": [*held, *range(30000, 30050)]}, checked(handle, held))
    assert r.status_code == 200, r.text
    n = handle["remote_num_tokens"]
    assert r.json()["kv_transfer_params"][REPORT] == {"outcome": "hit", "tokens": n, "reason": "verified",
                                                     "cached": 0, "read": n}
    assert wait_until(lambda: pair.prefill.metric(READS) == reads + 1)  # P read D's blocks back
    assert pair.prefill.metric(CORRUPT) == 0


def test_an_edited_history_reads_only_what_matches(pair: SimPair) -> None:
    """Without the check this exact edit is a corrupt read (test_two_hop: test_edited_history_counts_a_corruption)."""
    held, handle = turn(pair, 40000)
    edited = [*held[:300], 7, *held[301:], *range(50000, 50050)]
    r = prefill(pair.prefill_url, {"prompt": edited}, checked(handle, held))
    assert r.json()["kv_transfer_params"][REPORT] == {"outcome": "partial", "tokens": 256,
                                                      "reason": "prefix_diverged", "cached": 0, "read": 256,
                                                      "diverged_at": 256}
    held2, handle2 = turn(pair, 60000)
    r = prefill(pair.prefill_url, {"prompt": [7, *held2[1:], 1]}, checked(handle2, held2))
    assert r.json()["kv_transfer_params"][REPORT]["outcome"] == "miss"
    assert pair.prefill.metric(CORRUPT) == 0 and pair.decode.metric(CORRUPT) == 0


def test_a_prefill_without_the_check_reads_nothing(tmp_path: Any) -> None:
    with sim_pair(tmp_path, speed=1000, threshold=0, prefill_args=["--no-prefix-check"]) as unpatched:
        held, handle = turn(unpatched, 70000)
        reads = unpatched.prefill.metric(READS)
        r = prefill(unpatched.prefill_url, {"prompt": [*held, 1, 2]}, checked(handle, held))
        assert r.status_code == 200 and REPORT not in r.json()["kv_transfer_params"]
        assert unpatched.prefill.metric(READS) == reads and unpatched.prefill.metric(CORRUPT) == 0
