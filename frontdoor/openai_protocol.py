"""OpenAI-compatible HTTP bodies: pydantic requests in, plain-dict responses out.

Requests accept what OpenAI clients and ``vllm bench serve`` send (unknown
fields are ignored, as vLLM does) and reject with a 400 naming the field what is
malformed (a chat role outside OpenAI's, a content part without its text, an
empty conversation) or what we cannot honour (``echo``, ``best_of`` > 1, ``suffix``).
Responses are dicts shaped like vLLM's OpenAI server's (``stop_reason``, logprobs
as ``logprobs.py`` shapes them), serialized once per SSE event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tetriserve.common.errors import InvalidRequestError
from tetriserve.common.request import MAX_LOGPROBS
from tetriserve.frontdoor.deltas import TextDelta
from tetriserve.frontdoor.logprobs import (
    ChatLogprobs,
    CompletionLogprobs,
    LogprobEntry,
    chat_logprobs,
    completion_logprobs,
)

if TYPE_CHECKING:
    from typing_extensions import TypeIs

Body = dict[str, object]  # a response body, or a part of one, as ``json.dumps`` takes it

MAX_CHOICES = 32  # ``n``: each choice is a request of its own on the workers
# vLLM fields that change what is generated but that we do not honour: refused by name, never silently ignored
UNSUPPORTED = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "bad_words",
    "prompt_logprobs",
    "logprob_token_ids",
    "use_beam_search",
    "tools",
    "functions",
)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = Field(False, description="Send a last chunk with `usage` and empty `choices`.")
    continuous_usage_stats: bool = Field(
        False, description="With `include_usage`: every chunk carries the usage so far (vLLM extension)."
    )


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
    n: int = Field(1, description=f"Number of choices, 1 to {MAX_CHOICES}; more than 1 needs temperature > 0.")
    stream: bool = Field(False, description="Stream Server-Sent Events instead of one JSON body.")
    stream_options: StreamOptions | None = Field(None, description="Streaming options (`include_usage`).")
    presence_penalty: float | None = Field(None, description="Penalty in [-2, 2] for tokens already in the output.")
    frequency_penalty: float | None = Field(None, description="Penalty in [-2, 2] per occurrence in the output.")
    repetition_penalty: float | None = Field(
        None, description="Multiplicative penalty > 0 for tokens in prompt or output; 1 is none (vLLM extension)."
    )
    min_tokens: int | None = Field(None, description="Generate at least this many tokens before EOS or a stop token.")
    min_p: float | None = Field(None, description="Minimum probability relative to the top token, in [0, 1] (vLLM).")
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) to a bias added to its logit, clamped to [-100, 100]."
    )
    allowed_token_ids: list[int] | None = Field(None, description="Only these token ids may be sampled (vLLM).")
    include_stop_str_in_output: bool = Field(False, description="Send the stop string that ended the text (vLLM).")
    skip_special_tokens: bool = Field(True, description="Leave special tokens out of the text (vLLM).")
    user: str | None = Field(None, description="End-user id; logged only.")
    priority: int = Field(0, description="Higher is more important (tetriserve extension).")
    slo: SLOBody | None = Field(None, description="Latency objectives (tetriserve extension).")

    def check_supported(self) -> None:
        """Raise ``InvalidRequestError`` for options we accept syntactically but cannot honour."""
        extra = self.model_extra or {}
        for name in UNSUPPORTED:
            if extra.get(name):
                raise InvalidRequestError(name, f"{name} is not supported by this server")
        response_format = extra.get("response_format")
        if response_format and not (isinstance(response_format, dict) and response_format.get("type") == "text"):
            raise InvalidRequestError("response_format", "only the `text` response format is supported")
        if not 1 <= self.n <= MAX_CHOICES:
            raise InvalidRequestError("n", f"must be in [1, {MAX_CHOICES}], got {self.n}")
        if self.n > 1 and self.temperature == 0:
            raise InvalidRequestError("n", f"n must be 1 when using greedy sampling, got {self.n}")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(_GenerateBody):
    """Body of ``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]] = Field(
        description="A string, a list of one string, token ids, or a list of one list of token ids."
    )
    max_tokens: int | None = Field(16, description="Most tokens to generate; null means all the context left.")
    echo: bool = Field(False, description="Not supported.")
    logprobs: int | None = Field(
        None, description=f"Return each token's log-probability and the top k (0 to {MAX_LOGPROBS}) per position."
    )
    best_of: int | None = Field(None, description="Only 1 is supported.")
    suffix: str | None = Field(None, description="Not supported.")

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise InvalidRequestError("echo", "echo is not supported")
        if self.best_of not in (None, 1):
            raise InvalidRequestError("best_of", f"only best_of=1 is supported, got {self.best_of}")
        if self.suffix:
            raise InvalidRequestError("suffix", "suffix is not supported")

    @property
    def logprobs_asked(self) -> int | None:
        """Alternatives per position of the logprobs asked for (None: none)."""
        return self.logprobs

    def single_prompt(self) -> str | list[int]:
        """The one prompt of the request (batched prompts are rejected)."""
        prompt = self.prompt
        if isinstance(prompt, str) or _token_ids(prompt):
            return prompt
        if len(prompt) != 1:
            raise InvalidRequestError("prompt", f"send one prompt per request, got {len(prompt)}")
        return prompt[0]


