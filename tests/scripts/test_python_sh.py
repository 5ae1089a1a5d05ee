"""The README's two commands set up from a fresh clone on the distribution's own Python (PEP 668, externally
managed), as root with the checkout's .venv and as a normal user inside a venv of their own.

Both scripts start with the same set-up, `scripts/lib/python.sh: pdctl_python`; that is what runs here, followed
by starting the installed pdctl. Installs are offline, from the `wheelhouse` fixture (tests/conftest.py): no
index, no pip config, so the test needs no network and takes the suite's own versions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import offline_pip_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START = 'pdctl --version && pdctl validate -t configs/local-sim.yaml && python -c "import pdctl; print(pdctl.__file__)"'


def _system_python() -> tuple[Path, Path]:
    """Debian's python3 and its EXTERNALLY-MANAGED marker; skip where this machine has none."""
    if not SYSTEM_PYTHON.exists() or not (ROOT / ".git").exists():
        pytest.skip("needs /usr/bin/python3 and a git checkout")
    stdlib = subprocess.run([SYSTEM_PYTHON, "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    marker = Path(stdlib) / "EXTERNALLY-MANAGED"
    if not marker.exists():
        pytest.skip(f"{SYSTEM_PYTHON} is not externally managed here (no {marker})")
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if version != str(sys.version_info[:2]):
        pytest.skip(f"the offline wheelhouse is for Python {sys.version_info[:2]}, {SYSTEM_PYTHON} is {version}")
    return SYSTEM_PYTHON, marker


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory under /tmp that another user can enter (pytest's tmp_path is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="pdctl-clone-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _clone(dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    return dest


def _bash(script: str, env: dict[str, str], *args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", user, "--"] if user else []
    argv = [*prefix, "env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "-euc", script, "_", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_plain_pip_into_the_system_python_is_refused(wheelhouse: Path) -> None:
    python, marker = _system_python()
    assert marker.exists()
    result = subprocess.run([python, "-m", "pip", "install", "pyyaml"], capture_output=True, text=True,
                            env={"PATH": BASE_PATH, **offline_pip_env(wheelhouse)})
    assert result.returncode != 0
    assert "externally-managed-environment" in result.stderr


def test_root_on_the_system_python_gets_the_checkout_venv(wheelhouse: Path, place: Path) -> None:
    python, _ = _system_python()
    clone = _clone(place / "pdctl")
    env = {"PATH": BASE_PATH, "HOME": str(place), **offline_pip_env(wheelhouse)}
    result = _bash(f'cd "$1" && . scripts/lib/python.sh && pdctl_python "$PWD" && {START}', env, str(clone))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"creating {clone}/.venv (from {python})" in result.stderr
    assert f"installing pdctl into {clone}/.venv" in result.stderr
    assert "ok local-sim: 1 prefill, 1 decode, engine sim, 1 node(s)" in result.stdout
    assert f"{clone}/pdctl/__init__.py" in result.stdout
    assert "home = /usr/bin" in (clone / ".venv" / "pyvenv.cfg").read_text()
    assert subprocess.run([python, "-c", "import pdctl"], capture_output=True, cwd="/").returncode != 0
    # git ignores the venv: the clone stays clean
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == ""


def test_a_normal_user_inside_their_own_venv(wheelhouse: Path, place: Path) -> None:
    python, _ = _system_python()
    clone = _clone(place / "pdctl")
    venv, home = place / "venv", place / "home"
    home.mkdir()
    user = None
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("root without runuser cannot act as a normal user")
        user = "nobody"
        subprocess.run(["chown", "-R", "nobody", str(clone), str(home), str(place)], check=True)
    env = {"PATH": BASE_PATH, "HOME": str(home), **offline_pip_env(wheelhouse)}
    script = (f'{python} -m venv "$2" && . "$2/bin/activate" && cd "$1" && . scripts/lib/python.sh && '
              f'pdctl_python "$PWD" && id -un && {START}')
    result = _bash(script, env, str(clone), str(venv), user=user)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"installing pdctl into {venv}" in result.stderr
    assert "creating" not in result.stderr and not (clone / ".venv").exists()
    lines = result.stdout.splitlines()
    assert lines[0] == (user or lines[0])
    assert "ok local-sim: 1 prefill, 1 decode, engine sim, 1 node(s)" in lines
    assert f"{clone}/pdctl/__init__.py" in lines
    assert (venv / "bin" / "pdctl").exists()
