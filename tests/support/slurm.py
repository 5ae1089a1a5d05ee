"""A real Slurm cluster for the tests: slurmctld here, one slurmd per network namespace of an `SshLab`.

`SlurmLab.create(tmp, count)` generates a munge key and runs `munged` on a private socket, writes a
`slurm.conf` (linuxproc process tracking, no task plugin, cons_tres, state and spool under `tmp`, free ports)
and starts the daemons; `SLURM_CONF` points the client tools (and pdctl) at it. slurmd enters only the
namespace's network (`nsenter --net`), keeping the root mount namespace: `ip netns exec` would mount a fresh
/sys without the cgroup filesystem that slurmd 22.05 insists on. Each slurmd is `-N h<i>` with the
namespace's address as NodeAddr, so steps run "on" different hosts with their own addresses.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.netns import SshLab, running_lab, skip_or_fail
from tests.support.ports import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "nsenter")


def unavailable() -> str | None:
    for tool in (*DAEMONS, "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"`{tool}` is not installed (scripts/test installs slurmctld, slurmd, slurm-client and munge)"
    return None


@dataclass
class SlurmLab:
    tmp: Path
    lab: SshLab
    conf: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    munged_pid: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def hosts(self) -> list[str]:
        return [h.node for h in self.lab.hosts]

    def cmd(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30, check=False)

    @classmethod
    def create(cls, tmp: Path, lab: SshLab) -> SlurmLab:
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "state").mkdir(exist_ok=True)
        key = tmp / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = tmp / "munge.sock"
        conf = tmp / "slurm.conf"
        me = cls(tmp=tmp, lab=lab, conf=conf, munged_pid=tmp / "munged.pid")
        try:
            subprocess.run(
                ["munged", "--socket", str(sock), "--key-file", str(key), "--pid-file", str(me.munged_pid),
                 "--log-file", str(tmp / "munged.log"), "--seed-file", str(tmp / "munge.seed"), "--force"],
                check=True, capture_output=True, timeout=30,
            )
            conf.write_text(_conf(tmp, lab, sock))
            (tmp / "cgroup.conf").write_text("CgroupPlugin=autodetect\n")
            me.procs.append(me._daemon(["slurmctld", "-D", "-f", str(conf)], "slurmctld"))
            for h in lab.hosts:
                (tmp / "spool" / h.node).mkdir(parents=True, exist_ok=True)
                me.procs.append(me._daemon(
                    ["nsenter", f"--net=/run/netns/{h.netns}", "slurmd", "-D", "-N", h.node, "-f", str(conf)],
                    f"slurmd-{h.node}"))
            me._wait_idle(len(lab.hosts))
        except BaseException:
            me.close()
            raise
        return me

    def _daemon(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.out").open("ab")
        return subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)

    def _wait_idle(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited {p.returncode}; see {self.tmp}")
            out = self.cmd("sinfo", "-h", "-N", "-o", "%N %t").stdout
            if out.count("idle") >= count:
                return
            time.sleep(0.2)
        raise RuntimeError(f"slurm nodes not idle after {timeout:g}s: {out!r}; see {self.tmp}")

    def close(self) -> None:
        # The cluster and its state are thrown away: a daemon gets 2 s to end. A slurmd whose job was just cancelled
        # sat out the whole grace on SIGTERM (10 s then); what its steps left runs in its namespace, which the lab's
        # close kills.
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 2
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        if self.munged_pid is not None and self.munged_pid.exists():
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(self.munged_pid.read_text().strip()), signal.SIGTERM)


def _conf(tmp: Path, lab: SshLab, sock: Path) -> str:
    nodes = "\n".join(
        f"NodeName={h.node} NodeAddr={h.address} CPUs=2 RealMemory=1000 State=UNKNOWN" for h in lab.hosts
    )
    return f"""ClusterName=pdtest
SlurmctldHost={socket.gethostname().split(".")[0]}({lab.subnet}.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
CredType=cred/munge
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool/%n
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd-%n.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=2
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@contextmanager
def running_slurm(directory: Path, count: int = 3) -> Iterator[SlurmLab]:
    """A cluster for a session fixture; skipped with the reason where it cannot run, except under CI (must run)."""
    reason = unavailable()
    if reason:
        skip_or_fail(f"a Slurm test cluster is required in CI but cannot be started: {reason}",
                     f"Slurm test cluster: {reason}")
    with running_lab(directory / "lab", count) as lab:
        try:
            cluster = SlurmLab.create(directory / "slurm", lab)
        except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
            skip_or_fail(f"a Slurm test cluster is required in CI but did not start: {exc}",
                         f"Slurm test cluster did not start: {exc}")
        old = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(cluster.conf)
        try:
            yield cluster
        finally:
            if old is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = old
            cluster.close()
