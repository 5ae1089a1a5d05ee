"""pdctl's two patches to an installed vLLM: streaming `kv_transfer_params`, and the prefix check at the prefill.

`streaming` (vLLM older than 0.33.0, which does it natively): without it a decode node's handle never reaches the
router when the decode request streams, and every turn of a conversation is a miss (shared reference:
vllm-bidirectional.md, sections 3.4 and 4). It adds an optional `kv_transfer_params` field to the streaming chunk
models of `/v1/completions` and `/v1/chat/completions`, and sets it from the engine output on the chunk that
carries `finish_reason`.

`prefix-check` (every vLLM; none does it natively): the prefill verifies that a decode's tokens are the new
prompt's prefix before its scheduler counts a single remote token, so the router need not `/tokenize` the whole
conversation on the critical path (issue 18). It copies `pdctl/prefix_check.py` verbatim next to the NIXL
connector's pull scheduler, calls its `check` in `get_num_new_matched_tokens` when the router sent a digest
chain, and adds the check's report (`pdctl_reuse`) to the params `request_finished` returns.

Edits are lines inserted next to exact anchor lines of the installed files, kept per vLLM version. A version
without its own entry is tried against the known ones; a layout whose anchors are missing is refused, never
guessed. `status` prints the combined state first (patched only when both are in, each either patched or
native), then each patch's. Run on a node, inside the venv that holds vLLM:

    python -m pdctl.vllm_compat status|apply [--only streaming|prefix-check] [--site-packages DIR] [--version V]
"""

from __future__ import annotations

import argparse
import enum
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from pdctl.vllm_compat.edits import (
    _EDITS,
    BACKUP_SUFFIX,
    FIRST_NATIVE,
    PATCHES,
    PREFIX_CHECK,
    PREFIX_COPY,
    PREFIX_SOURCE,
    STREAMING,
    Edit,
)
from pdctl.vllm_compat.edits import NIXL as NIXL  # re-exported: the patch's names
from pdctl.vllm_compat.edits import PATCHED_MARKER as PATCHED_MARKER
from pdctl.vllm_compat.edits import PREFIX_MARKER as PREFIX_MARKER

Status = Literal["native", "patched", "needs-patch", "unknown-layout"]


class _State(enum.Enum):
    APPLIED = "applied"
    PENDING = "pending"
    MISSING = "missing"


@dataclass(frozen=True)
class _Found:
    state: _State
    at: int = -1
    missing: str = ""


