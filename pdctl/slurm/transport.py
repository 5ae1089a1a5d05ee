"""A host of a Slurm job, reached through `srun` steps from the login node, behind the `Transport` interface.

A command is a short step (`srun --jobid J --overlap -N1 -n1 -w HOST --job-name pdctl-<deployment>-cmd`);
a detached process is a step whose `srun` runs on here in its own session after the CLI exits, so Slurm
accounts for it and cancels it with the job. Finding and stopping processes works as on any host (the
`PDCTL_DEPLOYMENT` marker inside the step); `down` also cancels the deployment's steps by name. HTTP and TCP
go straight from the login node, which reaches compute nodes on a Slurm cluster.
"""

from __future__ import annotations

import secrets
import shlex
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from pdctl.errors import ConnectError, RemoteCommandError
from pdctl.markers import NODE_VAR, PROCESS_VAR
from pdctl.remote.base import CommandResult, Progress, Transport
from pdctl.remote.procs import DetachedJob, Started, with_secrets
from pdctl.remote.shell import expand_home
from pdctl.secret import reveal
from pdctl.slurm.commands import srun_argv, step_name
from pdctl.state import pdctl_home

START_TIMEOUT_S = 60.0
# srun's own complaints (not the command's): the allocation is gone or the host is not part of it
_SRUN_FAILURES = ("Unable to confirm allocation", "Invalid job id", "not in the allocation",
                  "Requested node configuration is not available", "Job has expired", "Unable to create step")


class SlurmTransport(Transport):
    def __init__(self, name: str, jobid: int, host: str, deployment: str) -> None:
        super().__init__(name)
        self.jobid = jobid
        self.host = host
        self.deployment = deployment

    def _srun(self, what: str) -> list[str]:
        return srun_argv(self.jobid, self.host, step_name(self.deployment, what))

    def _run_script(self, script: str, *, sudo: bool, timeout: float | None, stdin: bytes) -> CommandResult:
        return self._step([*self._srun("cmd"), "sh", "-c", script], script, stdin, timeout)

    def _step(self, argv: list[str], shown: str, stdin: bytes | IO[bytes], timeout: float | None) -> CommandResult:
        start = time.monotonic()
        try:
            if isinstance(stdin, bytes):
                proc = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False)
            else:
                proc = subprocess.run(argv, stdin=stdin, capture_output=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise ConnectError(self.name, "`srun` is not installed on this machine",
                               hint="run pdctl on a login node with the Slurm client tools") from None
        except subprocess.TimeoutExpired as exc:
            err = (exc.stderr or b"").decode(errors="replace")
            raise RemoteCommandError(self.name, shown, 124, err, hint=f"it ran longer than {timeout:g}s") from None
        out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        if proc.returncode != 0:
            self._check_srun(err)
        return CommandResult(proc.returncode, out, err, time.monotonic() - start)

    def _check_srun(self, stderr: str) -> None:
        for line in stderr.splitlines():
            if line.startswith("srun: error:") and any(f in line for f in _SRUN_FAILURES):
                raise ConnectError(
                    f"{self.name} ({self.host} in job {self.jobid})",
                    f"srun cannot start a step: {line.removeprefix('srun: error:').strip()}",
                    hint="`pdctl status` shows the job's state; if it ended, `pdctl up` submits a new one",
                )

    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        dest = expand_home(remote)
        script = (f'D={dest}; mkdir -p "$(dirname "$D")" && cat > "$D.pdctl-tmp" && '
                  f'chmod {local.stat().st_mode & 0o7777:o} "$D.pdctl-tmp" && mv "$D.pdctl-tmp" "$D"')
        size = local.stat().st_size
        with local.open("rb") as fh:
            res = self._step([*self._srun("put"), "sh", "-c", script], script, fh, timeout=None)
        if not res.ok:
            raise RemoteCommandError(self.name, f"put {local} -> {remote}", res.exit_code, res.stderr)
        if progress:
            progress(size, size)

    def start_detached(self, job: DetachedJob) -> Started:
        """The process as a step of its own; its `srun` lives on in a session of its own after the CLI exits."""
        process = str(job.env.get(PROCESS_VAR, job.unit))
        nonce = secrets.token_hex(8)
        pidfile = f"{job.workdir}/.{process}.step"
        script = _step_script(job, pidfile, nonce, {k: reveal(v) for k, v in job.env.items()})
        logs = pdctl_home() / "slurm" / self.deployment
        logs.mkdir(parents=True, exist_ok=True)
        srun_log = logs / f"{job.env.get(NODE_VAR, self.name)}-{process}.srun.log"
        with srun_log.open("ab") as log:
            # the script goes in on stdin: on the login node an srun's argv is visible to every user
            proc = subprocess.Popen([*self._srun(process), "sh", "-s"], stdin=subprocess.PIPE, stdout=log,
                                    stderr=log, start_new_session=True)
        assert proc.stdin is not None
        proc.stdin.write(script.encode())
        proc.stdin.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            words = (self.read_text(pidfile) or "").split()
            if len(words) == 2 and words[1] == nonce and words[0].isdigit():
                return Started(pid=int(words[0]))
            if proc.poll() is not None:
                tail = srun_log.read_text(errors="replace").splitlines()[-10:]
                self._check_srun("\n".join(tail))
                raise RemoteCommandError(self.name, f"srun ... {process}", proc.returncode or 0, "\n".join(tail),
                                         hint=f"the step's log: {job.log_path}; srun's: {srun_log}")
            time.sleep(0.2)
        raise RemoteCommandError(self.name, f"srun ... {process}", 124, "", hint=(
            f"the step did not start in {START_TIMEOUT_S:g}s; srun's log: {srun_log}"))


def _step_script(job: DetachedJob, pidfile: str, nonce: str, env: Mapping[str, str]) -> str:
    argv = " ".join(expand_home(a) for a in with_secrets(job))
    env_args = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    return "\n".join([
        f"LOG={expand_home(job.log_path)}; WD={expand_home(job.workdir)}",
        'mkdir -p "$WD" "$(dirname "$LOG")" || exit 3',
        'cd "$WD" || exit 3',
        'echo "=== pdctl: starting at $(date -u +%FT%TZ) in step $SLURM_JOB_ID.$SLURM_STEP_ID ===" >> "$LOG" || exit 3',
        f"echo \"$$ {nonce}\" > {expand_home(pidfile)} || exit 3",
        # `--`: a key can never become an option of env
        f'exec env -- {env_args} {argv} >> "$LOG" 2>&1 < /dev/null',
    ])
