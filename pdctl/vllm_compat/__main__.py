"""`python -m pdctl.vllm_compat status|apply`: see pdctl.vllm_compat."""

from pdctl.vllm_compat import main

raise SystemExit(main())
