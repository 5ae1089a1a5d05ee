"""The hosts of a deployment, one step at a time: connect to a topology's nodes (connect), start, find, probe and
stop one process (launch), wait for processes to serve (wait), one `up`/`down` at a time (lock), the engine API key
on every node (engine_key), the Slurm allocation around a lifecycle (slurm_job), GPU memory before and after
(gpu_memory).

May import: the layers below pdctl.lifecycle (topology, plan, state, remote, facts, operations, slurm) and nothing
else of pdctl.lifecycle.
"""
