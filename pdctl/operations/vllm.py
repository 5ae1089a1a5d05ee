"""vLLM compatibility: patch a vLLM older than 0.33.0 so it streams `kv_transfer_params` (pdctl.vllm_compat).

Without the patch the decode's handle never reaches the router on streamed turns and every turn misses.
"""

from __future__ import annotations

from pdctl.errors import PdctlError
from pdctl.facts.base import path
from pdctl.facts.python import VllmCompat
from pdctl.operations.base import Context, Noop, Operation, Run


def compat(ctx: Context) -> Operation:
    """Apply pdctl's streaming patch when the installed vLLM needs it; refuse layouts pdctl does not know."""
    if not ctx.vllm:
        yield Noop("no vLLM engine on this node")
        return
    fact = VllmCompat(ctx.python)
    state = ctx.facts.get(fact)
    version = ctx.topo.python.vllm_version
    if state == "native":
        yield Noop(f"vLLM {version} streams kv_transfer_params natively")
        return
    if state == "patched":
        yield Noop(f"vLLM {version} already carries pdctl's streaming patch")
        return
    if state == "unknown-layout":
        raise _unknown(ctx, version)
    if state is None:
        raise PdctlError(
            f"{ctx.node.name}: cannot tell whether vLLM in {ctx.venv_dir} streams kv_transfer_params",
            hint=f"run `{ctx.python} -m pdctl.vllm_compat status` on the node to see why",
        )
    result = yield Run(
        f"{path(ctx.python)} -m pdctl.vllm_compat apply",
        f"patch vLLM {version} to stream kv_transfer_params",
        check=False,
    )
    if result is not None and not result.ok:
        raise _unknown(ctx, version, (result.stderr or result.stdout).strip())
    ctx.facts.forget(fact)
    after = ctx.facts.get(fact)
    if after != "patched":
        raise PdctlError(
            f"{ctx.node.name}: after patching, vLLM {version} reports {after}",
            hint=f"run `{ctx.python} -m pdctl.vllm_compat apply` on the node and read its message",
        )


def _unknown(ctx: Context, version: str, detail: str = "") -> PdctlError:
    return PdctlError(
        f"{ctx.node.name}: vLLM {version}'s files are laid out in a way pdctl cannot patch"
        + (f": {detail}" if detail else ""),
        hint="pin python.vllm_version to 0.33.0 or newer (streams kv_transfer_params natively) or to 0.26.0",
    )
