"""`python -m pdctl.router serve ...`: the same command as `pdctl router serve`, without loading the rest of the
CLI (the router starts in a fraction of the time)."""

from pdctl.router.serve import router_app

router_app()(prog_name="python -m pdctl.router")
