"""Stop strings, matched by the front door over a request's whole text (as vLLM's output processor does).

An engine sees only its part of a request (the prefill worker the first token,
each decode worker its slice), so a stop string that spans the handoff is
invisible to all of them; the front door sees every character. Text that could
still be the start of a stop string is held back until it cannot::

    feed(text) ─▶ buffer = held + text
                  a stop string in buffer?  ─▶ emit what precedes it, stopped (the stop string is not sent)
                  otherwise                  ─▶ emit all but the last (longest stop − 1) characters, hold those
    flush()    ─▶ what is held (the stream ended another way)
"""

from __future__ import annotations

from collections.abc import Sequence

from tetriserve.common.errors import InvalidRequestError
from tetriserve.frontdoor.field_checks import unicode_text

MAX_STOP_STRINGS = 16


def stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """A request's ``stop`` field, checked: at most ``MAX_STOP_STRINGS`` non-empty strings."""
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
    if any(not isinstance(s, str) or not s for s in stops):
        raise InvalidRequestError("stop", "stop strings must be non-empty strings")
    return tuple(unicode_text("stop", s) for s in stops)


class StopMatcher:
    """``include``: the stop string that ends the text is sent too (vLLM's ``include_stop_str_in_output``)."""

    def __init__(self, stops: Sequence[str], include: bool = False) -> None:
        self.stops = tuple(s for s in stops if s)
        self._include = include
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._held = ""
        self.stopped: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> str:
        """Take new text; return what can be sent now. Once ``stopped`` is set, nothing more is sent."""
        if self.stopped is not None:
            return ""
        buffer = self._held + text
        hits = [(i, s) for s in self.stops if (i := buffer.find(s)) >= 0]
        if hits:
            at, self.stopped = min(hits)
            self._held = ""
            return buffer[: at + len(self.stopped)] if self._include else buffer[:at]
        cut = max(0, len(buffer) - self._hold)
        self._held = buffer[cut:]
        return buffer[:cut]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
