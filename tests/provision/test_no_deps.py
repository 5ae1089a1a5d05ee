"""`python.no_deps`: a verified wheel set whose metadata pins conflict (vLLM 0.26.0 pins `fastapi<0.137.0`,
the set carries 0.165.0) cannot go through pip's resolver; with no_deps every wheel is installed as it is and
the pins are checked afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from pdctl.errors import RemoteCommandError, TopologyError
from pdctl.facts.base import gather
from pdctl.lifecycle.bringup.provision import HostReport, contexts, provision, run_operation
from pdctl.operations import python
from pdctl.operations.base import Facts
from pdctl.operations.ship import Wheel, build_wheel
from pdctl.operations.steps import StepRunner
from pdctl.plan import plan
from pdctl.topology import Topology, load

from .support import HomeTransport, fake_vllm_wheel, host_root, make_wheel, topology


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    return build_wheel(tmp_path_factory.mktemp("pdctl-wheel"))


def _console() -> Console:
    return Console(width=160, record=True, force_terminal=False, color_system=None)


def _conflicting_wheelhouse(wh: Path) -> None:
    fake_vllm_wheel(wh, requires=["fakeapi<0.137.0", "fake-tvm-ffi==0.1.10"])
    make_wheel(wh, "fakeapi", "0.165.0", {"fakeapi/__init__.py": b""})
    make_wheel(wh, "fake-tvm-ffi", "0.1.11", {"fake_tvm_ffi/__init__.py": b""})
    make_wheel(wh, "nixl", "1.5.1", {"nixl/__init__.py": b""})
    make_wheel(wh, "pdctl", "0.0.1", {"pdctl/__init__.py": b"__version__ = '0.0.1'\n"})  # never installed


def _topo(wh: Path, tmp_path: Path, no_deps: bool) -> Topology:
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model/config.json").write_text("{}")
    return topology(
        model={"id": "Qwen/Qwen3-32B", "local_dir": str(tmp_path / "model")},
        python={"venv": "~/venv", "vllm_version": "0.26.0", "nixl_version": "1.5.1", "wheelhouse": str(wh),
                "system_site_packages": True, "no_deps": no_deps},
    )


def _versions(python: Path, cwd: Path) -> dict[str, str]:
    code = (
        "import json; from importlib import metadata as m; "
        "print(json.dumps({n: m.version(n) for n in ('vllm', 'nixl', 'fakeapi', 'fake-tvm-ffi', 'pdctl')}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, cwd=cwd).stdout
    return dict(json.loads(out))


def _changes(report: HostReport) -> dict[str, list[str]]:
    return {r.name: r.changes for r in report.results if r.changes}


def test_verified_wheel_set_with_conflicting_pins_installs_with_no_deps(tmp_path: Path, wheel: Wheel) -> None:
    wh = tmp_path / "wheelhouse"
    _conflicting_wheelhouse(wh)
    root, layout = host_root(tmp_path, "a")
    hosts = {"a": HomeTransport("a", root / "home")}

    with pytest.raises(RemoteCommandError) as refused:
        conflicting = _topo(wh, tmp_path, no_deps=False)
        provision(conflicting, plan(conflicting), hosts, _console(), layouts={"a": layout}, wheel=wheel)
    assert "fakeapi<0.137.0" in refused.value.message, "pip's resolver refuses the set"
    assert "python.no_deps: true" in refused.value.hint

    topo = _topo(wh, tmp_path, no_deps=True)
    [first] = provision(topo, plan(topo), hosts, _console(), layouts={"a": layout}, wheel=wheel)
    assert _changes(first)["python.packages"] == [
        "pip install --no-deps the 4 wheels of python.wheelhouse (for vllm==0.26.0, nixl==1.5.1)"
    ]
    assert {"pdctl.ship", "vllm.compat"} <= set(_changes(first))
    versions = _versions(root / "home/venv/bin/python", tmp_path)
    assert versions == {"vllm": "0.26.0", "nixl": "1.5.1", "fakeapi": "0.165.0", "fake-tvm-ffi": "0.1.11",
                        "pdctl": wheel.version}

    console = _console()
    [second] = provision(topo, plan(topo), hosts, console, layouts={"a": layout}, wheel=wheel)
    assert not second.changed, second
    assert "a: no changes" in console.export_text()


def test_no_deps_without_a_wheelhouse_is_a_topology_error(tmp_path: Path) -> None:
    data = topology().model_dump(mode="json", exclude_defaults=True)
    data["python"] = {"venv": "~/venv", "no_deps": True}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(TopologyError) as info:
        load(tmp_path / "t.yaml")
    assert "no_deps installs the wheels of python.wheelhouse, which is not set" in str(info.value)


def test_existing_venv_without_system_site_packages_is_switched_on(tmp_path: Path) -> None:
    """The GPU host's torch lives in the system Python: a venv made earlier without the flag must see it."""
    root, layout = host_root(tmp_path, "a")
    venv = root / "home/venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    host = HomeTransport("a", root / "home")
    topo = topology(engine="sim", python={"venv": "~/venv", "system_site_packages": True})
    [ctx] = contexts(topo, plan(topo), {"a": layout})
    ctx.facts = Facts(lambda facts: gather(host, facts, layout))
    with StepRunner(_console()) as runner:
        done = run_operation("python.venv", python.venv, ctx, host, _console(), runner)
        assert done.changes == ["let venv ~/venv see the system site-packages"]
        again = run_operation("python.venv", python.venv, ctx, host, _console(), runner)
    assert again.changes == [] and again.noop is not None and again.noop.startswith("~/venv has Python 3.")
    cfg = (venv / "pyvenv.cfg").read_text()
    assert cfg.count("include-system-site-packages") == 1 and "include-system-site-packages = true" in cfg
    seen = subprocess.run([str(venv / "bin/python"), "-c", "import rich; print(rich.__file__)"],
                          capture_output=True, text=True, check=True, env={**os.environ, **layout.env}).stdout
    assert not seen.startswith(str(venv)), "rich comes from the system site-packages"
