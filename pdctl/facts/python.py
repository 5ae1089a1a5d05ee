"""Facts about the node's Python environment: the venv, the versions inside it, NIXL's plugins, the vLLM patches."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import ClassVar

from pdctl.facts.base import Fact, HostLayout, path

SHIPPED_SHA = ".pdctl-wheel.sha256"
NO_VENV = "@@pdctl-no-venv"

# Runs inside the venv's interpreter; reads metadata only, so it is quick even where vLLM takes 20 s to import.
_PROBE = """
import glob, json, os, sys
from importlib import metadata, util
names = sys.argv[1:]
versions = {}
for n in names:
    try:
        versions[n] = metadata.version(n)
    except metadata.PackageNotFoundError:
        versions[n] = None
plugins = set()
for m in ("nixl_cu12", "nixl_cu13", "nixl"):
    try:
        spec = util.find_spec(m)
    except (ImportError, ValueError):
        spec = None
    if spec and spec.origin:
        d = os.path.dirname(spec.origin)
        for p in glob.glob(os.path.join(d, "..", "." + m + ".mesonpy.libs", "plugins", "libplugin_*.so")):
            plugins.add(os.path.basename(p)[len("libplugin_"):-len(".so")])
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "packages": versions,
                  "nixl_plugins": sorted(plugins)}))
"""


@dataclass(frozen=True)
class Venv:
    exists: bool
    python: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    nixl_plugins: list[str] = field(default_factory=list)
    shipped_sha256: str | None = None
    system_site_packages: bool | None = None  # pyvenv.cfg's include-system-site-packages; None: not said

    def version(self, name: str) -> str | None:
        return self.packages.get(_norm(name))


@dataclass(frozen=True)
class VenvState(Fact[Venv]):
    """Whether the venv exists, the versions of `names` inside it, NIXL plugins, and the shipped pdctl wheel."""

    venv: str
    names: tuple[str, ...] = ("vllm", "nixl", "torch", "pdctl")
    python: str | None = None
    name: ClassVar[str] = "python.VenvState"
    result: ClassVar[object] = Venv

    def command(self, layout: HostLayout) -> str:
        venv = path(self.venv.rstrip("/"))
        py = path(self.python) if self.python else f"{venv}/bin/python"
        names = " ".join(shlex.quote(_norm(n)) for n in self.names)
        return (
            f"if [ -x {py} ]; then "
            f"{py} -c {shlex.quote(_PROBE)} {names}; "
            f'echo "shipped: $(cat {venv}/{SHIPPED_SHA} 2>/dev/null)"; '
            f"echo \"system-site: $(sed -n 's/^include-system-site-packages *= *//p' {venv}/pyvenv.cfg 2>/dev/null)\"; "
            f"else echo {NO_VENV}; fi"
        )

    def process(self, lines: list[str]) -> Venv:
        if NO_VENV in lines:
            return Venv(exists=False)
        probe = next((line for line in lines if line.startswith("{")), None)
        shipped = next((line[len("shipped:") :].strip() for line in lines if line.startswith("shipped:")), "")
        site = next((line[len("system-site:") :].strip() for line in lines if line.startswith("system-site:")), "")
        system = {"true": True, "false": False}.get(site.lower())
        if probe is None:
            return Venv(exists=True, shipped_sha256=shipped or None, system_site_packages=system)
        data = json.loads(probe)
        return Venv(
            exists=True,
            python=data["python"],
            packages={_norm(k): v for k, v in data["packages"].items()},
            nixl_plugins=list(data["nixl_plugins"]),
            shipped_sha256=shipped or None,
            system_site_packages=system,
        )

    def default(self) -> Venv:
        return Venv(exists=False)


PATCH_STATES = ("native", "patched", "needs-patch", "unknown-layout")


@dataclass(frozen=True)
class VllmPatches:
    """Each of pdctl's vLLM patches (pdctl.vllm_compat): native, patched, needs-patch or unknown-layout."""

    streaming: str
    prefix_check: str

    @property
    def ready(self) -> bool:
        """Both in (or done by vLLM itself)."""
        return self.streaming in ("native", "patched") and self.prefix_check == "patched"


@dataclass(frozen=True)
class VllmCompat(Fact[VllmPatches | None]):
    """`python -m pdctl.vllm_compat status` in the venv: the state of each of pdctl's patches.

    None when it cannot say (pdctl or vLLM not installed there yet).
    """

    python: str
    name: ClassVar[str] = "python.VllmCompat"
    result: ClassVar[object] = VllmPatches | None

    def command(self, layout: HostLayout) -> str:
        return f"{path(self.python)} -m pdctl.vllm_compat status"

    def process(self, lines: list[str]) -> VllmPatches | None:
        for line in lines:
            word = line.split(" ", 1)[0]
            if word in PATCH_STATES:
                parts = dict(re.findall(r"(streaming|prefix-check): ([a-z-]+)", line))
                # An older pdctl prints the streaming patch's word alone; it has no prefix check to apply.
                return VllmPatches(parts.get("streaming", word), parts.get("prefix-check", "needs-patch"))
        return None

    def default(self) -> VllmPatches | None:
        return None


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@dataclass(frozen=True)
class FileHashes(Fact[dict[str, str]]):
    """sha256 of every file directly inside `directory` (empty when it does not exist)."""

    directory: str
    name: ClassVar[str] = "python.FileHashes"
    result: ClassVar[object] = dict[str, str]

    def command(self, layout: HostLayout) -> str:
        return f"cd {path(self.directory)} 2>/dev/null && find . -maxdepth 1 -type f -exec sha256sum {{}} + || true"

    def process(self, lines: list[str]) -> dict[str, str]:
        hashes: dict[str, str] = {}
        for line in lines:
            digest, sep, name = line.partition("  ")
            if sep and len(digest) == 64:
                hashes[name.removeprefix("./")] = digest
        return hashes

    def default(self) -> dict[str, str]:
        return {}
