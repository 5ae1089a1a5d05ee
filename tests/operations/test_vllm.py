"""`vllm.compat` on this machine: the real operation, facts and `python -m pdctl.vllm_compat` on a vLLM install made
of the 0.26.0 fixture files; the node's `bin/python` is a script that runs this interpreter over that install."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from pdctl.errors import PdctlError
from pdctl.facts.base import HostLayout, gather
from pdctl.lifecycle.bringup.provision import OpResult, contexts, run_operation
from pdctl.operations import vllm
from pdctl.operations.base import Facts
from pdctl.operations.steps import StepRunner
from pdctl.plan import plan
from pdctl.remote.local import LocalTransport
from pdctl.vllm_compat import PATCHED_MARKER, PREFIX_MARKER
from tests.provision.support import VLLM_FIXTURE, topology
from tests.support.venvs import script_venv

REPO = Path(__file__).parents[2]
CHAT = "vllm/entrypoints/openai/chat_completion/serving.py"
NIXL = "vllm/distributed/kv_transfer/kv_connector/v1/nixl"
PULL = f"{NIXL}/pull_scheduler.py"
COPY = f"{NIXL}/pdctl_prefix_check.py"
BOTH = "patch vLLM {v} to stream kv_transfer_params and to verify prefixes at the prefill"
CHECK_ONLY = "patch vLLM {v} to verify prefixes at the prefill"
STREAM_ONLY = "patch vLLM {v} to stream kv_transfer_params"
NO_CHECK = "; no prefix check (a layout pdctl cannot patch; router.verify_at: router)"


class Node:
    def __init__(self, tmp: Path, version: str, **router: Any) -> None:
        self.site = tmp / "site-packages"
        shutil.copytree(VLLM_FIXTURE, self.site)
        info = self.site / f"vllm-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        venv = script_venv(tmp / "venv", f'PYTHONPATH={self.site}:{REPO} exec {sys.executable} "$@"')
        self.topo = topology(python={"venv": venv, "vllm_version": version},
                             router={"node": "a", "port": 18000, **router})
        self.transport = LocalTransport("a")

    def compat(self) -> OpResult:
        [ctx] = contexts(self.topo, plan(self.topo), {"a": HostLayout()})
        ctx.facts = Facts(lambda facts: gather(self.transport, facts, HostLayout()))
        console = Console(width=120, record=True, force_terminal=False, color_system=None)
        with StepRunner(console) as runner:
            return run_operation("vllm.compat", vllm.compat, ctx, self.transport, console, runner)

    def text(self, rel: str) -> str:
        return (self.site / rel).read_text()

    def unknown_scheduler(self) -> None:
        pull = self.site / PULL
        pull.write_text(pull.read_text().replace("        params = request.kv_transfer_params\n", "        p = 1\n", 1))


def test_both_patches_once_then_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path, "0.26.0")

    assert node.compat().changes == [BOTH.format(v="0.26.0")]
    assert PATCHED_MARKER in node.text(CHAT)
    assert node.text(PULL).count(PREFIX_MARKER) == 4
    assert node.text(COPY) == (REPO / "pdctl/prefix_check.py").read_text()
    again = node.compat()
    assert (again.changes, again.noop) == ([], "vLLM 0.26.0 already carries pdctl's streaming patch and prefix check")


def test_verify_at_prefill_refuses_a_scheduler_pdctl_cannot_patch_before_changing_anything(tmp_path: Path) -> None:
    node = Node(tmp_path, "0.26.0")
    node.unknown_scheduler()
    before = node.text(CHAT)

    with pytest.raises(PdctlError) as failed:
        node.compat()

    assert failed.value.message == (
        "a: vLLM 0.26.0's NIXL scheduler is laid out in a way pdctl cannot patch with its prefix check, which"
        " router.verify_at: prefill needs"
    )
    assert failed.value.hint == (
        "set router.verify_at: router (the router verifies with a /tokenize), or pin python.vllm_version to 0.26.0"
    )
    assert node.text(CHAT) == before
    assert not (node.site / COPY).exists()


@pytest.mark.parametrize("router", [{"verify_at": "router"}, {"verify_prefix": False}])
def test_without_verification_at_the_prefill_only_streaming_is_required(tmp_path: Path, router: Any) -> None:
    node = Node(tmp_path, "0.26.0", **router)
    node.unknown_scheduler()

    assert node.compat().changes == [STREAM_ONLY.format(v="0.26.0")]
    assert PATCHED_MARKER in node.text(CHAT)
    assert PREFIX_MARKER not in node.text(PULL) and not (node.site / COPY).exists()
    assert node.compat().noop == "vLLM 0.26.0 already carries pdctl's streaming patch" + NO_CHECK


def test_verify_at_router_still_gets_the_prefix_check_where_it_applies(tmp_path: Path) -> None:
    node = Node(tmp_path, "0.26.0", verify_at="router")
    assert node.compat().changes == [BOTH.format(v="0.26.0")]


def test_native_streaming_gets_only_the_prefix_check(tmp_path: Path) -> None:
    node = Node(tmp_path, "0.33.0")

    assert node.compat().changes == [CHECK_ONLY.format(v="0.33.0")]
    assert PATCHED_MARKER not in node.text(CHAT)
    assert node.compat().noop == "vLLM 0.33.0 streams kv_transfer_params natively and carries pdctl's prefix check"


def test_an_older_copy_of_the_check_is_replaced(tmp_path: Path) -> None:
    node = Node(tmp_path, "0.26.0")
    node.compat()
    (node.site / COPY).write_text("# an older pdctl's prefix check\n")

    assert node.compat().changes == [CHECK_ONLY.format(v="0.26.0")]
    assert node.text(COPY) == (REPO / "pdctl/prefix_check.py").read_text()
