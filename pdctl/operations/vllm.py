"""vLLM compatibility: pdctl's two patches to an installed vLLM (pdctl.vllm_compat).

`streaming` (vLLM older than 0.33.0): without it the decode's handle never reaches the router on streamed turns
and every turn misses. `prefix-check`: the prefill verifies the decode's tokens against its own tokenization, so
the router need not `/tokenize` the conversation (router.verify_at: prefill). Both are applied where they can be;
the prefix check is required only when the router relies on it.
"""

from __future__ import annotations

from pdctl.errors import PdctlError
from pdctl.facts.base import path
from pdctl.facts.python import VllmCompat, VllmPatches
from pdctl.operations.base import Context, Noop, Operation, Run
from pdctl.topology import Topology

_DOES = {"streaming": "stream kv_transfer_params", "prefix-check": "verify prefixes at the prefill"}


def needs_prefix_check(topo: Topology) -> bool:
    """Whether the router leaves verification to the prefill, so a prefill without the check never reuses KV."""
    return topo.router.verify_prefix and topo.router.verify_at == "prefill"


def _states(state: VllmPatches) -> dict[str, str]:
    return {"streaming": state.streaming, "prefix-check": state.prefix_check}


def compat(ctx: Context) -> Operation:
    """Apply pdctl's patches the installed vLLM lacks; refuse a layout pdctl does not know where it is needed."""
    if not ctx.vllm:
        yield Noop("no vLLM engine on this node")
        return
    fact = VllmCompat(ctx.python)
    state = ctx.facts.get(fact)
    version = ctx.topo.python.vllm_version
    if state is None:
        raise PdctlError(
            f"{ctx.node.name}: cannot tell whether vLLM in {ctx.venv_dir} carries pdctl's patches",
            hint=f"run `{ctx.python} -m pdctl.vllm_compat status` on the node to see why",
        )
    _refuse_unknown(ctx, version, state)
    todo = [patch for patch, s in _states(state).items() if s == "needs-patch"]
    if not todo:
        yield Noop(_unchanged(version, state))
        return
    only = " ".join(f"--only {patch}" for patch in todo)
    result = yield Run(
        f"{path(ctx.python)} -m pdctl.vllm_compat apply {only}",
        f"patch vLLM {version} to {' and to '.join(_DOES[patch] for patch in todo)}",
        check=False,
    )
    if result is not None and not result.ok:
        raise PdctlError(
            f"{ctx.node.name}: patching vLLM {version} failed: {(result.stderr or result.stdout).strip()}",
            hint=f"run `{ctx.python} -m pdctl.vllm_compat apply` on the node and read its message",
        )
    ctx.facts.forget(fact)
    after = ctx.facts.get(fact)
    left = [patch for patch in todo if after is None or _states(after)[patch] != "patched"]
    if left:
        raise PdctlError(
            f"{ctx.node.name}: after patching, vLLM {version} reports "
            + (", ".join(f"{patch}: {_states(after)[patch]}" for patch in left) if after else "nothing"),
            hint=f"run `{ctx.python} -m pdctl.vllm_compat apply` on the node and read its message",
        )


def _refuse_unknown(ctx: Context, version: str, state: VllmPatches) -> None:
    if state.streaming == "unknown-layout":
        raise PdctlError(
            f"{ctx.node.name}: vLLM {version}'s files are laid out in a way pdctl cannot patch to stream"
            " kv_transfer_params",
            hint="pin python.vllm_version to 0.33.0 or newer (streams kv_transfer_params natively) or to 0.26.0",
        )
    if state.prefix_check == "unknown-layout" and needs_prefix_check(ctx.topo):
        raise PdctlError(
            f"{ctx.node.name}: vLLM {version}'s NIXL scheduler is laid out in a way pdctl cannot patch with its"
            " prefix check, which router.verify_at: prefill needs",
            hint="set router.verify_at: router (the router verifies with a /tokenize), or pin python.vllm_version"
            " to 0.26.0",
        )


def _unchanged(version: str, state: VllmPatches) -> str:
    native = state.streaming == "native"
    if state.prefix_check == "patched":
        both = ("streams kv_transfer_params natively and carries pdctl's prefix check" if native
                else "already carries pdctl's streaming patch and prefix check")
        return f"vLLM {version} {both}"
    streams = "streams kv_transfer_params natively" if native else "already carries pdctl's streaming patch"
    return f"vLLM {version} {streams}; no prefix check (a layout pdctl cannot patch; router.verify_at: router)"
