"""KV transfer: the transport API, one backend per file, and the vLLM KV connector (DESIGN.md §5)."""
