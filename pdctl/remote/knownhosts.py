"""known_hosts as OpenSSH writes it, markers included, read into paramiko's HostKeys.

paramiko's loader fails on the first `@cert-authority` or `@revoked` line. Here: `@revoked` keys are refused for
the hosts they name (and never trusted through a plain line); `@cert-authority` lines are noted, and a host
whose only trust is such a CA is refused with a clear message, as paramiko cannot verify host certificates.
Unparsable lines are skipped, as OpenSSH does.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey


@dataclass
class Markers:
    revoked: list[tuple[list[str], str]] = field(default_factory=list)
    """(host patterns, base64 key) of every `@revoked` line."""
    authorities: list[tuple[list[str], int]] = field(default_factory=list)
    """(host patterns, line number) of every `@cert-authority` line."""

    def revoked_for(self, host: str, key: paramiko.PKey) -> bool:
        return any(b64 == key.get_base64() and matches(host, pats) for pats, b64 in self.revoked)

    def authority_line(self, host: str) -> int | None:
        return next((line for pats, line in self.authorities if matches(host, pats)), None)


def load(keys: paramiko.HostKeys, path: Path) -> Markers:
    """Add `path`'s plain entries to `keys`; return its markers."""
    markers = Markers()
    plain: list[HostKeyEntry] = []
    for lineno, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            fields = line.split()
            if len(fields) >= 4 and fields[0] == "@revoked":
                markers.revoked.append((fields[1].split(","), fields[3]))
            elif len(fields) >= 4 and fields[0] == "@cert-authority":
                markers.authorities.append((fields[1].split(","), lineno))
            continue
        try:
            entry = HostKeyEntry.from_line(line, lineno)
        except (InvalidHostKey, paramiko.SSHException, ValueError):
            continue
        if entry is not None and entry.key is not None:
            plain.append(entry)
    revoked = {b64 for _, b64 in markers.revoked}
    for entry in plain:
        if entry.key.get_base64() in revoked:
            continue  # a revoked key is trusted by no line
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)
    return markers


def matches(host: str, patterns: list[str]) -> bool:
    """OpenSSH host pattern lists: `*`/`?` globs, `!` negation, hashed `|1|salt|hash` entries."""
    hit = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pat = pattern[1:] if negated else pattern
        hashed = pat.startswith("|1|")
        ok = paramiko.HostKeys.hash_host(host, pat) == pat if hashed else fnmatch.fnmatchcase(host, pat)
        if ok and negated:
            return False
        hit = hit or ok
    return hit
