"""Error types that front doors map to client-visible codes (HTTP 400 / gRPC INVALID_ARGUMENT), the OpenAI error
body every HTTP error is sent as, and how to tell that a Ray call's actor is dead (``actor_died``)."""

from __future__ import annotations


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, dict[str, str | None]]:
    """OpenAI's error shape: ``{"error": {message, type, param, code}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class InvalidRequestError(ValueError):
    """The request is malformed; ``field`` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnknownModelError(InvalidRequestError):
    def __init__(self, model: str, served: str) -> None:
        super().__init__("model", f"model '{model}' is not served here (serving '{served}')")


def actor_died(exc: BaseException) -> bool:
    """Whether ``exc`` is Ray saying the called actor's life is over (killed, or its process gone): not a timeout,
    not an error raised by the actor's own code."""
    from ray.exceptions import ActorDiedError

    return isinstance(exc, ActorDiedError)
