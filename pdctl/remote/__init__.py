"""Reaching hosts: the `Transport` interface (`base`) and its local and SSH implementations, commands as shell
text (`shell`), detached processes (`procs`), HTTP and TCP through a host (`sshhttp`, `forward`), and the one
thread pool (`fanout`). It knows hosts, not deployments: nothing here imports the topology, the plan or Slurm
(the Slurm transport lives in `pdctl.slurm`; choosing a node's transport, in `pdctl.lifecycle.hosts.connect`).
"""
