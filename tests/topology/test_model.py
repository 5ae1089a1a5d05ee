"""The schema's shared defaults and derived values: block sizes as ints, the router's defaults the plan relies on,
and a package whose modules import each other in one direction only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pdctl.topology
from pdctl.defaults import UCX_BLOCK_SIZE, VLLM_BLOCK_SIZE
from pdctl.router.config import RouterConfig
from pdctl.topology import parse
from tests.topology.minimal import MINIMAL


def _topology(engine: str, backend: str, block_size: int | None) -> str:
    text = MINIMAL.replace("engine: sim", f"engine: {engine}") + f"connector:\n  backend: {backend}\n"
    if block_size is not None:
        text = text.replace("  id: Qwen/Qwen3-32B\n", f"  id: Qwen/Qwen3-32B\n  block_size: {block_size}\n")
    for port, gpu in ((8100, 0), (8200, 1)):
        text = text.replace(f"port: {port},", f"port: {port}, gpus: [{gpu}],")
    return text


@pytest.mark.parametrize(("engine", "backend", "block_size", "size", "left_to_vllm"), [
    ("vllm", "UCX", None, UCX_BLOCK_SIZE, False),
    ("vllm", "LIBFABRIC", None, VLLM_BLOCK_SIZE, True),
    ("vllm", "LIBFABRIC", 64, 64, False),
    ("sim", "UCX", None, VLLM_BLOCK_SIZE, False),
    ("sim", "UCX", 32, 32, False),
])
def test_block_size_is_an_int_and_left_to_vllm_only_where_nothing_sets_it(
    engine: str, backend: str, block_size: int | None, size: int, left_to_vllm: bool
) -> None:
    topo = parse(_topology(engine, backend, block_size), "topo.yaml")
    for inst in (*topo.prefill, *topo.decode):
        assert topo.block_size_for(inst) == size
        assert topo.block_size_left_to_vllm(inst) is left_to_vllm


def test_the_topologys_router_defaults_are_the_routers() -> None:
    """The plan leaves out a router flag whose topology value is the default; that is sound only while they agree."""
    router = parse(MINIMAL, "topo.yaml").router
    config = RouterConfig(prefill=("http://p",), decode=("http://d",))
    for knob in ("handle_ttl", "verify_prefix", "verify_at", "local_prefill_tokens", "local_policy",
                 "local_busy_streams", "release", "pin_budget_tokens", "pin_budget_fraction", "overflow_kv"):
        assert getattr(router, knob) == getattr(config, knob), knob


def test_the_package_imports_in_one_direction() -> None:
    """strict <- router_section <- model <- checks <- file <- the package: the schema imports neither the loader
    nor the checks."""
    package = Path(pdctl.topology.__file__).parent
    imports: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text())
        found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        imports[path.stem] = {m.removeprefix("pdctl.topology.") for m in found if m.startswith("pdctl.topology.")}
    assert imports["model"] == {"router_section", "strict", "strings"}
    assert imports["router_section"] == {"strict", "strings"}
    assert imports["strict"] == set()
    assert imports["checks"] == {"model"}
    assert imports["file"] == {"bounded_yaml", "checks", "model"}
    assert imports["strings"] == imports["bounded_yaml"] == set()
