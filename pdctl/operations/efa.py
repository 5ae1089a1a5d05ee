"""EFA: install the pinned installer when the host's is missing or older, reboot when the module is stale,
and check that libfabric sees every device through the `efa` provider (reference: efa-provisioning.md 1.1-1.6).
"""

from __future__ import annotations

import shlex
from collections.abc import Generator
from pathlib import Path

from pdctl.errors import PdctlError
from pdctl.facts.efa import EfaModule, FiInfo, InstallerVersion, PeerMem
from pdctl.facts.host import BootId
from pdctl.operations.base import Context, Noop, Operation, Put, Reboot, Run, Step
from pdctl.remote.base import CommandResult
from pdctl.remote.shell import expand_home

URL = "https://efa-installer.amazonaws.com/aws-efa-installer-{version}.tar.gz"
INSTALL = "./efa_installer.sh -y --mpi=openmpi5"
REBOOT_BANNER = "Please reboot"


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def outdated(installed: str | None, want: str | None) -> bool:
    """The installer must run: EFA is missing, or older than the pinned `want`."""
    return installed is None or bool(want and version_tuple(installed) < version_tuple(want))


def devices_ok(ctx: Context, providers: list[str], devices: int) -> bool:
    """libfabric sees at least `efa.devices` devices through the `efa` provider."""
    return "efa" in providers and devices >= ctx.topo.efa.devices


def installer(ctx: Context) -> Operation:
    """Install EFA when the installed version is missing or older than `efa.installer_version`."""
    efa = ctx.topo.efa
    if not efa.required:
        yield Noop("efa.required is false")
        return
    if not ctx.vllm:
        yield Noop("no vLLM engine on this node")
        return
    installed = ctx.facts.get(InstallerVersion())
    want = efa.installer_version
    changed = False
    reboot = False
    if outdated(installed, want):
        _can_install(ctx, installed)
        assert want is not None
        result = yield from _install(ctx, want)
        ctx.facts.forget(InstallerVersion(), EfaModule(), FiInfo(), PeerMem())
        installed = ctx.facts.get(InstallerVersion())
        if installed is None or version_tuple(installed) < version_tuple(want):
            raise PdctlError(
                f"{ctx.node.name}: the EFA installer ran but /opt/amazon/efa_installed_packages says {installed}",
                hint="read the installer's output above; run it by hand on the node to see why",
            )
        reboot = REBOOT_BANNER in (result.stdout + result.stderr if result else "")
        changed = True
    module = ctx.facts.get(EfaModule())
    if reboot or module.reboot_pending:
        yield from _reboot(ctx, installed or "?", module.installed, module.loaded)
        changed = True
    fabric = ctx.facts.get(FiInfo())
    _check_devices(ctx, fabric.providers, fabric.devices, fabric.error)
    if not changed:
        yield Noop(f"EFA {installed} installed, module {module.loaded}, {fabric.devices} devices via efa")


def _can_install(ctx: Context, installed: str | None) -> None:
    efa = ctx.topo.efa
    found = f"EFA {installed} is installed" if installed else "EFA is not installed"
    if not efa.installer_version:
        raise PdctlError(
            f"{ctx.node.name}: {found} and efa.installer_version is not set",
            hint="set efa.installer_version and efa.sha256 so pdctl can install it, or use an AMI that has EFA",
        )
    if not efa.sha256:
        raise PdctlError(
            f"{ctx.node.name}: {found}; pdctl installs EFA {efa.installer_version} only from a tarball it can "
            "verify, and efa.sha256 is null",
            hint=f"set efa.sha256 to the sha256 of aws-efa-installer-{efa.installer_version}.tar.gz",
        )


def _install(ctx: Context, version: str) -> Generator[Step, CommandResult | None, CommandResult | None]:
    efa = ctx.topo.efa
    work = f"{ctx.work_dir}/efa"
    tarball = f"aws-efa-installer-{version}.tar.gz"
    source = efa.installer or URL.format(version=version)
    qwork = expand_home(work)
    qtar = shlex.quote(tarball)
    if "://" in source:
        yield Run(
            f"mkdir -p {qwork} && curl -fsSL -o {qwork}/{qtar} {shlex.quote(source)}",
            f"download {source}",
            timeout=900,
        )
    else:
        yield Put(Path(source).expanduser(), f"{work}/{tarball}", f"upload {Path(source).name}")
    check = yield Run(
        f"cd {qwork} && echo {shlex.quote(f'{efa.sha256}  {tarball}')} | sha256sum -c - && "
        f"rm -rf aws-efa-installer && tar -xzf {qtar}",
        f"verify sha256 {str(efa.sha256)[:12]}… and unpack",
        check=False,
    )
    if check is not None and not check.ok:
        raise PdctlError(
            f"{ctx.node.name}: {tarball} does not match efa.sha256 ({efa.sha256}) or does not unpack:\n"
            + (check.stdout + check.stderr).strip()[-800:],
            hint="check efa.sha256 against the published checksum; never run an unverified installer",
        )
    result = yield Run(
        f"cd {qwork}/aws-efa-installer && {INSTALL}", f"run efa_installer.sh {version}", admin=True, timeout=3600
    )
    return result


def _reboot(ctx: Context, version: str, installed: str | None, loaded: str | None) -> Operation:
    why = (
        f"EFA {version} installed module {installed} but the kernel runs {loaded or 'none'}"
        if installed != loaded
        else f"the EFA {version} installer asked for a reboot"
    )
    if not ctx.allow_reboot:
        raise PdctlError(
            f"{ctx.node.name}: {why}; the node must reboot to load it",
            hint="rerun with --allow-reboot to let pdctl reboot it and wait for SSH, or reboot it yourself",
        )
    yield Reboot(f"reboot: {why}")
    ctx.facts.forget(EfaModule(), FiInfo(), PeerMem(), BootId())
    module = ctx.facts.get(EfaModule())
    if module.reboot_pending:
        raise PdctlError(
            f"{ctx.node.name}: after a reboot the kernel still runs efa {module.loaded}, not {module.installed}",
            hint="check `dkms status` and `modinfo efa` on the node; the kmod may not have built for this kernel",
        )


def _check_devices(ctx: Context, providers: list[str], devices: int, error: str | None) -> None:
    want = ctx.topo.efa.devices
    if devices_ok(ctx, providers, devices):
        return
    seen = f"{devices}/{want} EFA devices" + (f" ({error})" if error else "")
    raise PdctlError(
        f"{ctx.node.name}: libfabric sees {seen} through provider efa",
        hint="EFA interfaces must be attached at launch (p5en: 16 efa/efa-only ENIs); check "
        "`/opt/amazon/efa/bin/fi_info -p efa -t FI_EP_RDM` on the node, or set efa.required: false for TCP",
    )
