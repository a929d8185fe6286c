"""Thin vLLM adapter shared by prefill and decode workers: engine settings, the engine loop, stats.

Every vLLM-specific line of the workers lives here or in ``tetriserve.transport.kv_connector``
(``docs/design/index.md``), so a vLLM upgrade touches few files. Workers never import each
other; both import this package.
"""
