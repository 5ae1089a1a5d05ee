"""vLLM-compatible prefill/decode engine simulator with bidirectional NIXL KV semantics."""
