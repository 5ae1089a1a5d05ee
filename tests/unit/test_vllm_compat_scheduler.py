"""The patched vLLM 0.26.0 pull scheduler runs pdctl's prefix check: its real code, imported without vLLM.

The fixture's `pull_scheduler.py` is patched by `vllm_compat.apply`, then imported as it is, next to the copied
`pdctl_prefix_check.py`, over stand-ins for the few vLLM modules it imports (a logger, the base scheduler's
attributes, `RequestStatus`). The unpatched original is imported the same way, so behaviour without a spec is
compared with vLLM's own.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from pdctl.prefix_check import FIELD, REPORT, spec
from pdctl.vllm_compat import apply

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-0.26.0"
NIXL = "vllm/distributed/kv_transfer/kv_connector/v1/nixl"
BLOCK = 16
HELD = 600  # the decode holds 600 tokens: two whole 256-token chunks and 88 more
STUBS = {
    "vllm/__init__.py": "",
    "vllm/logger.py": "import logging\n\ndef init_logger(name):\n    return logging.getLogger(name)\n",
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/kv_transfer/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/utils.py": "BlockIds = tuple\n",
    "vllm/distributed/kv_transfer/kv_connector/v1/__init__.py": "",
    f"{NIXL}/__init__.py": "",
    f"{NIXL}/base_scheduler.py": """
        import types

        class NixlBaseConnectorScheduler:
            def __init__(self, vllm_config, engine_id, kv_cache_config):
                self.vllm_config = vllm_config
                self.engine_id = engine_id
                self._has_mamba = False
                self.kv_recompute_threshold = 0
                self.is_bidirectional_kv_xfer_enabled = True
                self._kv_lease_duration = 30
                self.decoder_kv_blocks_ttl = 60
                self.side_channel_host = "10.0.0.1"
                self.side_channel_port = 5600
                self._reqs_need_send = {}
                self._reqs_need_recv = {}
                self._reqs_need_save = {}
                self._reqs_not_processed = set()
                self._reqs_in_batch = set()
                self.use_host_buffer = False

            def _stop_heartbeat(self, request_id):
                pass

            def get_sw_clipped_blocks(self, block_ids):
                return block_ids

            def _get_remote_prefill_token_count(self, num_prompt_tokens):
                return num_prompt_tokens
    """,
    "vllm/v1/__init__.py": "",
    "vllm/v1/request.py": """
        import enum

        class RequestStatus(enum.Enum):
            FINISHED_STOPPED = 1
            FINISHED_LENGTH_CAPPED = 2
            FINISHED_ABORTED = 3
    """,
}


@dataclass(frozen=True)
class Loaded:
    patched: ModuleType  # the patched pull_scheduler.py
    original: ModuleType  # vLLM's, from the backup apply kept
    finished: Any  # RequestStatus.FINISHED_LENGTH_CAPPED


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    site = tmp_path_factory.mktemp("site-packages")
    shutil.copytree(FIXTURE, site, dirs_exist_ok=True)
    assert len(apply(site, "0.26.0", only=["prefix-check"])) == 2
    for rel, text in STUBS.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text))
    assert "vllm" not in sys.modules
    sys.path.insert(0, str(site))
    try:
        patched = importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler")
        backup = site / NIXL / "pull_scheduler.py.pdctl-orig"
        loader = importlib.machinery.SourceFileLoader("original_pull_scheduler", str(backup))
        found = importlib.util.spec_from_loader(loader.name, loader)
        assert found is not None
        original = importlib.util.module_from_spec(found)
        loader.exec_module(original)
        status = importlib.import_module("vllm.v1.request").RequestStatus
        yield Loaded(patched, original, status.FINISHED_LENGTH_CAPPED)
    finally:
        sys.path.remove(str(site))
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]


def _scheduler(module: ModuleType, threshold: int = 0) -> Any:
    config = SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=1))
    scheduler = module.NixlPullConnectorScheduler(config, "prefill-engine", None)
    scheduler.kv_recompute_threshold = threshold
    return scheduler


def _held() -> list[int]:
    return list(range(1000, 1000 + HELD))


def _handle(with_spec: bool = True, remote_num_tokens: int = 0) -> dict[str, Any]:
    params: dict[str, Any] = {
        "do_remote_decode": True, "do_remote_prefill": False,
        "remote_block_ids": [list(range(100, 100 + -(-HELD // BLOCK)))],
        "remote_engine_id": "decode-engine", "remote_request_id": "turn-1", "remote_host": "10.0.0.2",
        "remote_port": 5601, "tp_size": 1, "remote_num_tokens": remote_num_tokens,
    }
    if with_spec:
        params[FIELD] = spec(_held(), HELD, BLOCK)
    return params


def _request(params: dict[str, Any] | None, prompt: list[int]) -> SimpleNamespace:
    return SimpleNamespace(request_id="turn-2", kv_transfer_params=params, prompt_token_ids=prompt,
                           num_prompt_tokens=len(prompt), prompt_embeds=None, status=None, num_computed_tokens=0)


def _edited(at: int) -> list[int]:
    prompt = [*_held(), *range(5000, 5100)]
    prompt[at] = 7
    return prompt


def test_hit_counts_every_held_token(modules: Loaded) -> None:
    patched, original = modules.patched, modules.original
    prompt = [*_held(), *range(5000, 5100)]
    params = _handle()
    request = _request(params, prompt)

    assert _scheduler(patched).get_num_new_matched_tokens(request, 0) == (HELD, True)
    assert params["remote_num_tokens"] == HELD and FIELD not in params
    assert params[REPORT] == {"outcome": "hit", "tokens": HELD, "reason": "verified", "cached": 0, "read": HELD}
    assert params["remote_block_ids"] == _handle()["remote_block_ids"]
    # asked again while the request waits for blocks: the spec is gone, the verdict stays
    assert _scheduler(patched).get_num_new_matched_tokens(request, 0) == (HELD, True)
    # vLLM's own code reads nothing from the same handle: the fail-safe the router relies on
    assert _scheduler(original).get_num_new_matched_tokens(_request(_handle(), prompt), 0) == (0, False)


def test_diverged_history_reads_the_whole_chunks_before_the_edit(modules: Loaded) -> None:
    patched = modules.patched
    params = _handle()

    assert _scheduler(patched).get_num_new_matched_tokens(_request(params, _edited(300)), 0) == (256, True)
    assert params["remote_num_tokens"] == 256
    assert params["remote_block_ids"] == [list(range(100, 116))]
    assert params[REPORT] == {"outcome": "partial", "tokens": 256, "reason": "prefix_diverged",
                             "cached": 0, "read": 256, "diverged_at": 256}


def test_the_prefill_cache_hit_decides_the_source(modules: Loaded) -> None:
    """The patched scheduler gives the check vLLM's num_computed_tokens (its own prefix cache's hit): a cache that
    holds all but a few tokens reads nothing, one that holds part reads only what it lacks (issue 29)."""
    patched = modules.patched
    prompt = [*_held(), *range(5000, 5100)]
    params = {**_handle(with_spec=False), FIELD: spec(_held(), HELD, BLOCK, min_read=256)}
    assert _scheduler(patched).get_num_new_matched_tokens(_request(params, prompt), 592) == (0, False)
    assert params[REPORT] == {"outcome": "hit", "tokens": 592, "reason": "prefill_cached", "cached": 592, "read": 0}
    params = {**_handle(with_spec=False), FIELD: spec(_held(), HELD, BLOCK, min_read=256)}
    assert _scheduler(patched).get_num_new_matched_tokens(_request(params, prompt), 256) == (HELD - 256, True)
    assert params[REPORT] == {"outcome": "hit", "tokens": HELD, "reason": "verified", "cached": 256,
                              "read": HELD - 256}


def test_a_partial_below_the_recompute_threshold_reads_nothing(modules: Loaded) -> None:
    patched = modules.patched
    scheduler = _scheduler(patched, threshold=300)
    assert scheduler.get_num_new_matched_tokens(_request(_handle(), _edited(300)), 0) == (0, False)


@pytest.mark.parametrize(("prompt", "reason"), [(_edited(5), "prefix_diverged"), (_held(), "prompt_not_longer")])
def test_miss_reads_nothing(modules: Loaded, prompt: list[int], reason: str) -> None:
    patched = modules.patched
    params = _handle()

    assert _scheduler(patched).get_num_new_matched_tokens(_request(params, prompt), 0) == (0, False)
    assert params["remote_num_tokens"] == 0
    where = {"diverged_at": 0} if reason == "prefix_diverged" else {}
    assert params[REPORT] == {"outcome": "miss", "tokens": 0, "reason": reason, "cached": 0, "read": 0, **where}
    assert params["remote_block_ids"] == _handle()["remote_block_ids"]  # kept: vLLM frees them on the decode


@pytest.mark.parametrize("params", [
    None,
    {"do_remote_decode": True, "remote_engine_id": None, "remote_block_ids": None},
    _handle(with_spec=False, remote_num_tokens=0),
    _handle(with_spec=False, remote_num_tokens=HELD),
    {**_handle(with_spec=False), "do_remote_decode": False, "do_remote_prefill": True},
])
def test_without_a_spec_it_is_vllms_own_behaviour(
    modules: Loaded, params: dict[str, Any] | None
) -> None:
    patched, original = modules.patched, modules.original
    prompt = [*_held(), *range(5000, 5100)]
    mine, theirs = (None, None) if params is None else (dict(params), dict(params))

    got = _scheduler(patched).get_num_new_matched_tokens(_request(mine, prompt), 0)
    assert got == _scheduler(original).get_num_new_matched_tokens(_request(theirs, prompt), 0)
    assert mine == theirs


def test_the_spec_on_a_decode_request_is_left_alone(modules: Loaded) -> None:
    patched = modules.patched
    params = {**_handle(), "do_remote_decode": False, "do_remote_prefill": True}
    _scheduler(patched).get_num_new_matched_tokens(_request(params, _held()), 0)
    assert FIELD in params and REPORT not in params


def test_request_finished_returns_the_report(modules: Loaded) -> None:
    patched, original = modules.patched, modules.original
    params = _handle()
    request = _request(params, _edited(300))
    scheduler = _scheduler(patched)
    scheduler.get_num_new_matched_tokens(request, 0)
    request.status, request.num_computed_tokens = modules.finished, 700

    delay, answer = scheduler.request_finished(request, ([7, 8, 9],))

    assert delay is True
    assert answer["pdctl_reuse"] == {"outcome": "partial", "tokens": 256, "reason": "prefix_diverged",
                                    "cached": 0, "read": 256, "diverged_at": 256}
    theirs = _request(dict(params), request.prompt_token_ids)
    theirs.status, theirs.num_computed_tokens = request.status, 700
    _, vllms = _scheduler(original).request_finished(theirs, ([7, 8, 9],))
    assert {k: v for k, v in answer.items() if k != "pdctl_reuse"}.keys() == vllms.keys()
    assert {k: v for k, v in answer.items() if k not in ("pdctl_reuse", "remote_blocks_expiry_time")} == {
        k: v for k, v in vllms.items() if k != "remote_blocks_expiry_time"}


def test_request_finished_without_a_report_says_none(modules: Loaded) -> None:
    patched = modules.patched
    request = _request({"do_remote_prefill": False, "do_remote_decode": False}, _held())
    request.status, request.num_computed_tokens = modules.finished, HELD

    _, answer = _scheduler(patched).request_finished(request, ([1, 2],))

    assert answer["pdctl_reuse"] is None
    assert answer["remote_num_tokens"] == HELD


def _release(modules: Loaded, which: str, marked: bool) -> tuple[Any, Any, tuple[bool, Any]]:
    """A router's release (pdctl.router.kv.release) through vLLM's scheduler code, scheduled and finished by length."""
    from pdctl.router.kv.release import RELEASE_FIELD, release_params

    params = release_params({**_handle(), "remote_num_tokens": HELD, "remote_blocks_expiry_time": 9.0})
    if not marked:
        params.pop(RELEASE_FIELD)
    request = _request(params, [0])
    request.request_id = "release-1"
    scheduler = _scheduler(getattr(modules, which), threshold=64)
    assert scheduler.get_num_new_matched_tokens(request, 0) == (0, False)  # nothing to read
    scheduler.update_state_after_alloc(request, None, 0)
    request.status, request.num_computed_tokens = modules.finished, 1
    return scheduler, request, scheduler.request_finished(request, ([42],))


@pytest.mark.parametrize("which", ["original", "patched"])
def test_a_release_reads_nothing_and_notifies_the_decode(modules: Loaded, which: str) -> None:
    scheduler, request, _ = _release(modules, which, marked=True)
    # No local blocks: the worker sends the decode the notify that frees the handle's blocks (a "full prefix hit").
    assert scheduler._reqs_need_recv == {"release-1": (request, ())}


def test_a_stock_prefill_keeps_the_releases_one_block_for_its_lease(modules: Loaded) -> None:
    scheduler, _, (delay, params) = _release(modules, "original", marked=True)
    assert delay is True and params["do_remote_prefill"] is True
    assert set(scheduler._reqs_need_send) == {"release-1"}


def test_a_patched_prefill_frees_the_releases_block_at_once(modules: Loaded) -> None:
    scheduler, _, finished = _release(modules, "patched", marked=True)
    assert finished == (False, None)
    assert scheduler._reqs_need_send == {} and scheduler._reqs_not_processed == {"release-1"}
    _, _, (delay, _) = _release(modules, "patched", marked=False)  # any other request is vLLM's as before
    assert delay is True


@pytest.mark.parametrize("which", ["original", "patched"])
def test_a_turn_that_carries_a_release_computes_its_own_prompt_notifies_the_decode_and_answers_for_its_pull(
        modules: Loaded, which: str) -> None:
    # A new conversation's prefill request with a queued release's params (pdctl.router.turn.prefill): the handle of
    # another conversation on the decode, remote_num_tokens 0, unmarked. Its prompt shares a cached prefix here.
    from pdctl.router.kv.release import RELEASE_FIELD, release_params
    from pdctl.router.turn.verify import miss_params

    carried = {**_handle(with_spec=False, remote_num_tokens=HELD), "remote_blocks_expiry_time": 9.0}
    params = {**miss_params(), **release_params(carried, alone=False)}
    assert RELEASE_FIELD not in params and params["remote_num_tokens"] == 0
    prompt = list(range(3000, 3900))
    request = _request(params, prompt)
    request.request_id = "new-1"
    scheduler = _scheduler(getattr(modules, which), threshold=64)
    assert scheduler.get_num_new_matched_tokens(request, 512) == (0, False)  # nothing read: all computed here
    scheduler.update_state_after_alloc(request, None, 0)
    assert scheduler._reqs_need_recv == {"new-1": (request, ())}  # the worker's notify frees "turn-1" on the decode
    request.status, request.num_computed_tokens = modules.finished, len(prompt)
    delay, answer = scheduler.request_finished(request, ([11, 12, 13],))
    # Its own blocks stay for the decode's pull, and the answer names them, not the carried handle's.
    assert delay is True and set(scheduler._reqs_need_send) == {"new-1"}
    assert (answer["do_remote_prefill"], answer["remote_engine_id"], answer["remote_request_id"]) == (
        True, "prefill-engine", "new-1")
    assert (answer["remote_block_ids"], answer["remote_num_tokens"]) == (([11, 12, 13],), len(prompt))