def parse_version(version: str) -> tuple[int, int, int]:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version.strip())
    if match is None:
        raise ValueError(f"not a vLLM version: {version!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _scope_end(lines: list[str], start: int, indent: int) -> int:
    heads = ("def ", "async def ", "class ", "@")
    for j in range(start + 1, len(lines)):
        line = lines[j]
        stripped = line.lstrip()
        if stripped and len(line) - len(stripped) <= indent and stripped.startswith(heads):
            return j
    return len(lines)


def _find(lines: list[str], edit: Edit) -> _Found:
    start, end = -1, len(lines)
    if edit.scope:
        scopes = [i for i, line in enumerate(lines) if line == edit.scope]
        if len(scopes) != 1:
            return _Found(_State.MISSING, missing=edit.scope)
        start = scopes[0]
        end = _scope_end(lines, start, len(edit.scope) - len(edit.scope.lstrip()))
    n = len(edit.anchor)
    hits = [k for k in range(start + 1, end - n + 1) if tuple(lines[k : k + n]) == edit.anchor]
    if len(hits) != 1:
        return _Found(_State.MISSING, missing=edit.anchor[0])
    at = hits[0]
    block = edit.lines(_indent(edit.anchor[0]))
    here = lines[at - len(block) : at] if edit.before else lines[at + n : at + n + len(block)]
    return _Found(_State.APPLIED if here == block else _State.PENDING, at=at)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _apply_one(lines: list[str], edit: Edit) -> bool:
    found = _find(lines, edit)
    if found.state is not _State.PENDING:
        return False
    pos = found.at if edit.before else found.at + len(edit.anchor)
    lines[pos:pos] = edit.lines(_indent(edit.anchor[0]))
    return True


def _read_lines(path: Path) -> list[str] | None:
    try:
        return path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        return None


def _states(site_packages: Path, edits: Sequence[Edit]) -> list[tuple[Edit, _Found]]:
    result: list[tuple[Edit, _Found]] = []
    cache: dict[str, list[str] | None] = {}
    for edit in edits:
        if edit.path not in cache:
            cache[edit.path] = _read_lines(site_packages / edit.path)
        lines = cache[edit.path]
        if lines is None:
            result.append((edit, _Found(_State.MISSING, missing="(file not found)")))
        else:
            result.append((edit, _find(lines, edit)))
    return result


def _choose(site_packages: Path, patch: str, version: str) -> list[tuple[Edit, _Found]]:
    """The first known edit set of `patch` whose anchors all match, else the closest one with what is missing."""
    known = _EDITS[patch]
    key = parse_version(version)
    candidates = [known[key]] if key in known else [known[k] for k in sorted(known, reverse=True)]
    for edits in candidates:
        states = _states(site_packages, edits)
        if all(found.state is not _State.MISSING for _, found in states):
            return states
    return _states(site_packages, candidates[0])


def _native(patch: str, version: str) -> bool:
    return patch == STREAMING and parse_version(version) >= FIRST_NATIVE


def _copy_current(site_packages: Path) -> bool:
    target = site_packages / PREFIX_COPY
    return target.is_file() and target.read_bytes() == PREFIX_SOURCE.read_bytes()


def patch_status(site_packages: Path, version: str) -> dict[str, Status]:
    """Each patch's state in vLLM `version` installed in `site_packages`, by name (PATCHES)."""
    result: dict[str, Status] = {}
    for patch in PATCHES:
        if _native(patch, version):
            result[patch] = "native"
            continue
        states = {found.state for _, found in _choose(site_packages, patch, version)}
        if patch == PREFIX_CHECK and not _copy_current(site_packages):
            states.add(_State.PENDING)  # absent, or an older pdctl's copy
        if _State.MISSING in states:
            result[patch] = "unknown-layout"
        else:
            result[patch] = "needs-patch" if _State.PENDING in states else "patched"
    return result


def combined(states: Mapping[str, Status]) -> Status:
    """One word for all patches: the worst of them; patched when each is patched or native."""
    values = set(states.values())
    if "unknown-layout" in values:
        return "unknown-layout"
    if "needs-patch" in values:
        return "needs-patch"
    return "native" if values == {"native"} else "patched"


def status(site_packages: Path, version: str) -> Status:
    """Whether vLLM `version` installed in `site_packages` carries both patches (or does what they do)."""
    return combined(patch_status(site_packages, version))


_FIXES = {
    STREAMING: "use vLLM >= 0.33.0, which streams kv_transfer_params natively",
    PREFIX_CHECK: "set router.verify_at: router, or use vLLM 0.26.0",
}


def apply(site_packages: Path, version: str, only: Sequence[str] = PATCHES) -> list[Path]:
    """Apply the patches named in `only` in place and return the files changed; a no-op when already in.

    Raises ValueError naming the file and the missing anchor, before changing anything, when the layout of one
    of them is not one pdctl knows.
    """
    chosen = {patch: _choose(site_packages, patch, version) for patch in only if not _native(patch, version)}
    for patch, states in chosen.items():
        for edit, found in states:
            if found.state is _State.MISSING:
                where = repr(edit.scope.strip()) if edit.scope else "the module"
                raise ValueError(
                    f"cannot apply pdctl's {patch} patch to vLLM {version}: {site_packages / edit.path} has no"
                    f" line {found.missing!r} inside {where}; this layout is unknown to pdctl ({_FIXES[patch]})"
                )
    changed: list[Path] = []
    if PREFIX_CHECK in chosen and not _copy_current(site_packages):
        target = site_packages / PREFIX_COPY  # before the import of it goes in
        _write_atomic(target, PREFIX_SOURCE.read_text(encoding="utf-8"), target.with_name("pull_scheduler.py"))
        changed.append(target)
    states = [pair for pairs in chosen.values() for pair in pairs]
    for rel in dict.fromkeys(edit.path for edit, _ in states):
        path = site_packages / rel
        original = path.read_text(encoding="utf-8")
        lines = original.split("\n")
        applied = [_apply_one(lines, edit) for edit, _ in states if edit.path == rel]
        if any(applied):
            _backup_once(path, original)
            _write_atomic(path, "\n".join(lines), path)
            changed.append(path)
    return changed


def _backup_once(path: Path, original: str) -> None:
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if not backup.exists():
        backup.write_text(original, encoding="utf-8")


def _write_atomic(path: Path, text: str, mode_of: Path) -> None:
    tmp = path.with_name(f".{path.name}.pdctl-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, mode_of.stat().st_mode & 0o7777)
    os.replace(tmp, path)


def installed_vllm(site_packages: Path | None = None) -> tuple[Path, str]:
    """Where vLLM is installed and its version, read from its metadata without importing it."""
    if site_packages is None:
        dist = metadata.distribution("vllm")
    else:
        found = next(iter(metadata.distributions(name="vllm", path=[str(site_packages)])), None)
        if found is None:
            raise metadata.PackageNotFoundError("vllm")
        dist = found
    return Path(str(dist.locate_file(""))), dist.version


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pdctl.vllm_compat",
        description="Report on or apply pdctl's patches to an installed vLLM: streaming kv_transfer_params, and "
        "the prefix check at the prefill.",
    )
    parser.add_argument("command", choices=["status", "apply"])
    parser.add_argument("--only", action="append", choices=PATCHES, help="apply only this patch (repeatable)")
    parser.add_argument(
        "--site-packages", type=Path, help="directory holding vllm/ (default: the installed one)"
    )
    parser.add_argument("--version", help="vLLM version (default: read from the installed metadata)")
    args = parser.parse_args(argv)
    try:
        site, version = _locate(args.site_packages, args.version)
    except metadata.PackageNotFoundError:
        print("error: vllm is not installed here; pass --site-packages and --version", file=sys.stderr)
        return 2
    try:
        return _run(args.command, site, version, tuple(args.only or PATCHES))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _line(site: Path, version: str, states: Mapping[str, Status], tail: str = "") -> str:
    parts = ", ".join(f"{patch}: {state}" for patch, state in states.items())
    return f"{combined(states)} vllm {version} {site} ({parts}{tail})"


def _run(command: str, site: Path, version: str, only: Sequence[str]) -> int:
    if command == "status":
        states = patch_status(site, version)
        print(_line(site, version, states))
        unknown = [patch for patch, state in states.items() if state == "unknown-layout"]
        if unknown:
            print(
                f"error: vLLM {version} at {site} has a layout unknown to pdctl's {' and '.join(unknown)} patch"
                f"{'es' if len(unknown) > 1 else ''};"
                " run apply to see where",
                file=sys.stderr,
            )
        return 2 if unknown else 0
    changed = apply(site, version, only)
    print(_line(site, version, patch_status(site, version), f"; {len(changed)} files changed"))
    return 0


def _locate(site_packages: Path | None, version: str | None) -> tuple[Path, str]:
    if site_packages is not None and version is not None:
        return site_packages, version
    site, found = installed_vllm(site_packages)
    return site_packages or site, version or found

