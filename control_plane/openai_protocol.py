"""OpenAI-compatible HTTP bodies: pydantic requests in, plain-dict responses out.

Requests accept what OpenAI clients and ``vllm bench serve`` send (unknown
fields are ignored, as vLLM does) and reject with a 400 naming the field what is
malformed (a chat role outside OpenAI's, a content part without its text, an
empty conversation) or what we cannot honour (``n`` != 1, logprobs).
Responses are dicts shaped like OpenAI's, serialized once per SSE event.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tetriserve.common.errors import InvalidRequestError
from tetriserve.control_plane.frontdoor import TextDelta


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = Field(False, description="Send a last chunk with `usage` and empty `choices`.")
    continuous_usage_stats: bool = Field(False, description="Accepted for vLLM compatibility; ignored.")


class SLOBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(None, description="Time-to-first-token objective (ms).")
    tbt_ms: float | None = Field(None, description="Time-between-tokens objective (ms).")
    jct_ms: float | None = Field(None, description="Job-completion-time objective (ms).")


class _GenerateBody(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, description="Served model name; empty or absent means the served model.")
    temperature: float | None = Field(None, description="Sampling temperature in [0, 2]; 0 is greedy. Default 1.")
    top_p: float | None = Field(None, description="Nucleus sampling mass in (0, 1]. Default 1.")
    top_k: int | None = Field(None, description="Top-k sampling; 0 or -1 disables (vLLM extension).")
    seed: int | None = Field(None, description="Per-request sampling seed.")
    stop: str | list[str] | None = Field(
        None, description="Stop strings: generation ends before the first one found, which is not sent."
    )
    stop_token_ids: list[int] | None = Field(None, description="Token ids that end generation (vLLM extension).")
    ignore_eos: bool = Field(False, description="Keep generating past EOS (vLLM extension, for benchmarks).")
    n: int = Field(1, description="Number of choices; only 1 is supported.")
    stream: bool = Field(False, description="Stream Server-Sent Events instead of one JSON body.")
    stream_options: StreamOptions | None = Field(None, description="Streaming options (`include_usage`).")
    presence_penalty: float | None = Field(None, description="Penalty in [-2, 2] for tokens already in the output.")
    frequency_penalty: float | None = Field(None, description="Penalty in [-2, 2] per occurrence in the output.")
    repetition_penalty: float | None = Field(
        None, description="Multiplicative penalty > 0 for tokens in prompt or output; 1 is none (vLLM extension)."
    )
    min_tokens: int | None = Field(None, description="Generate at least this many tokens before EOS or a stop token.")
    user: str | None = Field(None, description="End-user id; logged only.")
    priority: int = Field(0, description="Higher is more important (tetriserve extension).")
    slo: SLOBody | None = Field(None, description="Latency objectives (tetriserve extension).")

    def check_supported(self) -> None:
        """Raise ``InvalidRequestError`` for options we accept syntactically but cannot honour."""
        if self.n != 1:
            raise InvalidRequestError("n", f"only n=1 is supported, got {self.n}")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_GenerateBody):
    """Body of ``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="A string, a list of one string, token ids, or a list of one list of token ids."
    )
    max_tokens: int | None = Field(16, description="Most tokens to generate; null means all the context left.")
    echo: bool = Field(False, description="Not supported.")
    logprobs: int | None = Field(None, description="Not supported (must be null).")
    best_of: int | None = Field(None, description="Only 1 is supported.")
    suffix: str | None = Field(None, description="Not supported.")

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise InvalidRequestError("echo", "echo is not supported")
        if self.logprobs is not None:
            raise InvalidRequestError("logprobs", "logprobs are not supported")
        if self.best_of not in (None, 1):
            raise InvalidRequestError("best_of", f"only best_of=1 is supported, got {self.best_of}")
        if self.suffix:
            raise InvalidRequestError("suffix", "suffix is not supported")

    def single_prompt(self) -> str | list[int]:
        """The one prompt of the request (batched prompts are rejected)."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise InvalidRequestError("prompt", f"send one prompt per request, got {len(prompt)}")
            return prompt[0]
        return prompt  # type: ignore[return-value]


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # OpenAI's


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str = Field(description="Only `text` parts are supported.")
    text: str | None = Field(None, description="The text of a `text` part.")


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(description=f"One of {', '.join(CHAT_ROLES)}.")
    content: str | list[ContentPart] | None = Field(
        None, description="Text, or a list of text parts; may be null only for an assistant turn."
    )
    name: str | None = Field(None, description="Optional participant name.")

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role not in CHAT_ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {', '.join(CHAT_ROLES)}")
        return role

    def as_template_input(self, index: int) -> dict[str, Any]:
        content = self.content
        where = f"messages[{index}].content"
        if content is None and self.role != "assistant":
            raise InvalidRequestError(where, f"a {self.role} message needs content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if part.type != "text":
                    raise InvalidRequestError(f"{where}[{j}].type", f"only text parts are supported, got {part.type!r}")
                if part.text is None:
                    raise InvalidRequestError(f"{where}[{j}].text", "a text part needs its text")
            content = "".join(p.text or "" for p in content)
        message: dict[str, Any] = {"role": self.role, "content": content or ""}
        if self.name:
            message["name"] = self.name
        return message


class ChatCompletionRequest(_GenerateBody):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(description="The conversation; rendered with the model's chat template.")
    max_tokens: int | None = Field(None, description="Deprecated alias of max_completion_tokens.")
    max_completion_tokens: int | None = Field(None, description="Most tokens to generate; null: all context left.")
    logprobs: bool | None = Field(None, description="Not supported.")
    top_logprobs: int | None = Field(None, description="Not supported.")
    add_generation_prompt: bool = Field(True, description="Append the assistant turn header (vLLM extension).")

    def check_supported(self) -> None:
        super().check_supported()
        if not self.messages:
            raise InvalidRequestError("messages", "must hold at least one message")
        if self.logprobs or self.top_logprobs:
            raise InvalidRequestError("logprobs", "logprobs are not supported")

    @property
    def token_limit(self) -> tuple[str, int | None]:
        """(field name, value) of the output limit the client set."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


