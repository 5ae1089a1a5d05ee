"""pdctl: prefill/decode disaggregated vLLM with bidirectional KV transfer, from one YAML topology."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pdctl")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
