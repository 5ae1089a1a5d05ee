"""`provision()` end to end on this machine: real venvs, real offline installs from a wheelhouse built here,
pdctl's own wheel, the real vLLM patch on a fake vLLM 0.26.0 install, fake EFA/GPU tools. Each operation runs
once on a fresh host and is skipped on the second run."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console

import pdctl
from pdctl import prefix_check
from pdctl.errors import PdctlError
from pdctl.facts.base import HostLayout, gather
from pdctl.lifecycle.bringup.provision import HostReport, OpResult, contexts, provision, run_operation
from pdctl.operations import efa
from pdctl.operations.base import Facts
from pdctl.operations.ship import Wheel, build_wheel
from pdctl.operations.steps import StepRunner
from pdctl.plan import plan
from pdctl.topology import Topology
from pdctl.vllm_compat import PATCHED_MARKER, PREFIX_MARKER

from .support import HomeTransport, fake_vllm_wheel, host_root, installer_tarball, make_wheel, topology


def _console() -> Console:
    return Console(width=120, record=True, force_terminal=False, color_system=None)


def _ops(report: HostReport) -> dict[str, bool]:
    return {r.name: bool(r.changes) for r in report.results}


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    wh = tmp_path / "wheelhouse"
    make_wheel(wh, "pdctl-probe", "1.0", {"pdctl_probe/__init__.py": b"VALUE = 42\n"})
    return wh


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    """Built once: other engineers edit pdctl's sources while tests run, and an edited tree ships again."""
    return build_wheel(tmp_path_factory.mktemp("pdctl-wheel"))


def test_sim_topology_ships_pdctl_to_two_hosts_once(tmp_path: Path, wheelhouse: Path, wheel: Wheel) -> None:
    topo = topology(
        engine="sim",
        nodes=[{"name": "a", "transport": "local"}, {"name": "b", "transport": "local"}],
        decode=[{"node": "b", "port": 18200}],
        python={"venv": "~/venv", "packages": ["pdctl-probe==1.0"], "wheelhouse": str(wheelhouse),
                "system_site_packages": True},
    )
    roots = {n: host_root(tmp_path, n) for n in ("a", "b")}
    hosts = {n: HomeTransport(n, root / "home") for n, (root, _) in roots.items()}
    layouts = {n: layout for n, (_, layout) in roots.items()}

    first = provision(topo, plan(topo), hosts, _console(), layouts=layouts, wheel=wheel)
    for report in first:
        assert _ops(report) == {
            "efa.installer": False, "python.venv": True, "python.wheelhouse": True, "python.packages": True,
            "pdctl.ship": True, "vllm.compat": False, "model.download": False,
        }
    for name, (root, _) in roots.items():
        py = root / "home/venv/bin/python"
        out = subprocess.run(
            [str(py), "-c", "import pdctl, pdctl_probe; print(pdctl.__version__, pdctl_probe.VALUE, pdctl.__file__)"],
            capture_output=True, text=True, check=True, cwd=tmp_path,
        ).stdout.split()
        assert out[:2] == [pdctl.__version__, "42"], name
        assert out[2].startswith(str(root / "home/venv")), "the venv's own pdctl, not the CLI's"

    console = _console()
    start = time.monotonic()
    second = provision(topo, plan(topo), hosts, console, layouts=layouts, wheel=wheel)
    print(f"second provisioning of 2 sim hosts: {time.monotonic() - start:.2f} s")
    for report in second:
        assert not report.changed, report
        print(f"  {report.node}: {report.seconds:.2f} s")
    text = console.export_text()
    assert "a: no changes" in text and "b: no changes" in text


