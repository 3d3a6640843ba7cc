"""The built-in offline demo model: deterministic, no network, no weights.

It turns a few request shapes into tool calls so the whole approval flow can
be tried without a model server:

* a fenced python block, or ``run python: <code>`` -> ``python``
* ``$ <command>`` or ``run: <command>``             -> ``terminal``
  (several ``$`` lines: one call each, in one turn)
* a bare http(s) URL                               -> ``web_fetch``
* ``search: <query>``                              -> ``web_search``
* ``call <tool> {json arguments}``                 -> any tool (an MCP server's too)

After tool results it answers with a short summary of them; anything else
gets an explanation of what it is and how to connect a real model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from chat.llm.base import Chunk, TextDelta, ToolCall, TurnEnd, new_call_id
from studio.cancel import CancelToken
from studio.wording import REJECTION_TEXT

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.S | re.I)
_RUN_PYTHON = re.compile(r"^\s*run python:\s*(.+)$", re.S | re.I)
_SHELL = re.compile(r"^\s*(?:\$|run:)\s*(.+)$", re.S | re.I)
_URL = re.compile(r"^\s*(https?://\S+)\s*$", re.I)
_SEARCH = re.compile(r"^\s*search:\s*(.+)$", re.S | re.I)
_CALL = re.compile(r"^\s*call\s+([A-Za-z0-9_-]+)\s*(\{.*\})?\s*$", re.S)

INTRO = (
    "I'm Studio's built-in **demo model**: I run offline, I don't understand language, "
    "and my answers are canned. To chat with a real model, set `LLM_BASE_URL` (plus "
    "`LLM_MODEL` and `LLM_API_KEY`) to any OpenAI-compatible server — llama.cpp's "
    "llama-server, vLLM, Ollama, LM Studio or OpenAI — and restart Studio.\n\n"
    "Meanwhile I can show you the tool approvals. Try:\n"
    "- `run python: print(2 + 2)` or a fenced ```python block\n"
    "- `$ ls -la` or `run: uname -a`\n"
    "- a bare URL such as `https://example.com`\n"
    "- `search: django channels` (when a search engine is set up)\n"
    '- `call <tool> {"arg": "value"}` for any enabled tool, an MCP server\'s too'
)


class DemoModel:
    name = "demo"
    label = "Demo model"

    def stream(
        self, messages: list[dict], tools: list[dict], *, cancel: CancelToken
    ) -> Iterator[Chunk]:
        text, calls = self.reply(messages, {t["function"]["name"] for t in tools})
        for word in re.findall(r"\S+\s*|\s+", text):
            if cancel.is_set():
                break
            yield TextDelta(word)
        yield TurnEnd(content=text, tool_calls=calls)

    def reply(self, messages: list[dict], enabled: set[str]) -> tuple[str, list[ToolCall]]:
        if not messages:
            return INTRO, []
        last = messages[-1]
        if last["role"] == "tool":
            return self._summarise(messages), []
        if last["role"] != "user":
            return INTRO, []
        return self._plan(str(last.get("content") or ""))

    @staticmethod
    def _plan(request: str) -> tuple[str, list[ToolCall]]:
        fence = _FENCE.search(request)
        if fence:
            return _call("I'll run this Python code.", "python", {"code": fence.group(1).rstrip()})
        match = _RUN_PYTHON.match(request)
        if match:
            return _call("I'll run this Python code.", "python", {"code": match.group(1).strip()})
        lines = [line.strip() for line in request.strip().splitlines() if line.strip()]
        if len(lines) > 1 and all(line.startswith("$ ") for line in lines):
            calls = [
                ToolCall(id=new_call_id(), name="terminal", arguments={"command": line[2:].strip()})
                for line in lines
            ]
            return f"I'll run these {len(calls)} commands.", calls
        match = _SHELL.match(request)
        if match:
            return _call("I'll run this command.", "terminal", {"command": match.group(1).strip()})
        match = _URL.match(request)
        if match:
            return _call("I'll fetch that page.", "web_fetch", {"url": match.group(1)})
        match = _SEARCH.match(request)
        if match:
            return _call("I'll search the web.", "web_search", {"query": match.group(1).strip()})
        match = _CALL.match(request)
        if match:
            try:
                arguments = json.loads(match.group(2) or "{}")
            except ValueError:
                return "Those arguments are not valid JSON.", []
            if isinstance(arguments, dict):
                return _call(f"I'll call {match.group(1)}.", match.group(1), arguments)
        return INTRO, []

    @staticmethod
    def _summarise(messages: list[dict]) -> str:
        results = []
        for message in reversed(messages):
            if message["role"] != "tool":
                break
            results.append(message)
        names = {}
        for message in messages:
            for call in message.get("tool_calls") or []:
                names[call["id"]] = call["function"]["name"]
        parts = []
        for result in reversed(results):
            name = names.get(result.get("tool_call_id"), "tool")
            content = str(result.get("content") or "")
            if content.startswith(REJECTION_TEXT):
                parts.append(f"You declined the `{name}` call, so I did not run it.")
            elif content.startswith("Error"):
                parts.append(f"The `{name}` call did not succeed:\n\n```\n{_clip(content)}\n```")
            else:
                parts.append(f"The `{name}` tool returned:\n\n```\n{_clip(content)}\n```")
        parts.append("(Demo model: that is all I can say about it.)")
        return "\n\n".join(parts)


def _call(text: str, name: str, arguments: dict) -> tuple[str, list[ToolCall]]:
    return text, [ToolCall(id=new_call_id(), name=name, arguments=arguments)]


def _clip(text: str, limit: int = 1500) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "\n…"
