"""Model weights: `hf download` into HF_HOME when the pinned snapshot is not there; a local directory is checked."""

from __future__ import annotations

import shlex

from pdctl.errors import PdctlError
from pdctl.facts.base import path
from pdctl.facts.model import DEFAULT_HF_HOME, ModelSnapshot
from pdctl.operations.base import Context, Noop, Operation, Run


def snapshot_fact(ctx: Context) -> ModelSnapshot:
    m = ctx.topo.model
    return ModelSnapshot(m.id, m.revision, ctx.topo.hf_home, m.local_dir)


def local_dir_missing(ctx: Context) -> PdctlError | None:
    """`model.local_dir` is set but holds no model on this engine node: nothing else provisioning does can fix
    that, so `provision` asks before any host changes and `doctor` / `up --dry-run` report it as they find it."""
    m = ctx.topo.model
    if not ctx.vllm or not m.local_dir or ctx.facts.get(snapshot_fact(ctx)).present:
        return None
    return PdctlError(
        f"{ctx.node.name}: model.local_dir {m.local_dir} has no config.json",
        hint=LOCAL_DIR_FIX,
    )


LOCAL_DIR_FIX = ("copy the model there (scripts/make_dummy_model.py writes a random-weights one), "
                 "or unset model.local_dir to download model.id")


def download(ctx: Context) -> Operation:
    """Download the model at its revision unless its snapshot (or `model.local_dir`) is already there."""
    if not ctx.vllm:
        yield Noop("no vLLM engine on this node")
        return
    m = ctx.topo.model
    fact = snapshot_fact(ctx)
    found = ctx.facts.get(fact)
    if found.present:
        yield Noop(f"{m.id} at {found.path} ({found.files} files)")
        return
    missing = local_dir_missing(ctx)
    if missing is not None:
        raise missing
    hf_home = ctx.topo.hf_home or DEFAULT_HF_HOME
    rev = f" --revision {shlex.quote(m.revision)}" if m.revision else ""
    bin_dir = path(f"{ctx.venv_dir}/bin")
    yield Run(
        f"export HF_HOME={path(hf_home)}; export PATH={bin_dir}:\"$PATH\"; "
        f"hf download {shlex.quote(m.id)}{rev}",
        f"hf download {m.id}{rev} into {hf_home}",
        timeout=4 * 3600,
    )
    ctx.facts.forget(fact)
    if not ctx.facts.get(fact).present:
        raise PdctlError(
            f"{ctx.node.name}: `hf download {m.id}` finished but no snapshot{rev} is in {hf_home}",
            hint="check the model id and revision, and HF_TOKEN for gated models",
        )
