"""An offline wheelhouse for the install tests: pdctl's dependencies (and the build backend), rebuilt as wheels
from the files this test interpreter already has installed.

Why rebuild instead of downloading: the tests install pdctl into fresh venvs with `--no-index --find-links`, so
they need no network and no index (pip's own cache cannot serve an install without the index), and they get the
exact versions the suite runs with. A wheel is a zip of the installed files plus the dist-info; pip regenerates
the console scripts from entry_points.txt, so files installed outside site-packages are left out.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SKIP_INFO = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
PIP_OFFLINE = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def closure(roots: list[str]) -> list[metadata.Distribution]:
    """The installed distributions `roots` need, their requirements followed (no extras), each once."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        dist = metadata.distribution(name)
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def rebuild(dist: metadata.Distribution, dest: Path) -> Path:
    files = [f for f in dist.files or [] if ".." not in f.parts and "__pycache__" not in f.parts]
    info = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    tags = [line.split(":", 1)[1].strip().split("-") for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]
    tag = "-".join(".".join(sorted({t[i] for t in tags})) for i in range(3))  # py2.py3-none-any
    wheel = dest / f"{info.removesuffix('.dist-info')}-{tag}.whl"
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for f in files:
            if f.parts[0] == info and f.name in SKIP_INFO:
                continue
            data = Path(str(dist.locate_file(f))).read_bytes()
            zf.writestr(str(f), data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{f},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def build_wheelhouse(dest: Path, roots: list[str]) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for dist in closure(roots):
        rebuild(dist, dest).chmod(0o644)
    return dest


def pdctl_requirements() -> list[str]:
    """pdctl's own dependencies (without extras) and its build backend, as pyproject.toml declares them."""
    reqs = [Requirement(t) for t in metadata.requires("pdctl") or []]
    return [r.name for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})] + ["setuptools", "wheel"]
