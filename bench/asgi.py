"""Studio for benchmarks: the real application, a scripted model and a free tool.

The model answers instantly from a script and the ``echo`` tool costs
nothing, so what is measured is Studio itself: the gate, the audit row, the
channel layer and the rendering. Serve with ``daphne bench.asgi:application``.
"""

from __future__ import annotations

import time

from studio.asgi import application  # noqa: F401 - sets Django up first  # isort: skip

import chat.runs.driver  # noqa: E402
import chat.tools  # noqa: E402
from chat.llm.base import TextDelta, ToolCall, TurnEnd, new_call_id  # noqa: E402
from chat.tools.base import Tool, ToolResult  # noqa: E402

ECHO = Tool(
    name="echo",
    description="Return the text it is given.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    run=lambda arguments, **_: ToolResult(arguments["text"]),
)
chat.tools.ALWAYS = (*chat.tools.ALWAYS, ECHO)


class BenchModel:
    """``echo X`` -> one echo call; ``stream N`` -> N tokens; after a tool: "ok"."""

    name = "bench"
    label = "bench"

    def stream(self, messages, tools, *, cancel):
        last = messages[-1]
        if last["role"] == "tool":
            yield TextDelta("ok")
            yield TurnEnd(content="ok")
            return
        text = str(last.get("content") or "")
        if text.startswith("stream "):
            # "stream N" as fast as possible, "stream N R" paced at R tokens/s.
            parts = text.split()
            tokens = [f"tok{i} " for i in range(int(parts[1]))]
            rate = float(parts[2]) if len(parts) > 2 else 0.0
            start = time.monotonic()
            for i, token in enumerate(tokens):
                if rate and i % 10 == 0:
                    delay = start + i / rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                yield TextDelta(token)
            yield TurnEnd(content="".join(tokens))
            return
        argument = text[5:] if text.startswith("echo ") else text
        yield TurnEnd(content="", tool_calls=[ToolCall(new_call_id(), "echo", {"text": argument})])


def bench_model(choice: str = "") -> BenchModel:
    """Every conversation's model, whatever was picked."""
    return BenchModel()


chat.runs.driver.get_model = bench_model
