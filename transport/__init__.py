"""KV transfer: the transport API, one backend per file, and the vLLM KV connector
(``docs/design/kv-transfer.md``)."""
