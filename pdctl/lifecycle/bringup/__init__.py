"""Bringing a topology up: `up`'s pipeline read top to bottom (pipeline), its stages before the engines start
(preflight, provision) and after (nixl_check, smoke), and what shows an `up` without running it: `up --dry-run`
(dry_run), `pdctl plan` (planned), `pdctl doctor` (doctor).

May import: pdctl.lifecycle.changes, pdctl.lifecycle.hosts, and the layers below pdctl.lifecycle.
"""
