"""Any OpenAI-compatible chat-completions server (llama.cpp, vLLM, Ollama, OpenAI).

Streams content deltas; accumulates native tool-call deltas by index (their
arguments arrive in pieces); falls back to ``<tool_call>`` text blocks for
servers without native tool calling (only the model's own words: never a
block it quotes back from a tool result). A reply is capped like tool output.
Every failure becomes an ``LLMError`` with a message a user can act on.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from functools import lru_cache

import openai

from chat.llm.base import Chunk, LLMError, TextDelta, ToolCall, TurnEnd, new_call_id
from chat.llm.textcalls import OPEN, holdback, parse_arguments, split_text_calls
from studio.cancel import CancelToken
from studio.text import strip_nul, strip_nul_json

logger = logging.getLogger(__name__)

# The most of one reply (content, and each call's arguments) Studio keeps.
MAX_REPLY_CHARS = 64 * 1024
TRUNCATED = "\n\n[Studio cut this reply: it was longer than {limit:,} characters.]"


@lru_cache(maxsize=64)
def client_for(base_url: str, api_key: str, timeout: float) -> openai.OpenAI:
    """One client per server, key and timeout per process: building one loads the
    CA bundle (some 20 ms of CPU, even for http://), and a run step asks for one.
    Clients are thread-safe; a changed entry (another key, say) gets its own."""
    return openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout, max_retries=0)


class OpenAICompatModel:
    # A chat's first reply is followed by a request for its title (chat.services).
    writes_titles = True

    def __init__(
        self, *, base_url: str, model: str, api_key: str, timeout: float, label: str = ""
    ) -> None:
        self.name = model
        self.label = label or model
        self.base_url = base_url
        self.model = model
        self.client = client_for(base_url, api_key or "not-needed", timeout)

    def stream(
        self, messages: list[dict], tools: list[dict], *, cancel: CancelToken
    ) -> Iterator[Chunk]:
        kwargs: dict = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            # The token counts come in a last chunk (studio_model_tokens).
            "stream_options": {"include_usage": True},
        }
        if tools:
            kwargs["tools"] = tools
        quoted = [
            str(m.get("content") or "") for m in messages if m.get("role") in ("tool", "user")
        ]
        # The raw stream (the SDK's documented ``with_streaming_response``): its
        # chunks read as JSON, not built into the SDK's models, which cost some
        # two fifths of a call's CPU (RESULTS.md).
        stream = self.client.chat.completions.with_streaming_response.create(**kwargs)
        yield from self._consume(stream, cancel, quoted=quoted)

    def _consume(self, stream, cancel: CancelToken, *, quoted: list[str]) -> Iterator[Chunk]:
        content = ""
        shown = 0  # characters of content already yielded
        in_text_call = False
        calls: dict[int, dict] = {}
        finished = truncated = False
        usage = None
        try:
            with stream as response:
                for chunk in _chunks(response.iter_lines()):
                    if cancel.is_set():
                        break
                    if chunk.get("usage"):
                        usage = {
                            "prompt": chunk["usage"].get("prompt_tokens") or 0,
                            "completion": chunk["usage"].get("completion_tokens") or 0,
                        }
                    choices = chunk.get("choices")
                    if not choices:
                        continue
                    if choices[0].get("finish_reason"):
                        finished = True
                    delta = choices[0].get("delta")
                    if not delta:
                        continue
                    for tc in delta.get("tool_calls") or ():
                        index = tc.get("index") or 0
                        if not isinstance(index, int):
                            raise StreamError(f"a tool call's index is {_short(repr(index))}")
                        slot = calls.setdefault(index, {"id": "", "name": "", "args": ""})
                        if tc.get("id"):
                            slot["id"] = tc["id"]
                        function = tc.get("function") or {}
                        if function.get("name"):
                            slot["name"] += function["name"]
                        if function.get("arguments"):
                            slot["args"] += function["arguments"]
                            truncated |= len(slot["args"]) > MAX_REPLY_CHARS
                    text = delta.get("content")
                    if text:
                        content += strip_nul(text)
                        truncated |= len(content) > MAX_REPLY_CHARS
                    if truncated:
                        # Stop reading: a runaway model costs no more than this.
                        finished = True
                        content = content[:MAX_REPLY_CHARS]
                        break
                    if not text:
                        continue
                    if in_text_call:
                        continue
                    if OPEN in content:
                        in_text_call = True
                        visible_end = content.index(OPEN)
                    else:
                        visible_end = len(content) - holdback(content)
                    if visible_end > shown:
                        yield TextDelta(content[shown:visible_end])
                        shown = visible_end
        except LLMError:
            raise
        except Exception as exc:
            raise LLMError(self._describe(exc)) from None

        if not finished and not cancel.is_set():
            # Real servers end every choice with a finish_reason; a stream that
            # stops without one was cut (server crashed, proxy timed out).
            logger.warning("the model server at %s closed a stream early", self.base_url)
            raise LLMError("The model server closed the stream before the reply was finished.")
        tool_calls = [self._native_call(calls[i]) for i in sorted(calls)]
        visible, text_calls = split_text_calls(content, quoted=quoted)
        if not tool_calls:
            tool_calls = text_calls
        if truncated:
            visible += TRUNCATED.format(limit=MAX_REPLY_CHARS)
        if len(visible) > shown:
            yield TextDelta(visible[shown:])
        yield TurnEnd(content=visible, tool_calls=tool_calls, usage=usage)

    @staticmethod
    def _native_call(slot: dict) -> ToolCall:
        if len(slot["args"]) > MAX_REPLY_CHARS:
            arguments, error = None, f"the arguments are longer than {MAX_REPLY_CHARS:,} characters"
        else:
            arguments, error = parse_arguments(strip_nul(slot["args"]))
        return ToolCall(
            id=slot["id"] or new_call_id(),
            name=strip_nul(slot["name"]),
            arguments=strip_nul_json(arguments) if arguments is not None else None,
            error=error,
        )

    @classmethod
    def listed(cls, *, base_url: str, api_key: str, timeout: float) -> list[str]:
        """The model ids the server's ``/models`` lists, sorted."""
        server = cls(base_url=base_url, model="", api_key=api_key, timeout=timeout)
        try:
            return sorted({model.id for model in server.client.models.list()})
        except openai.OpenAIError as exc:
            raise LLMError(server._describe(exc), detail=_short(str(exc))) from None

    def _describe(self, exc: Exception) -> str:
        """What the member reads. The server's address and the library's words
        are for the operator's log: a member never sees an internal URL."""
        logger.warning("model server %s (%s): %s", self.base_url, self.model, _short(str(exc)))
        where = "the model server"
        ask = " Try again, or tell an admin if it keeps happening."
        if isinstance(exc, openai.APITimeoutError):
            return f"The model server did not answer in time.{ask}"
        if isinstance(exc, openai.APIConnectionError):
            return f"Could not reach {where}: it may be down or restarting.{ask}"
        if isinstance(exc, openai.AuthenticationError):
            return f"{where.capitalize()} refused Studio's API key (401). An admin must check it."
        if isinstance(exc, openai.NotFoundError):
            return f"{where.capitalize()} answered 404: an admin must check the model's settings."
        if isinstance(exc, openai.APIStatusError):
            return f"{where.capitalize()} answered HTTP {exc.status_code}.{ask}"
        return f"{where.capitalize()} sent a reply Studio could not read.{ask}"


class StreamError(Exception):
    """The server reported an error inside the stream, or sent what is not a stream."""


def _chunks(lines: Iterator[str]) -> Iterator[dict]:
    """The stream's chunks, from its server-sent events: ``data:`` lines up to a
    blank line make one event, ``[DONE]`` ends the stream; an event the server
    names ``error``, or a chunk carrying ``error``, is its failure."""
    data: list[str] = []
    event = ""
    for line in itertools.chain(lines, [""]):  # (a last event without its blank line)
        if line:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                data.append(value)
            elif field == "event":
                event = value
            continue  # comments (":…") and other fields
        if not data:
            event = ""
            continue
        payload, data = "\n".join(data), []
        if payload == "[DONE]":
            return
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            raise StreamError(f"not a chunk: {_short(payload)}")
        if event == "error" or chunk.get("error"):
            raise StreamError(
                f"the server's error: {_short(json.dumps(chunk.get('error', chunk)))}"
            )
        event = ""
        yield chunk


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "…"
