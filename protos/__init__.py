"""The gRPC API (``tetriserve.proto``) and its generated stubs.

Regenerate them with ``python -m tetriserve.protos.generate``.
"""
