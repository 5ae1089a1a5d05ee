"""Slurm: a deployment inside one allocation, every process its own `srun` step.

`commands` builds the sbatch/srun lines (pure), `jobs` asks the cluster about jobs and steps from the login
node, `transport` is the node transport over `srun`, and `allocation` binds a topology's nodes to a job's hosts.
"""
