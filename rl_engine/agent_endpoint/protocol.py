"""The endpoint's side of the OpenAI protocol: the run's secret's names, the errors a request gets, the checks of
a chat-completions request, and a reply as `chat.completion` or as streamed `chat.completion.chunk`s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TOKEN_ENV = "POSTTRAIN_AGENT_TOKEN"
TOKEN_FILE = "agent_token"


class AgentError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param  # the request field at fault, as OpenAI's errors name it


@dataclass(frozen=True)
class Completion:
    """A reply as `chat.completion`, and the engine's token ids of its text (what a stream sends)."""

    reply: dict[str, Any]
    token_ids: list[int]


def _check_request(body: dict[str, Any], model_name: str) -> None:
    """Refuses, naming the field, what the endpoint cannot honour; silently ignoring it would hand an
    agent framework something other than what it asked for."""
    model = body.get("model")
    if model is not None and model != model_name:
        raise AgentError(
            400, f"model: this endpoint serves only {model_name!r} (the run's policy), got {model!r}", "model"
        )
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n != 1):
        raise AgentError(
            400, f"n: one completion per request (the run samples its groups through sessions), got {n!r}", "n"
        )
    for field_name in ("tools", "functions"):
        if body.get(field_name):
            raise AgentError(
                400,
                f"{field_name}: tool calling is not supported; describe the tools in the messages and parse the "
                "reply's text (its tokens are what the policy is trained on)",
                field_name,
            )
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise AgentError(400, 'response_format: only {"type": "text"} (no constrained decoding)', "response_format")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise AgentError(400, f"stream: must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise AgentError(400, 'stream_options: must be an object such as {"include_usage": true}', "stream_options")


def stream_chunks(completion: Completion, tokenizer: Any, include_usage: bool) -> list[dict[str, Any]]:
    """The reply as `chat.completion.chunk`s: the role, one content delta per token (decoded
    incrementally, so the deltas concatenate to exactly the reply's text), the finish_reason, usage."""
    reply = completion.reply
    choice = reply["choices"][0]
    text = choice["message"]["content"]
    base = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"], "model": reply["model"]}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    sent = ""
    for end in range(1, len(completion.token_ids) + 1):
        decoded = tokenizer.decode(completion.token_ids[:end], skip_special_tokens=True)
        # A token that ends inside a multi-byte character decodes to U+FFFD until the next one completes it.
        if decoded.endswith("\ufffd") or not decoded.startswith(sent) or not text.startswith(decoded):
            continue
        if len(decoded) > len(sent):
            chunks.append(chunk({"content": decoded[len(sent) :]}))
            sent = decoded
    if sent != text:  # whatever incremental decoding could not attribute to a token
        chunks.append(chunk({"content": text[len(sent) :]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": reply["usage"]})
    return chunks
