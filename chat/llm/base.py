from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from studio.cancel import CancelToken


class LLMError(Exception):
    """The model could not answer; the message is shown in the chat.

    ``detail``: what went wrong in the library's words, for an admin's eyes
    (the admin's Fetch models), never a member's.
    """

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict | None
    # Set when the arguments could not be parsed; the model is told so.
    error: str = ""


@dataclass
class TextDelta:
    text: str


@dataclass
class TurnEnd:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    # Token counts, when the server reports them: {"prompt": n, "completion": n}.
    usage: dict | None = None


Chunk = TextDelta | TurnEnd


class ChatModel(Protocol):
    name: str
    label: str  # what members call it (the picker's name), shown on its replies

    def stream(
        self, messages: list[dict], tools: list[dict], *, cancel: CancelToken
    ) -> Iterator[Chunk]:
        """Yield text deltas, then exactly one ``TurnEnd``; raise ``LLMError``."""
        ...


def new_call_id() -> str:
    return "call_" + secrets.token_hex(8)
