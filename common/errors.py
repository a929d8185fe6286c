"""Error types that front doors map to client-visible codes (HTTP 400 / gRPC INVALID_ARGUMENT)."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """The request is malformed; ``field`` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownModelError(InvalidRequestError):
    def __init__(self, model: str, served: str) -> None:
        super().__init__("model", f"model '{model}' is not served here (serving '{served}')")
