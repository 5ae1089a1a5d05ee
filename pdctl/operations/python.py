"""The node's Python: the venv, the wheelhouse copy for offline installs, and the pinned packages."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from pdctl.errors import PdctlError, RemoteCommandError, TopologyError
from pdctl.facts.base import path
from pdctl.facts.python import FileHashes, Venv, VenvState
from pdctl.operations.base import Context, Noop, Operation, Put, Run
from pdctl.remote.base import CommandResult
from pdctl.topology.notes import WHEEL_SUFFIXES

_HASHES: dict[tuple[str, int, int], str] = {}


def venv_state(ctx: Context, names: tuple[str, ...] = ()) -> VenvState:
    base = ("vllm", "nixl", "torch", "pdctl")
    extra = tuple(n for n in names if n not in base)
    return VenvState(ctx.venv_dir, base + extra, None if ctx.venv else ctx.python)


def pip_install(ctx: Context, args: str) -> str:
    """A pip install into the node's venv: `uv pip` where uv exists, offline from the wheelhouse if one is set."""
    offline = ""
    if ctx.topo.python.wheelhouse:
        offline = f"--no-index --find-links {path(ctx.remote_wheelhouse)} "
    py = path(ctx.python)
    return (
        f"if command -v uv >/dev/null 2>&1; then uv pip install --python {py} {offline}{args}; "
        f"else {py} -m pip install --disable-pip-version-check -q {offline}{args}; fi"
    )


def venv(ctx: Context) -> Operation:
    """Create the venv (uv where present, else `python3 -m venv`) when it does not exist."""
    if ctx.venv is None:
        yield Noop("python.venv is null: the CLI's own interpreter runs pdctl")
        return
    if not (ctx.runs_pdctl or ctx.vllm):
        yield Noop("runs no pdctl or vLLM process")
        return
    state = ctx.facts.get(venv_state(ctx))
    v = path(ctx.venv)
    if state.exists and state.python and ctx.topo.python.system_site_packages and not state.system_site_packages:
        # the flag is read from pyvenv.cfg at every start: switching it on is all `--system-site-packages` does
        cfg = f"{v}/pyvenv.cfg"
        yield Run(
            f"sed -i '/^include-system-site-packages/d' {cfg} && echo 'include-system-site-packages = true' >> {cfg}",
            f"let venv {ctx.venv} see the system site-packages",
        )
        ctx.facts.forget(venv_state(ctx))
        return
    if state.exists and state.python:
        yield Noop(f"{ctx.venv} has Python {state.python}")
        return
    if ctx.topo.python.system_site_packages:
        # the system's pip serves the venv too; seeding a private pip costs seconds per host
        create = (
            f"python3 -m venv --system-site-packages --without-pip {v} && "
            f"{{ {v}/bin/python -m pip --version >/dev/null 2>&1 || {v}/bin/python -m ensurepip -q; }}"
        )
        uv = f"uv venv --system-site-packages {v}"
    else:
        create, uv = f"python3 -m venv {v}", f"uv venv --seed {v}"
    yield Run(
        f"if command -v uv >/dev/null 2>&1; then {uv}; else {create}; fi", f"create venv {ctx.venv}", timeout=300
    )
    ctx.facts.forget(venv_state(ctx))


