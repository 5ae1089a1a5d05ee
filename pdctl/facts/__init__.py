"""Read-only probes of a host (see `base`); grouped by what they read."""
