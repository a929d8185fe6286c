"""The gRPC API (``tetriserve.proto``) and its generated stubs; regenerate with ``python -m protos.generate``."""
