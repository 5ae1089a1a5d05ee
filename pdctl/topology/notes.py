"""What a valid topology says that pdctl will not do as its writer may expect: said as notes, never errors.

    model.local_dir with engine: sim   the simulator reads no weights and has its own tokenizer, so the directory
                                       is ignored (and may not exist): say so, and where it does not exist here

Warnings, for what a valid topology makes `up` fail on later:

    python.wheelhouse missing or empty  `up` installs offline from it (`--no-index`): with no wheels there, every
                                        install fails on the nodes; say it at `validate`, `plan` and `up`
"""

from __future__ import annotations

from pathlib import Path

from pdctl.topology.model import Topology

WHEEL_SUFFIXES = (".whl", ".tar.gz", ".zip")
BUILD_WHEELHOUSE = "scripts/gpu/build-wheelhouse.sh"


def notes(topo: Topology) -> list[str]:
    """One line per thing to say; empty for most topologies."""
    said: list[str] = []
    local = topo.model.local_dir
    if topo.engine == "sim" and local:
        here = all(topo.node(inst.node).transport == "local" for _, _, inst in topo.instances())
        missing = f", and {local} does not exist" if here and not Path(local).expanduser().exists() else ""
        said.append(
            f"model.local_dir {local} is not used with engine: sim{missing}: the simulator reads no weights and "
            "has its own tokenizer (`pdctl tokenizer --out DIR` writes it); with engine: vllm, `up` needs "
            f"{local}/config.json on every engine node"
        )
    return said


def warnings(topo: Topology) -> list[str]:
    """One line per problem `up` would run into that the file's schema cannot see; empty for most topologies."""
    said: list[str] = []
    given = topo.python.wheelhouse
    if given:
        root = Path(given).expanduser()
        wanted = (f"vllm=={topo.python.vllm_version} and nixl=={topo.python.nixl_version}"
                  if topo.engine == "vllm" else "pdctl's dependencies")
        if not root.is_dir():
            what = "does not exist on this machine: `up` stops at provisioning"
        elif not any(p.is_file() and p.name.endswith(WHEEL_SUFFIXES) for p in root.iterdir()):
            what = (f"has no wheels: `up` would install {wanted} offline from it (pip --no-index), which fails on "
                    "every node")
        else:
            return said
        fill = (f"`{BUILD_WHEELHOUSE} {root.parent}` fills it" if root.name == "wheels" else
                f"`{BUILD_WHEELHOUSE} OUT` builds one in OUT/wheels, then set python.wheelhouse to it")
        said.append(f"python.wheelhouse {given} ({topo.file}) {what}. {fill} (docs/cluster-guide.md, section 3), "
                    "or remove python.wheelhouse to install from the package index")
    return said
