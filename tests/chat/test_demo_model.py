from __future__ import annotations

import pytest

from chat.llm.base import TextDelta, TurnEnd
from chat.llm.demo import DemoModel
from chat.tools import builtin_tools
from studio.cancel import CancelToken
from studio.wording import REJECTION_TEXT

TOOLS = [tool.schema() for tool in builtin_tools().values()]


def ask(messages: list[dict]) -> tuple[list[str], TurnEnd]:
    chunks = list(DemoModel().stream(messages, TOOLS, cancel=CancelToken()))
    return [c.text for c in chunks if isinstance(c, TextDelta)], chunks[-1]


@pytest.mark.parametrize(
    ("text", "tool", "arguments"),
    [
        ("```python\nprint(2 + 2)\n```", "python", {"code": "print(2 + 2)"}),
        ("please run this\n```py\nx = 1\nprint(x)\n```", "python", {"code": "x = 1\nprint(x)"}),
        ("run python: print('hi')", "python", {"code": "print('hi')"}),
        ("$ ls -la", "terminal", {"command": "ls -la"}),
        ("run: uname -a", "terminal", {"command": "uname -a"}),
        ("https://example.com/page?q=1", "web_fetch", {"url": "https://example.com/page?q=1"}),
    ],
)
def test_requests_become_tool_calls(text, tool, arguments):
    _, end = ask([{"role": "user", "content": text}])
    assert [(c.name, c.arguments) for c in end.tool_calls] == [(tool, arguments)]


def test_plain_text_gets_the_introduction_streamed_word_by_word():
    deltas, end = ask([{"role": "user", "content": "hello there"}])
    assert end.tool_calls == []
    assert "demo model" in end.content and "LLM_BASE_URL" in end.content
    assert len(deltas) > 20 and "".join(deltas) == end.content


def _after(result: str) -> TurnEnd:
    call = {"id": "c1", "type": "function", "function": {"name": "python", "arguments": "{}"}}
    return ask(
        [
            {"role": "user", "content": "run python: print(4)"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": result},
        ]
    )[1]


def test_summarises_a_tool_result():
    end = _after("4\n")
    assert end.tool_calls == []
    assert "The `python` tool returned" in end.content and "4" in end.content


def test_acknowledges_a_declined_call():
    end = _after(REJECTION_TEXT)
    assert "You declined the `python` call" in end.content


def test_reports_an_error_result():
    assert "did not succeed" in _after("Error: exited with status 1.").content