def local_hash(file: Path) -> str:
    st = file.stat()
    key = (str(file.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with file.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def wheelhouse_files(directory: str) -> list[Path]:
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise PdctlError(
            f"python.wheelhouse {directory} is not a directory on this machine",
            hint="point python.wheelhouse at a local folder of wheels "
                 "(`scripts/gpu/build-wheelhouse.sh DIR` fills DIR/wheels)",
        )
    return sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(WHEEL_SUFFIXES))


def wheelhouse(ctx: Context) -> Operation:
    """Upload the topology's wheelhouse, skipping files already there with the same sha256."""
    if not ctx.topo.python.wheelhouse:
        yield Noop("no python.wheelhouse: packages come from the index")
        return
    if not (ctx.runs_pdctl or ctx.vllm) or ctx.venv is None:
        yield Noop("nothing to install on this node")
        return
    there = ctx.facts.get(FileHashes(ctx.remote_wheelhouse))
    missing = [f for f in ctx.wheelhouse if there.get(f.name) != local_hash(f)]
    if not missing:
        yield Noop(f"{len(ctx.wheelhouse)} wheels already in {ctx.remote_wheelhouse}")
        return
    for file in missing:
        yield Put(file, f"{ctx.remote_wheelhouse}/{file.name}", f"upload {file.name}")
    ctx.facts.forget(FileHashes(ctx.remote_wheelhouse))


def requirements(ctx: Context) -> list[Requirement]:
    py = ctx.topo.python
    wanted = [f"vllm=={py.vllm_version}", f"nixl=={py.nixl_version}"] if ctx.vllm else []
    try:
        return [Requirement(r) for r in [*wanted, *py.packages]]
    except InvalidRequirement as exc:
        from pdctl.errors import Problem

        raise TopologyError([Problem("topology", None, "python.packages", str(exc), "use pip syntax")]) from None


def satisfied(req: Requirement, state: Venv) -> bool:
    """The venv has `req`'s package at a version its specifier allows."""
    have = state.version(req.name)
    return have is not None and req.specifier.contains(have, prereleases=True)


def unmet(ctx: Context, reqs: list[Requirement]) -> list[Requirement]:
    state = ctx.facts.get(venv_state(ctx, tuple(r.name for r in reqs)))
    return [req for req in reqs if not satisfied(req, state)]


def packages(ctx: Context) -> Operation:
    """Install vLLM and NIXL at their pins (vLLM nodes) and `python.packages`, when any is missing or off."""
    reqs = requirements(ctx)
    if not reqs or not (ctx.runs_pdctl or ctx.vllm):
        yield Noop("no packages to install here")
        return
    bad = unmet(ctx, reqs)
    if not bad:
        yield Noop(", ".join(str(r) for r in reqs) + " installed")
        return
    if ctx.venv is None:
        raise PdctlError(
            f"{ctx.node.name}: {', '.join(map(str, bad))} missing from the CLI's interpreter ({ctx.python})",
            hint="install them there, or set python.venv so pdctl makes a venv with them",
        )
    wanted = ", ".join(map(str, bad))
    if ctx.topo.python.no_deps:
        wheels = [f.name for f in ctx.wheelhouse if f.name.endswith(".whl") and not f.name.startswith("pdctl-")]
        files = " ".join(path(f"{ctx.remote_wheelhouse}/{w}") for w in wheels)
        step = Run(
            pip_install(ctx, f"--no-deps {files}"),
            f"pip install --no-deps the {len(wheels)} wheels of python.wheelhouse (for {wanted})",
            timeout=3600,
            check=False,
        )
    else:
        args = " ".join(shlex.quote(str(r)) for r in bad)
        step = Run(pip_install(ctx, args), f"pip install {' '.join(map(str, bad))}", timeout=3600, check=False)
    result = yield step
    if result is not None and not result.ok:
        raise _pip_failed(ctx, step, result)
    ctx.facts.forget(venv_state(ctx, tuple(r.name for r in reqs)))
    still = unmet(ctx, reqs)
    if still:
        raise PdctlError(
            f"{ctx.node.name}: after installing, {', '.join(map(str, still))} is still not satisfied",
            hint="add wheels at those versions to python.wheelhouse"
            if ctx.topo.python.no_deps
            else "another version may be pinned by a dependency; check `pip check` in the venv",
        )


def _pip_failed(ctx: Context, step: Run, result: CommandResult) -> RemoteCommandError:
    output = result.stderr + result.stdout
    tail = "\n".join((result.stderr or result.stdout).splitlines()[-15:])
    unresolved = ("ResolutionImpossible", "conflicting dependencies", "No matching distribution", "No solution found")
    if ctx.topo.python.wheelhouse and not ctx.topo.python.no_deps and any(s in output for s in unresolved):
        hint = (
            "a wheel is missing from python.wheelhouse, or the wheels' own pins conflict; for a set known to "
            "work together, set python.no_deps: true to install every wheel in it as it is"
        )
    else:
        hint = "read pip's message above; fix python.packages or the wheelhouse and rerun"
    return RemoteCommandError(ctx.node.name, step.describe, result.exit_code, tail, hint)
