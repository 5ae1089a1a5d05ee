"""Facts about EFA: the installer's record, the kernel module, libfabric's view of the devices, peer memory.

Paths and output formats are those of the reference (efa-provisioning.md, sections 1.1 and 1.6). All system
paths go through the host layout's `root`, so a test host can keep its own `/opt/amazon` and `/sys`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pdctl.facts.base import Fact, HostLayout

INSTALLED_PACKAGES = "/opt/amazon/efa_installed_packages"
FI_INFO = "/opt/amazon/efa/bin/fi_info"
_INSTALLER = re.compile(r"# EFA installer version: (\d+\.\d+\.\d+)")


class InstallerVersion(Fact[str | None]):
    """The EFA installer version recorded in `/opt/amazon/efa_installed_packages`; None when not installed."""

    name = "efa.InstallerVersion"
    result = str | None

    def command(self, layout: HostLayout) -> str:
        return f"head -3 {layout.sys(INSTALLED_PACKAGES)} 2>/dev/null || true"

    def process(self, lines: list[str]) -> str | None:
        for line in lines:
            match = _INSTALLER.match(line.strip())
            if match:
                return match.group(1)
        return None

    def default(self) -> str | None:
        return None


@dataclass(frozen=True)
class Module:
    installed: str | None
    loaded: str | None

    @property
    def reboot_pending(self) -> bool:
        """An installed module that differs from the running one only takes effect after a reboot."""
        return self.installed is not None and self.installed != self.loaded


class EfaModule(Fact[Module]):
    """The `efa` kernel module: the version on disk (`modinfo efa`) and the loaded one (`/sys/module/efa`)."""

    name = "efa.EfaModule"
    result = Module

    def command(self, layout: HostLayout) -> str:
        return (
            "modinfo efa 2>/dev/null | grep -E '^(description|version):'; "
            f'echo "loaded: $(cat {layout.sys("/sys/module/efa/version")} 2>/dev/null)"'
        )

    def process(self, lines: list[str]) -> Module:
        fields: dict[str, str] = {}
        for line in lines:
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        is_efa = fields.get("description", "").startswith("Elastic Fabric Adapter")
        return Module(fields.get("version") or None if is_efa else None, fields.get("loaded") or None)

    def default(self) -> Module:
        return Module(None, None)


@dataclass(frozen=True)
class Fabric:
    providers: list[str]
    domains: list[str]
    error: str | None = None

    @property
    def devices(self) -> int:
        return len(self.domains)


class FiInfo(Fact[Fabric]):
    """`fi_info -p efa -t FI_EP_RDM`: the providers and the unique RDM domains (one per EFA device)."""

    name = "efa.FiInfo"
    result = Fabric

    def command(self, layout: HostLayout) -> str:
        fi = layout.sys(FI_INFO)
        return (
            f"if [ -x {fi} ]; then fi={fi}; elif command -v fi_info >/dev/null 2>&1; then fi=fi_info; "
            'else echo "fi_info: not found"; exit 0; fi; "$fi" -p efa -t FI_EP_RDM'
        )

    def process(self, lines: list[str]) -> Fabric:
        providers: list[str] = []
        domains: list[str] = []
        errors: list[str] = []
        for line in lines:
            key, sep, value = line.strip().partition(":")
            if key == "provider" and sep:
                if value.strip() not in providers:
                    providers.append(value.strip())
            elif key == "domain" and sep:
                if value.strip() not in domains:
                    domains.append(value.strip())
            elif key in ("fi_getinfo", "fi_info") and sep:
                errors.append(line.strip())
        return Fabric(providers, domains, "; ".join(errors) or None)

    def default(self) -> Fabric:
        return Fabric([], [], "fi_info: not found")


class PeerMem(Fact[str | None]):
    """The loaded `efa_nv_peermem` module's version (GPUDirect RDMA on EFA); None when not loaded."""

    name = "efa.PeerMem"
    result = str | None

    def command(self, layout: HostLayout) -> str:
        mod = layout.sys("/sys/module/efa_nv_peermem")
        return f"if [ -d {mod} ]; then echo \"loaded $(cat {mod}/version 2>/dev/null || echo unknown)\"; fi"

    def process(self, lines: list[str]) -> str | None:
        for line in lines:
            if line.startswith("loaded "):
                return line.split(" ", 1)[1].strip() or "unknown"
        return None

    def default(self) -> str | None:
        return None
