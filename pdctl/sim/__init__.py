"""vLLM-compatible prefill/decode engine simulator with bidirectional NIXL KV semantics.

`python -m pdctl.sim serve MODEL --role prefill|decode ...` (flags mirror `vllm serve`; see config.py) serves
vLLM's OpenAI API on --host:--port and a NIXL stand-in side channel over HTTP on
VLLM_NIXL_SIDE_CHANNEL_HOST:VLLM_NIXL_SIDE_CHANNEL_PORT (side_channel.py):
    GET  /handshake  -> {"engine_id", "perf_counter", "tp_size", "block_size"}
    POST /read       {"request_id", "block_ids"} -> {"tokens": [[ids held by each block], ...]}; spends the handle
    POST /notify     {"request_ids": [...]} or {"request_id"} -> {"freed": requests freed, "ids": ids received}
Behaviour follows kv_transfer_params (do_remote_decode -> this engine is P for the request, do_remote_prefill ->
D), as vLLM's connector does; --role only labels. Every remote read is checked against the prompt
(`pdctl_sim_corrupt_reuse_total`). Results are simulated: the time model is timing.py, or with --step-model a
scheduler loop per engine (scheduler.py) over the step-level model of steps.py.
Deviations from vLLM: n=1 only; without max_tokens a request stops ("stop") after 64 chat / 16 completion
tokens; a failed KV load answers HTTP 500 before streaming starts.
"""
