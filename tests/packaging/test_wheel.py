"""The wheel stands alone: built from a clean clone, installed into an empty venv far from any checkout, it can
write a topology, validate it and run the simulated demo (up -> OFF/ON bench -> down).

Build and install are offline, from the `wheelhouse` fixture (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import offline_pip_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv}\n{result.stdout}\n{result.stderr}"
    return result


def test_installed_wheel_inits_validates_and_runs_the_demo(wheelhouse: Path, tmp_path: Path) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to clone")
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path / "home"), **offline_pip_env(wheelhouse)}
    src = tmp_path / "src"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(src)], check=True)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)], base, tmp_path)
    (wheel,) = dist.glob("pdctl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"pdctl/configs/local-sim.yaml", "pdctl/configs/p5en-1p1d.yaml", "pdctl/py.typed",
            "pdctl/sim/data/vocab.txt", "pdctl/sim/data/vocab-NOTICE.txt"} <= set(names)
    assert not any(n.startswith(("configs/", "tests/")) for n in names)

    work = tmp_path / "elsewhere"
    work.mkdir()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], base, work)
    env = {**base, "PATH": f"{venv}/bin:{base['PATH']}", "VIRTUAL_ENV": str(venv), "PDCTL_HOME": str(tmp_path / "ph")}
    _run(["pip", "install", "-q", str(wheel)], env, work)
    where = _run(["python", "-c", "import pdctl; print(pdctl.__file__)"], env, work).stdout.strip()
    assert where.startswith(f"{venv}/lib/") and "site-packages" in where

    # The simulated model's tokenizer comes from the wheel alone, and a paragraph of English is known words.
    _run(["pdctl", "tokenizer", "--out", str(tmp_path / "tok")], env, work)
    from tokenizers import Tokenizer  # in the dev extra: the test's own venv, not the wheel's
    enc = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json")).encode("The wheel, alone, writes it.")
    assert len(enc.ids) == 5 and "<unk>" not in enc.tokens

    listed = _run(["pdctl", "init"], env, work).stdout
    assert "local-sim" in listed and "p5en-1p1d" in listed
    wrote = _run(["pdctl", "init", "--example", "local-sim"], env, work)
    assert wrote.stdout.splitlines()[0].startswith("wrote pdctl.yaml (local-sim: ")
    assert _run(["pdctl", "validate"], env, work).stdout.startswith("ok local-sim:")

    demo = _run(["pdctl", "demo", "--lengths", "2000", "--turns", "2", "--conversations", "1", "--out", "demo"],
                env, work, timeout=240)
    assert f"output in {work / 'demo'}" in demo.stderr
    assert "leg off: passed" in demo.stdout and "leg on: passed" in demo.stdout
    assert "simulated engines" in demo.stdout and "results are simulated" in demo.stdout
    legs = json.loads((work / "demo" / "bench" / "legs.json").read_text())
    assert legs["simulated"] is True and legs["passed"] is True
    assert [leg["name"] for leg in legs["legs"]] == ["off", "on"]
    assert (work / "demo" / "bench" / "report.md").exists()
    summary = json.loads((work / "demo" / "bench" / "summary.json").read_text())
    assert summary["axis"] == "length" and [leg["leg"] for leg in summary["legs"]] == ["off", "on"]
    assert [p["length"] for p in summary["legs"][0]["points"]] == [2000]
    # down ran: nothing of the demo deployment is left, and its state file is gone
    name = (work / "demo" / "topology.yaml").read_text().split("name: ", 1)[1].split()[0]
    assert _marked(f"PDCTL_DEPLOYMENT={name}") == []
    assert not (tmp_path / "ph" / "deployments" / f"{name}.json").exists()
    assert sorted(os.listdir(work)) == ["demo", "pdctl.yaml"]


def _marked(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found
