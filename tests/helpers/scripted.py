"""A scripted model: plays back turns and records what it was sent."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from chat.llm.base import LLMError, TextDelta, ToolCall, TurnEnd

Turn = tuple[str, list[ToolCall]] | Callable[[list[dict]], tuple[str, list[ToolCall]]] | Exception


class ScriptedModel:
    name = "scripted"
    label = "Scripted"

    def __init__(self, turns: list[Turn], *, repeat_last: bool = False) -> None:
        self.turns = list(turns)
        self.repeat_last = repeat_last
        self.seen: list[list[dict]] = []

    def stream(self, messages, tools, *, cancel) -> Iterator:
        self.seen.append(messages)
        if not self.turns:
            raise AssertionError("the model was called more often than scripted")
        turn = self.turns[0] if (self.repeat_last and len(self.turns) == 1) else self.turns.pop(0)
        if isinstance(turn, Exception):
            raise turn
        if callable(turn):
            turn = turn(messages)
        text, calls = turn
        for word in text.split(" "):
            if word:
                yield TextDelta(word + " ")
        yield TurnEnd(content=text, tool_calls=calls)


def call(name: str, arguments: dict, call_id: str = "") -> ToolCall:
    return ToolCall(
        id=call_id or f"call_{name}_{abs(hash(str(arguments))) % 10**8}",
        name=name,
        arguments=arguments,
    )


def failing(message: str = "server down") -> LLMError:
    return LLMError(message)
