"""Changes to a running deployment: the load balancer (lb), the router's members file (membership), live changes of
engines (live) and of routers behind the load balancer (routers_live), stopping in order (stop), and `down`.

May import: pdctl.lifecycle.hosts, and the layers below pdctl.lifecycle.
"""
