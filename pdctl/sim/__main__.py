"""`python -m pdctl.sim serve MODEL --role prefill|decode ...`: one simulated vLLM engine."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable

from pdctl.sim.config import ConfigError, SimConfig, parse_args

log = logging.getLogger("vllm.entrypoints.openai.api_server")


def _startup_lines(cfg: SimConfig) -> None:
    kv = cfg.kv
    log.info("pdctl simulator, results are simulated: model %s as %s, role %s, speed %g, engine_id %s",
             cfg.model, cfg.model_name, cfg.role, cfg.speed, cfg.engine_id)
    if cfg.ignored_args:
        log.warning("Ignoring vLLM arguments the simulator does not model: %s", " ".join(cfg.ignored_args))
    if kv.enabled and kv.bidirectional:
        logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.nixl").info(
            "Bidirectional KV transfer is enabled and the kv recompute threshold is set to %d tokens."
            "KV blocks on D are released after a TTL of %d seconds.",
            kv.recompute_threshold, int(kv.decoder_kv_blocks_ttl),
        )


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where installed (uvicorn[standard] brings it), as `vllm serve` runs on it."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _raise_nofile() -> None:
    """As vLLM does at start: lift the open-file soft limit to the hard one (many client connections)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout,
        format="(APIServer pid=%(process)d) %(levelname)s %(asctime)s [%(module)s.py:%(lineno)d] %(message)s",
        datefmt="%m-%d %H:%M:%S",
    )
    try:
        cfg = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    logging.getLogger("httpx").setLevel(logging.WARNING)
    _raise_nofile()
    _startup_lines(cfg)
    from pdctl.sim.server import serve

    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(cfg))
    except OSError as e:
        print(f"Error: cannot listen: {e}. Pick free ports for --port and VLLM_NIXL_SIDE_CHANNEL_PORT.",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
