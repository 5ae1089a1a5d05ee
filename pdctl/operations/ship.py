"""pdctl ships itself: the CLI's own pdctl, as a wheel, installed in the venv of every node that runs it.

The wheel is built from the running pdctl (its package files and installed metadata), byte for byte the same
for the same sources, so its sha256 identifies the code: a node whose recorded sha256 matches is skipped, and
an edited source tree ships again even when the version string did not change.
"""

from __future__ import annotations

import base64
import hashlib
import shlex
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pdctl
from pdctl.errors import PdctlError
from pdctl.facts.base import path
from pdctl.facts.python import SHIPPED_SHA
from pdctl.operations.base import Context, Noop, Operation, Put, Run
from pdctl.operations.python import pip_install, venv_state

EPOCH = (1980, 1, 1, 0, 0, 0)
TAG = "py3-none-any"


@dataclass(frozen=True)
class Wheel:
    path: Path
    version: str
    sha256: str


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _package_files(root: Path) -> list[Path]:
    return sorted(
        p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def _metadata_files(version: str, dist_info: str) -> dict[str, bytes]:
    try:
        dist = metadata.distribution("pdctl")
        meta = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
        entry_points = dist.read_text("entry_points.txt") or ""
    except metadata.PackageNotFoundError:
        meta, entry_points = "", ""
    if not meta:
        raise PdctlError(
            "cannot ship pdctl: it runs from a source tree that was never installed (no metadata)",
            hint="install it once with `pip install -e .` from the source tree",
        )
    wheel = f"Wheel-Version: 1.0\nGenerator: pdctl\nRoot-Is-Purelib: true\nTag: {TAG}\n"
    files = {f"{dist_info}/METADATA": meta.encode(), f"{dist_info}/WHEEL": wheel.encode()}
    if entry_points:
        files[f"{dist_info}/entry_points.txt"] = entry_points.encode()
    files[f"{dist_info}/top_level.txt"] = b"pdctl\n"
    return files


def build_wheel(dest: Path) -> Wheel:
    """Write `pdctl-<version>-py3-none-any.whl` of the running pdctl into `dest`; reproducible."""
    version = pdctl.__version__
    name = f"pdctl-{version}"
    dist_info = f"{name}.dist-info"
    package = Path(pdctl.__file__).parent
    files = {f"pdctl/{p.relative_to(package).as_posix()}": p.read_bytes() for p in _package_files(package)}
    files.update(_metadata_files(version, dist_info))
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items()) + f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"{name}-{TAG}.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files.items():
            info = zipfile.ZipInfo(arcname, EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return Wheel(out, version, hashlib.sha256(out.read_bytes()).hexdigest())


def ship(ctx: Context) -> Operation:
    """Install the CLI's pdctl wheel in the node's venv unless the same wheel is already there."""
    if ctx.venv is None:
        yield Noop("python.venv is null: nodes run the CLI's own pdctl")
        return
    if not (ctx.runs_pdctl or ctx.vllm):
        yield Noop("runs no pdctl process")
        return
    wheel: Wheel = ctx.wheel
    state = ctx.facts.get(venv_state(ctx))
    if state.shipped_sha256 == wheel.sha256 and state.version("pdctl") == wheel.version:
        yield Noop(f"pdctl {wheel.version} (wheel {wheel.sha256[:12]}) installed")
        return
    remote = f"{ctx.work_dir}/wheels/{wheel.path.name}"
    yield Put(wheel.path, remote, f"upload {wheel.path.name}")
    whl = path(remote)
    record = f"echo {wheel.sha256} > {path(ctx.venv)}/{SHIPPED_SHA}"
    # importing pdctl.cli proves the dependencies are there too; only when they are not does pip resolve them
    probe = f"{path(ctx.python)} -c {shlex.quote('import pdctl.cli, pdctl; print(pdctl.__version__)')}"
    yield Run(
        f"{pip_install(ctx, '--no-deps --force-reinstall ' + whl)} && "
        f"{{ {probe} >/dev/null 2>&1 || {pip_install(ctx, whl)}; }} && {record}",
        f"install pdctl {wheel.version} in {ctx.venv}",
        timeout=900,
    )
    ctx.facts.forget(venv_state(ctx))
    check = yield Run(probe, "check the node's pdctl version", check=False)
    got = check.stdout.strip().splitlines()[-1:] if check is not None else [wheel.version]
    if got != [wheel.version]:
        raise PdctlError(
            f"{ctx.node.name}: pdctl in {ctx.venv} reports {got[0] if got else 'nothing'}, "
            f"the CLI is {wheel.version}: " + (check.stderr.strip()[-300:] if check is not None else ""),
            hint="another pdctl shadows the venv's (a .pth or PYTHONPATH); check `python -c 'import pdctl'` there",
        )