class TokenizeRequest(BaseModel):
    """Body of vLLM's ``POST /tokenize``: a ``prompt``, or chat ``messages`` rendered with the chat template."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, description="Served model name; empty or absent means the served model.")
    prompt: str | None = Field(None, description="Text to tokenize (or send `messages`).")
    messages: list[ChatMessage] | None = Field(None, description="A conversation to render and tokenize.")
    add_generation_prompt: bool = Field(True, description="Chat: append the assistant turn header.")
    add_special_tokens: bool | None = Field(
        None, description="Add special tokens (BOS); default true for a prompt, false for messages (vLLM's)."
    )
    return_token_strs: bool = Field(False, description="Also return each token's string.")


class DetokenizeRequest(BaseModel):
    """Body of vLLM's ``POST /detokenize``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, description="Served model name; empty or absent means the served model.")
    tokens: list[int] = Field(description="Token ids to turn back into text.")


# ---- responses --------------------------------------------------------------------------------


def usage(delta: TextDelta) -> dict[str, int]:
    return {
        "prompt_tokens": delta.prompt_tokens,
        "completion_tokens": delta.completion_tokens,
        "total_tokens": delta.prompt_tokens + delta.completion_tokens,
    }


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class ResponseShaper:
    """Builds the response dicts of one request (completion or chat, whole or chunked)."""

    def __init__(self, chat: bool, request_id: str, model: str) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.model = model
        self.created = int(time.time())
        self._sent_role = False

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def chunk(self, delta: TextDelta, include_usage: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": delta.finish_reason}
        if self.chat:
            choice["delta"] = {"content": delta.text}
            if not self._sent_role:
                choice["delta"] = {"role": "assistant", "content": delta.text}
                self._sent_role = True
            body = self._envelope("chat.completion.chunk", [choice])
        else:
            choice["text"] = delta.text
            body = self._envelope("text_completion", [choice])
        if include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, delta: TextDelta) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage(delta)
        return body

    def whole(self, text: str, last: TextDelta) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": last.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
            body = self._envelope("chat.completion", [choice])
        else:
            choice["text"] = text
            body = self._envelope("text_completion", [choice])
        body["usage"] = usage(last)
        return body
