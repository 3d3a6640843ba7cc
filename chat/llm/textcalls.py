"""Tool calls written as text: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

For servers without native tool calling. Models damage the JSON in a few
common ways; ``parse_json_lenient`` heals code fences, trailing commas,
single quotes and missing closing braces before giving up.
"""

from __future__ import annotations

import json
import re

from chat.llm.base import ToolCall, new_call_id
from studio.text import strip_nul_json

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_CODE_FENCE = re.compile(r"```.*?(?:```|\Z)", re.S)
_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*|\s*```\s*$")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def split_text_calls(content: str, *, quoted: list[str] = ()) -> tuple[str, list[ToolCall]]:
    """The visible text before the first call, and the parsed calls.

    Only the model's own words are calls. A block that stands in a fenced
    code block, or that appears word for word in ``quoted`` (the tool
    results and user messages the model was sent), is the model quoting
    something back, so it stays text and runs nothing: a fetched page that
    says ``<tool_call>`` must not turn into a call because the model repeats it.
    """
    if OPEN not in content:
        return content, []
    fences = [m.span() for m in _CODE_FENCE.finditer(content)]
    calls: list[ToolCall] = []
    first_call = None
    for match in _BLOCK.finditer(content):
        inside_fence = any(start <= match.start() < end for start, end in fences)
        inner = match.group(1).strip()
        if inside_fence or any(inner and inner in text for text in quoted if text):
            continue
        if first_call is None:
            first_call = match.start()
        calls.append(_to_call(match.group(1)))
    if first_call is None:
        return content, []
    return content[:first_call].rstrip(), calls


def _to_call(block: str) -> ToolCall:
    try:
        data = parse_json_lenient(block)
    except ValueError as exc:
        return ToolCall(id=new_call_id(), name="", arguments=None, error=str(exc))
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return ToolCall(
            id=new_call_id(),
            name="",
            arguments=None,
            error='a tool call must be {"name": ..., "arguments": {...}}',
        )
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = parse_json_lenient(arguments)
        except ValueError as exc:
            return ToolCall(id=new_call_id(), name=data["name"], arguments=None, error=str(exc))
    if not isinstance(arguments, dict):
        return ToolCall(
            id=new_call_id(), name=data["name"], arguments=None, error="arguments must be an object"
        )
    return ToolCall(id=new_call_id(), name=data["name"], arguments=strip_nul_json(arguments))


def parse_json_lenient(text: str) -> object:
    text = _FENCE.sub("", text.strip()).strip()
    if not text:
        raise ValueError("empty tool call")
    attempts = [text]
    healed = _TRAILING_COMMA.sub(r"\1", text)
    attempts.append(healed)
    if "'" in healed and '"' not in healed:
        attempts.append(healed.replace("'", '"'))
    balanced = _close_brackets(attempts[-1])
    attempts.append(balanced)
    attempts.append(_TRAILING_COMMA.sub(r"\1", balanced))
    last_error = None
    for attempt in attempts:
        try:
            return json.loads(attempt)
        except json.JSONDecodeError as exc:
            last_error = exc
    raise ValueError(f"could not parse the tool call as JSON ({last_error})")


def _close_brackets(text: str) -> str:
    """Append the closing braces/brackets (and quote) a truncated object lacks."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    return text + ('"' if in_string else "") + "".join(reversed(stack))


def holdback(content: str) -> int:
    """How many trailing characters might be the start of ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(content)), 0, -1):
        if OPEN.startswith(content[-n:]):
            return n
    return 0


def parse_arguments(raw: str) -> tuple[dict | None, str]:
    """Native tool-call arguments (a JSON string) -> (dict, "") or (None, error)."""
    if not raw.strip():
        return {}, ""
    try:
        value = parse_json_lenient(raw)
    except ValueError as exc:
        return None, str(exc)
    if not isinstance(value, dict):
        return None, "arguments must be a JSON object"
    return value, ""
