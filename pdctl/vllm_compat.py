"""Make an installed vLLM older than 0.33.0 stream `kv_transfer_params`, as vLLM 0.33.0 does.

Without it a decode node's handle never reaches the router when the decode request streams, and every turn
of a conversation is a miss (shared reference: vllm-bidirectional.md, sections 3.4 and 4). The patch adds an
optional `kv_transfer_params` field to the streaming chunk models of `/v1/completions` and
`/v1/chat/completions`, and sets it from the engine output on the chunk that carries `finish_reason`.

Edits are lines inserted next to exact anchor lines of the installed files, kept per vLLM version in
`_EDITS`. A version without its own entry is tried against the known ones; a layout whose anchors are
missing is refused, never guessed. Run on a node, inside the venv that holds vLLM:

    python -m pdctl.vllm_compat status|apply [--site-packages DIR] [--version V]
"""

from __future__ import annotations

import argparse
import enum
import os
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

PATCHED_MARKER = "# pdctl-compat: kv_transfer_params on the final streaming chunk, as vLLM 0.33.0 does"
FIRST_NATIVE = (0, 33, 0)
BACKUP_SUFFIX = ".pdctl-orig"

Status = Literal["native", "patched", "needs-patch", "unknown-layout"]


@dataclass(frozen=True)
class Edit:
    """Insert `insert`, indented like `anchor`, next to `anchor` inside the block that `scope` opens."""

    path: str
    scope: str
    anchor: tuple[str, ...]
    insert: str
    before: bool = False

    def lines(self, indent: str) -> list[str]:
        body = [PATCHED_MARKER, *textwrap.dedent(self.insert).strip("\n").splitlines()]
        return [indent + line for line in body]


_FIELD = """
    kv_transfer_params: dict[str, Any] | None = Field(
        default=None, description="KVTransfer parameters."
    )
"""

_V0_26_0 = (
    Edit(
        path="vllm/entrypoints/openai/chat_completion/protocol.py",
        scope="class ChatCompletionStreamResponse(OpenAIBaseModel):",
        anchor=("    metrics: PerRequestTimingMetrics | None = None",),
        insert=_FIELD,
    ),
    Edit(
        path="vllm/entrypoints/openai/completion/protocol.py",
        scope="class CompletionStreamResponse(OpenAIBaseModel):",
        anchor=("    metrics: PerRequestTimingMetrics | None = None",),
        insert=_FIELD,
    ),
    Edit(
        path="vllm/entrypoints/openai/chat_completion/serving.py",
        scope="    async def chat_completion_stream_generator(",
        anchor=(
            "                    # Stamp the fingerprint on terminal chunks only (those with",
            "                    # finish_reason set). When ``include_usage`` is on, the",
        ),
        insert="""
            if finish_reason_sent[i]:
                chunk.kv_transfer_params = res.kv_transfer_params
        """,
        before=True,
    ),
    Edit(
        path="vllm/entrypoints/openai/completion/serving.py",
        scope="    async def completion_stream_generator(",
        anchor=(
            "                    # Stamp on terminal chunk only when no trailing usage chunk",
            "                    # will follow (that one is the true final message).",
        ),
        insert="""
            if finish_reason is not None:
                chunk.kv_transfer_params = res.kv_transfer_params
        """,
        before=True,
    ),
)

_EDITS: dict[tuple[int, int, int], tuple[Edit, ...]] = {(0, 26, 0): _V0_26_0}


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


def _candidates(version: tuple[int, int, int]) -> list[tuple[Edit, ...]]:
    if version in _EDITS:
        return [_EDITS[version]]
    return [_EDITS[key] for key in sorted(_EDITS, reverse=True)]


def _choose(site_packages: Path, version: str) -> list[tuple[Edit, _Found]]:
    """The first known edit set whose anchors all match, else the closest one with what is missing."""
    candidates = _candidates(parse_version(version))
    for edits in candidates:
        states = _states(site_packages, edits)
        if all(found.state is not _State.MISSING for _, found in states):
            return states
    return _states(site_packages, candidates[0])


def status(site_packages: Path, version: str) -> Status:
    """Whether vLLM `version` installed in `site_packages` streams `kv_transfer_params`, or can be made to."""
    if parse_version(version) >= FIRST_NATIVE:
        return "native"
    states = {found.state for _, found in _choose(site_packages, version)}
    if _State.MISSING in states:
        return "unknown-layout"
    return "needs-patch" if _State.PENDING in states else "patched"


def apply(site_packages: Path, version: str) -> list[Path]:
    """Patch the installed files in place and return those changed; a no-op when already patched.

    Raises ValueError naming the file and the missing anchor when the layout is not one pdctl knows.
    """
    if parse_version(version) >= FIRST_NATIVE:
        return []
    states = _choose(site_packages, version)
    for edit, found in states:
        if found.state is _State.MISSING:
            raise ValueError(
                f"cannot patch vLLM {version}: {site_packages / edit.path} has no line {found.missing!r}"
                f" inside {edit.scope.strip()!r}; this layout is unknown to pdctl (use vLLM >= 0.33.0,"
                " which streams kv_transfer_params natively)"
            )
    changed: list[Path] = []
    for rel in dict.fromkeys(edit.path for edit, _ in states):
        path = site_packages / rel
        original = path.read_text(encoding="utf-8")
        lines = original.split("\n")
        applied = [_apply_one(lines, edit) for edit, _ in states if edit.path == rel]
        if any(applied):
            _backup_once(path, original)
            _write_atomic(path, "\n".join(lines))
            changed.append(path)
    return changed


def _backup_once(path: Path, original: str) -> None:
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if not backup.exists():
        backup.write_text(original, encoding="utf-8")


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.pdctl-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, path.stat().st_mode & 0o7777)
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
        description="Report on or apply pdctl's streaming kv_transfer_params patch to an installed vLLM.",
    )
    parser.add_argument("command", choices=["status", "apply"])
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
        return _run(args.command, site, version)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(command: str, site: Path, version: str) -> int:
    if command == "status":
        result = status(site, version)
        print(f"{result} vllm {version} {site}")
        if result == "unknown-layout":
            print(
                f"error: vLLM {version} at {site} has a layout unknown to pdctl; run apply to see where",
                file=sys.stderr,
            )
        return 2 if result == "unknown-layout" else 0
    changed = apply(site, version)
    print(f"{status(site, version)} vllm {version} {site} ({len(changed)} files changed)")
    return 0


def _locate(site_packages: Path | None, version: str | None) -> tuple[Path, str]:
    if site_packages is not None and version is not None:
        return site_packages, version
    site, found = installed_vllm(site_packages)
    return site_packages or site, version or found


if __name__ == "__main__":
    raise SystemExit(main())