def _token_ids(prompt: list[int] | list[str] | list[list[int]]) -> TypeIs[list[int]]:
    """Whether a list ``prompt`` is one prompt's token ids (empty, or not a list of prompts)."""
    return not prompt or not isinstance(prompt[0], (str, list))


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

    def as_template_input(self, index: int) -> dict[str, str]:
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
        message: dict[str, str] = {"role": self.role, "content": content or ""}
        if self.name:
            message["name"] = self.name
        return message


class ChatCompletionRequest(_GenerateBody):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(description="The conversation; rendered with the model's chat template.")
    max_tokens: int | None = Field(None, description="Deprecated alias of max_completion_tokens.")
    max_completion_tokens: int | None = Field(None, description="Most tokens to generate; null: all context left.")
    logprobs: bool | None = Field(None, description="Return the log-probability of each output token.")
    top_logprobs: int | None = Field(
        None, description=f"With `logprobs`: also the k (0 to {MAX_LOGPROBS}) most likely tokens per position."
    )
    add_generation_prompt: bool = Field(True, description="Append the assistant turn header (vLLM extension).")

    def check_supported(self) -> None:
        super().check_supported()
        if not self.messages:
            raise InvalidRequestError("messages", "must hold at least one message")
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true")

    @property
    def logprobs_asked(self) -> int | None:
        """Alternatives per position of the logprobs asked for (None: none); errors name ``top_logprobs``."""
        return (self.top_logprobs or 0) if self.logprobs else None

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


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class ResponseShaper:
    """Builds the response dicts of one request (completion or chat, whole or chunked; ``index``: the choice).

    ``top_logprobs``: the alternatives per position the request asked for with its logprobs (None: no logprobs).
    Chunks carry no ``usage`` unless ``continuous_usage`` (vLLM's ``continuous_usage_stats``).
    """

    def __init__(
        self, chat: bool, request_id: str, model: str, top_logprobs: int | None = None, continuous_usage: bool = False
    ) -> None:
        self.chat = chat
        self.continuous_usage = continuous_usage  # every chunk carries its choice's usage so far
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.model = model
        self.created = int(time.time())
        self.top_logprobs = top_logprobs
        self._offsets: dict[int, int] = {}  # completions: each choice's next logprobs text_offset

    def _envelope(self, obj: str, choices: list[Body]) -> Body:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def _logprobs(
        self, entries: tuple[LogprobEntry, ...] | None, index: int
    ) -> ChatLogprobs | CompletionLogprobs | None:
        if self.top_logprobs is None or entries is None:
            return None
        if self.chat:
            return chat_logprobs(entries, self.top_logprobs)
        body = completion_logprobs(entries, self.top_logprobs, self._offsets.get(index, 0))
        if body["tokens"]:  # the next chunk goes on after the tokens reported (text held back may lag them)
            self._offsets[index] = body["text_offset"][-1] + len(body["tokens"][-1])
        return body

    def _choice(self, delta: TextDelta, index: int, entries: tuple[LogprobEntry, ...] | None) -> Body:
        choice: Body = {"index": index, "logprobs": self._logprobs(entries, index)}
        choice["finish_reason"] = delta.finish_reason
        if delta.finished:
            choice["stop_reason"] = delta.stop_reason
        return choice

    def role_chunk(self, index: int) -> Body:
        """Chat: the first event of choice ``index``, sent before its first token (as OpenAI and vLLM do)."""
        choice = {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        return self._envelope("chat.completion.chunk", [{**choice, "finish_reason": None}])

    def chunk(self, delta: TextDelta, index: int = 0) -> Body:
        choice = self._choice(delta, index, delta.logprobs)
        if self.chat:
            choice["delta"] = {"content": delta.text}
            body = self._envelope("chat.completion.chunk", [choice])
        else:
            choice["text"] = delta.text
            body = self._envelope("text_completion", [choice])
        if self.continuous_usage:
            body["usage"] = usage(delta.prompt_tokens, delta.completion_tokens)
        return body

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> Body:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = usage(prompt_tokens, completion_tokens)
        return body

    def whole(self, choices: list[Choice]) -> Body:
        out: list[Body] = []
        for index, c in enumerate(choices):
            choice = self._choice(c.last, index, c.logprobs)
            if self.chat:
                choice["message"] = {"role": "assistant", "content": c.text}
            else:
                choice["text"] = c.text
            out.append(choice)
        body = self._envelope("chat.completion" if self.chat else "text_completion", out)
        body["usage"] = usage(choices[0].last.prompt_tokens, sum(c.last.completion_tokens for c in choices))
        return body


@dataclass(frozen=True)
class Choice:
    """One finished choice of a whole (non-streamed) response: its text, all its logprobs, its last delta."""

    text: str
    last: TextDelta
    logprobs: tuple[LogprobEntry, ...] | None
