"""Detached processes on a host, as shell scripts any transport can run: start, find by marker, stop.

Scripts are POSIX sh using builtins where they loop (hosts may have thousands of processes). A process belongs to
a deployment when its environment carries `PDCTL_DEPLOYMENT=<name>`; `PDCTL_NODE` narrows that to one node,
because test hosts (and some real setups) share one PID space between "hosts".
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from pdctl.markers import MARKER, NODE_VAR, PROCESS_VAR
from pdctl.remote.shell import expand_home
from pdctl.secret import EnvValue, reveal, shown

SYSTEMD_DIR = "/run/systemd/system"


@dataclass(frozen=True)
class DetachedJob:
    """What to start: argv in workdir with env, stdout/stderr appended to log_path."""

    unit: str
    argv: tuple[str, ...]
    env: Mapping[str, EnvValue]
    workdir: str
    log_path: str
    secret_env: Mapping[str, str] = field(default_factory=dict)
    """name -> file on the host: exported from the file's content just before exec, never in argv or a unit."""


@dataclass(frozen=True)
class Started:
    pid: int
    unit: str | None = None


@dataclass(frozen=True)
class HostProcess:
    """One live process on a host, as /proc shows it."""

    pid: int
    pgid: int
    state: str
    process: str = ""
    node: str = ""


def unit_name(deployment: str, process: str) -> str:
    return f"pdctl-{deployment}-{process}"


def start_script(job: DetachedJob, *, masked: bool = False) -> str:
    """Start `job` as a transient systemd unit where systemd is PID 1, else in its own session via setsid.

    Prints `pid <n>` or `unit <name> <main pid>`. `masked`: the script as shown to people, secrets as `***`.
    """
    argv = " ".join(expand_home(a) for a in with_secrets(job))
    env = {k: shown(v) if masked else reveal(v) for k, v in job.env.items()}
    env_args = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    return "\n".join(
        [
            f"LOG={expand_home(job.log_path)}; WD={expand_home(job.workdir)}",
            'mkdir -p "$WD" "$(dirname "$LOG")" || exit 3',
            'cd "$WD" || exit 3',
            'echo "=== pdctl: starting at $(date -u +%FT%TZ) ===" >> "$LOG" || exit 3',
            f"if [ -d {SYSTEMD_DIR} ] && command -v systemd-run >/dev/null 2>&1; then",
            systemd_script(job.unit, env, argv),
            "else",
            '  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true',  # a login shell's 1024 fds is too few for a server
            # `--`: a key can never become an option of env (`-S ...` would run a command)
            f"  env -- {env_args} setsid {argv} >> \"$LOG\" 2>&1 < /dev/null &",
            '  echo "pid $!"',
            "fi",
        ]
    )


def with_secrets(job: DetachedJob) -> tuple[str, ...]:
    """argv behind a tiny `sh` that exports each secret from its file and execs the process."""
    if not job.secret_env:
        return job.argv
    reads = "; ".join(f'{k}="$(cat {expand_home(p)})" || exit 5; export {k}' for k, p in job.secret_env.items())
    return ("sh", "-c", f'{reads}; exec "$@"', "pdctl-secret-env", *job.argv)


def systemd_script(unit: str, env: Mapping[str, str], argv: str) -> str:
    """The systemd branch of `start_script`: memlock unlimited (EFA registers GPU memory), a large open-file
    limit (the router and engines hold one fd per client connection), runs as the user."""
    setenv = " ".join(shlex.quote(f"--setenv={k}={v}") for k, v in env.items())
    unit = shlex.quote(unit)
    return "\n".join(
        [
            '  S=""; [ "$(id -u)" = 0 ] || S="sudo -n"',
            f"  $S systemctl reset-failed {unit} >/dev/null 2>&1",
            f"  $S systemd-run --unit {unit} --collect --quiet -p LimitMEMLOCK=infinity"
            " -p LimitNOFILE=1048576"
            ' -p User="$(id -un)" -p WorkingDirectory="$WD"'
            ' -p StandardOutput=append:"$LOG" -p StandardError=append:"$LOG"'
            f" {setenv} -- {argv} || exit 4",
            f'  echo "unit {unit} $($S systemctl show -p MainPID --value {unit})"',
        ]
    )


def parse_started(stdout: str) -> Started:
    words = stdout.split()
    if len(words) >= 2 and words[0] == "pid":
        return Started(pid=int(words[1]))
    if len(words) >= 3 and words[0] == "unit":
        return Started(pid=int(words[2]), unit=words[1])
    raise ValueError(f"unexpected output from the start script: {stdout.strip()!r}")


def marker_script(deployment: str) -> str:
    """Lines `<pid> <state> <pgid> PDCTL_NODE=.. PDCTL_PROCESS=..` for every process carrying the marker."""
    pattern = shlex.quote(f"{MARKER}={deployment}")
    return "\n".join(
        [
            f"for f in $(grep -lzx {pattern} /proc/[0-9]*/environ 2>/dev/null); do",
            '  d=${f%/environ}; read -r line < "$d/stat" 2>/dev/null || continue',
            '  rest=${line##*") "}; set -- $rest',  # stat's comm may hold spaces: cut after its ") "
            f"  tags=$(tr '\\0' '\\n' < \"$f\" 2>/dev/null | grep -E '^({NODE_VAR}|{PROCESS_VAR})=' | tr '\\n' ' ')",
            '  echo "${d#/proc/} $1 $3 $tags"',
            "done",
        ]
    )


def parse_ps(stdout: str) -> list[HostProcess]:
    procs = []
    for line in stdout.splitlines():
        words = line.split()
        if len(words) < 3 or not words[0].isdigit() or not words[2].lstrip("-").isdigit():
            continue
        tags = dict(w.split("=", 1) for w in words[3:] if "=" in w)
        procs.append(
            HostProcess(
                pid=int(words[0]),
                state=words[1],
                pgid=int(words[2]),
                node=tags.get(NODE_VAR, ""),
                process=tags.get(PROCESS_VAR, ""),
            )
        )
    # Zombies hold no memory or ports; where PID 1 does not reap them they would look alive forever.
    return [p for p in procs if p.state not in ("Z", "X")]


def kill_script(pids: list[int], pgids: list[int], signal: str) -> str:
    targets = [str(p) for p in pids] + [f"-{g}" for g in pgids if g > 1]
    return f"kill -{signal} {' '.join(targets)} 2>/dev/null; true" if targets else "true"


def systemd_stop_script(unit: str) -> str:
    return f'S=""; [ "$(id -u)" = 0 ] || S="sudo -n"; $S systemctl stop {shlex.quote(unit)} 2>/dev/null; true'