def test_vllm_efa_host_is_provisioned_once(tmp_path: Path, wheelhouse: Path, wheel: Wheel) -> None:
    fake_vllm_wheel(wheelhouse)
    make_wheel(wheelhouse, "nixl", "1.5.1", {"nixl/__init__.py": b""})
    tarball, sha = installer_tarball(tmp_path)
    topo = topology(
        efa={"required": True, "installer_version": "1.47.0", "sha256": sha, "installer": str(tarball)},
        python={"venv": "~/venv", "vllm_version": "0.26.0", "nixl_version": "1.5.1", "wheelhouse": str(wheelhouse),
                "system_site_packages": True},
    )
    root, layout = host_root(tmp_path, "a")
    hosts = {"a": HomeTransport("a", root / "home")}

    [first] = provision(topo, plan(topo), hosts, _console(), layouts={"a": layout}, wheel=wheel)
    assert _ops(first) == {
        "efa.installer": True, "python.venv": True, "python.wheelhouse": True, "python.packages": True,
        "pdctl.ship": True, "vllm.compat": True, "model.download": True,
    }
    site = next((root / "home/venv/lib").glob("python*/site-packages"))
    chat = site / "vllm/entrypoints/openai/chat_completion/serving.py"
    assert PATCHED_MARKER in chat.read_text()
    nixl = site / "vllm/distributed/kv_transfer/kv_connector/v1/nixl"
    assert (nixl / "pull_scheduler.py").read_text().count(PREFIX_MARKER) == 4
    assert (nixl / "pdctl_prefix_check.py").read_bytes() == Path(prefix_check.__file__).read_bytes()
    assert (root / "opt/amazon/efa_installed_packages").read_text().startswith("# EFA installer version: 1.47.0")
    assert (root / "home/hf/hub/models--Qwen--Qwen3-32B/refs/main").exists()

    [second] = provision(topo, plan(topo), hosts, _console(), layouts={"a": layout}, wheel=wheel)
    assert not second.changed
    assert {r.name: r.noop for r in second.results}["vllm.compat"] == (
        "vLLM 0.26.0 already carries pdctl's streaming patch and prefix check"
    )
    assert (root / "fake/installer-runs").read_text().count("1") == 1
    assert (root / "fake/hf-downloads").read_text().count("1") == 1


def _efa_only(tmp_path: Path, **efa: object) -> tuple[Topology, HomeTransport, HostLayout, Path]:
    tarball, sha = installer_tarball(tmp_path)
    topo = topology(
        efa={"required": True, "installer_version": "1.47.0", "sha256": sha, "installer": str(tarball), **efa},
        python={"venv": None},
        model={"id": "Qwen/Qwen3-32B", "local_dir": str(tmp_path / "model")},
    )
    (tmp_path / "model").mkdir()
    (tmp_path / "model/config.json").write_text("{}")
    root, layout = host_root(tmp_path, "a")
    return topo, HomeTransport("a", root / "home"), layout, root


def _run_efa(topo: Topology, transport: HomeTransport, layout: HostLayout, allow_reboot: bool = False) -> OpResult:
    """Only the EFA operation, executed for real on the host."""
    [ctx] = contexts(topo, plan(topo), {"a": layout}, allow_reboot=allow_reboot)
    ctx.facts = Facts(lambda facts: gather(transport, facts, layout))
    with StepRunner(_console()) as runner:
        return run_operation("efa.installer", efa.installer, ctx, transport, _console(), runner)


def test_efa_reboot_is_refused_without_allow_reboot_then_done_with_it(tmp_path: Path) -> None:
    topo, host, layout, root = _efa_only(tmp_path)
    (root / "sys/module/efa").mkdir(parents=True)
    (root / "sys/module/efa/version").write_text("2.17.3g\n")  # an older module is loaded and will not unload
    (root / "fake/rmmod-fails").touch()

    with pytest.raises(PdctlError) as refused:
        _run_efa(topo, host, layout)
    assert "a: EFA 1.47.0 installed module 3.0.0g but the kernel runs 2.17.3g" in refused.value.message
    assert "--allow-reboot" in refused.value.hint

    done = _run_efa(topo, host, layout, allow_reboot=True)
    assert done.changes == ["reboot: EFA 1.47.0 installed module 3.0.0g but the kernel runs 2.17.3g"]
    assert (root / "fake/reboots").exists()
    assert (root / "sys/module/efa/version").read_text().strip() == "3.0.0g"
    again = _run_efa(topo, host, layout)
    assert again.changes == []
    assert again.noop == "EFA 1.47.0 installed, module 3.0.0g, 16 devices via efa"


def test_no_efa_provider_stops_provisioning_with_the_fix(tmp_path: Path) -> None:
    topo, host, layout, root = _efa_only(tmp_path)
    (root / "fake/efa-devices").write_text("0\n")
    with pytest.raises(PdctlError) as failed:
        _run_efa(topo, host, layout)
    assert failed.value.message == (
        "a: libfabric sees 0/16 EFA devices (fi_getinfo: -61 (No data available)) through provider efa"
    )
    assert "efa.required: false" in failed.value.hint


def test_efa_with_fewer_devices_than_expected_fails(tmp_path: Path) -> None:
    topo, host, layout, root = _efa_only(tmp_path)
    (root / "fake/efa-devices").write_text("12\n")
    with pytest.raises(PdctlError, match="libfabric sees 12/16 EFA devices through provider efa"):
        _run_efa(topo, host, layout)


def test_wrong_installer_checksum_is_refused(tmp_path: Path) -> None:
    topo, host, layout, root = _efa_only(tmp_path, sha256="0" * 64)
    with pytest.raises(PdctlError, match=r"does not match efa\.sha256"):
        _run_efa(topo, host, layout)
    assert not (root / "fake/installer-runs").exists()
