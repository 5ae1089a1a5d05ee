"""scripts/gpu/build-wheelhouse.sh, the offline wheelhouse the cluster guide points at: its commands (dry run), its
refusals, and a real offline build from the `wheelhouse` fixture (no index, no network), split into parts that
scripts/gpu/unpack-parts.sh joins back."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import offline_pip_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/gpu/build-wheelhouse.sh"
VERIFIED = ROOT / "docs/gpu-run-wheels-vllm-0.26.0.txt"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


def test_help_says_what_it_downloads_and_what_to_do_next() -> None:
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Build an offline wheelhouse (python.wheelhouse)")
    assert "pdctl up -t pdctl.yaml --set python.wheelhouse=OUTDIR/wheels --dry-run" in done.stdout
    assert "--list FILE" in done.stdout and "--dry-run" in done.stdout


def test_dry_run_prints_the_pip_commands_for_pdctls_node_versions(tmp_path: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    done = _run("--dry-run", str(tmp_path / "wh"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"mkdir -p {tmp_path}/wh/wheels"
    pip = lines[1].split()
    assert pip[:4] == [sys.executable, "-m", "pip", "download"]
    assert pip[pip.index("--python-version"):][:2] == ["--python-version", "3.12"]
    assert "--platform" in pip and "--no-deps" not in pip
    for req in project["optional-dependencies"]["node"]:  # vllm==..., nixl==...
        assert req in pip
    assert "typer\\>=0.12" in pip  # the CLI's dependencies, quoted for the shell
    assert lines[-1] == "dry run: nothing downloaded"
    assert not (tmp_path / "wh").exists()


def test_dry_run_of_a_verified_list_in_parts(tmp_path: Path) -> None:
    done = _run("--dry-run", "--list", str(VERIFIED), "--parts", "62M", str(tmp_path / "wh"), "paramiko")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].endswith(f"--no-deps -r {VERIFIED}")
    assert "vllm==" not in lines[2] and lines[2].endswith(" paramiko")
    assert f"tar -C {tmp_path}/wh -cf - wheels | split -b 62M -d -a 2 - {tmp_path}/wh/parts/part" in lines


@pytest.mark.parametrize(("args", "said"), [
    (["--bogus", "x"], "build-wheelhouse.sh: unknown option --bogus"),
    ([], "build-wheelhouse.sh: OUTDIR is missing"),
    (["--list", "/nonexistent/list.txt", "out"], "build-wheelhouse.sh: --list /nonexistent/list.txt: no such file"),
])
def test_bad_arguments_are_refused(args: list[str], said: str) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [said, "see: scripts/gpu/build-wheelhouse.sh --help"]


@pytest.mark.slow
def test_an_offline_build_in_parts_unpacks_to_the_same_wheels(wheelhouse: Path, tmp_path: Path) -> None:
    """For this machine (--here), from the fixture's wheels as the only source: a pinned list without its
    dependencies plus pdctl's own dependencies with theirs, then split and joined back."""
    pins = tmp_path / "pins.txt"
    pins.write_text(f"# a verified set\nrich=={metadata.version('rich')}\n")
    out = tmp_path / "wh"
    done = _run("--here", "--list", str(pins), "--parts", "20M", str(out), env=offline_pip_env(wheelhouse))
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in (out / "wheels").iterdir())
    assert any(n.startswith(f"rich-{metadata.version('rich')}-") for n in names)
    assert any(n.startswith("typer-") for n in names) and any(n.startswith("pydantic_core-") for n in names)
    assert f"files in {out}/wheels" in done.stdout
    assert len(list((out / "parts").glob("part*"))) > 1 and (out / "parts/SHA256SUMS").exists()

    joined = subprocess.run([str(ROOT / "scripts/gpu/unpack-parts.sh"), str(out / "parts"), str(tmp_path / "back")],
                            capture_output=True, text=True, timeout=120)
    assert joined.returncode == 0, joined.stderr
    assert sorted(p.name for p in (tmp_path / "back/wheels").iterdir()) == names
