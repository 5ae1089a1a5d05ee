"""Watching a deployment: `status` as data (status) and for people (status_view), `pdctl top` (top), the Prometheus
scrape configuration and Grafana dashboard (observe, dashboard), logs (logs) and a local port to the router
(port_forward).

May import: pdctl.lifecycle.bringup, pdctl.lifecycle.changes, pdctl.lifecycle.hosts, and the layers below
pdctl.lifecycle.
"""
