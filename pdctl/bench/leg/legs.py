"""Legs: named sets of topology overrides (`--leg NAME:key=value,key=value`), and the endpoints a leg measures.

The default A/B is OFF then ON on `connector.bidirectional_kv_xfer`; the first leg is the baseline of every ratio.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from pdctl.errors import UsageError
from pdctl.plan import ProcessSpec, entry, plan
from pdctl.topology import Topology, load

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\[\]*]*$")


@dataclass(frozen=True)
class LegSpec:
    name: str
    overrides: tuple[str, ...]


DEFAULT_LEGS = (
    LegSpec("off", ("connector.bidirectional_kv_xfer=false",)),
    LegSpec("on", ("connector.bidirectional_kv_xfer=true",)),
)


def parse_leg(text: str) -> LegSpec:
    """`NAME:key=value,key=value`; a comma inside a value (`gpus=[0,1]`) stays with its value."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not _NAME.match(name):
        raise UsageError(
            f"bad leg name in --leg {text!r}",
            hint="use --leg NAME:key=value,key=value, e.g. --leg b128:model.block_size=128",
        )
    overrides: list[str] = []
    for piece in rest.split(",") if sep and rest.strip() else []:
        key, eq, _ = piece.partition("=")
        if eq and _KEY.match(key.strip()):
            overrides.append(piece.strip())
        elif overrides:
            overrides[-1] += "," + piece
        else:
            raise UsageError(
                f"bad override {piece!r} in --leg {text!r}",
                hint="each override is a dotted topology key and a YAML value, "
                "e.g. connector.bidirectional_kv_xfer=true",
            )
    return LegSpec(name, tuple(overrides))


def parse_legs(texts: list[str] | None) -> list[LegSpec]:
    legs = [parse_leg(t) for t in texts] if texts else list(DEFAULT_LEGS)
    names = [leg.name for leg in legs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"leg names must be unique; repeated: {', '.join(dupes)}")
    return legs


def leg_topology(path: Path, base: list[str], leg: LegSpec) -> Topology:
    """The topology of one leg: the file, the command's --set overrides, then the leg's own (every one checked)."""
    return load(path, [*base, *leg.overrides])


def bidirectional(topo: Topology) -> bool:
    """On when the topology asks for it anywhere: such a leg must prove the reuse happens (the guards)."""
    if topo.mode == "aggregated":
        return False
    return topo.connector.bidirectional_kv_xfer or any(
        topo.connector_for(inst).bidirectional_kv_xfer for _, _, inst in topo.instances()
    )


@dataclass(frozen=True)
class Endpoints:
    """Where a leg's traffic goes and what it reads: the router, and each prefill's metrics URL and log."""

    router_url: str
    prefill_urls: tuple[str, ...]
    prefill_logs: tuple[tuple[str, str], ...]
    decode_urls: tuple[str, ...]
    model: str
    router_node: str = "local"
    decode_nodes: tuple[str, ...] = ()

    def health_targets(self) -> list[tuple[str, str]]:
        """(node, url) of the router and every engine."""
        prefill_nodes = [node for node, _ in self.prefill_logs]
        return [(self.router_node, self.router_url), *zip(prefill_nodes, self.prefill_urls, strict=True),
                *zip(self.decode_nodes, self.decode_urls, strict=True)]


def endpoints(topo: Topology, specs: list[ProcessSpec] | None = None) -> Endpoints:
    """The endpoints of `topo`, from `specs` when its plan is at hand (what `up` started), else from planning it."""
    specs = plan(topo) if specs is None else specs
    router = entry(specs)  # an aggregated topology has no router: the bench talks to its engine
    prefills = [s for s in specs if s.role == "prefill"]
    return Endpoints(
        router_url=router.url,
        prefill_urls=tuple(s.url for s in prefills),
        prefill_logs=tuple((s.node, s.log_path) for s in prefills),
        decode_urls=tuple(s.url for s in specs if s.role == "decode"),
        model=topo.model.name,
        router_node=router.node,
        decode_nodes=tuple(s.node for s in specs if s.role == "decode"),
    )
