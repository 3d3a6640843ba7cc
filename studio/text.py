"""Text that crosses into Studio from people, models and tools.

PostgreSQL refuses NUL characters in text and in ``jsonb``, and they serve no
one in a chat, so every boundary strips them the same way: user messages and
notes, model output, tool-call arguments and tool output.
"""

from __future__ import annotations

import json

NUL = "\x00"


def strip_nul(text: str) -> str:
    return text.replace(NUL, "") if NUL in text else text


def strip_nul_json(value: object) -> object:
    """``value`` with NULs removed from every string in it, keys included."""
    if isinstance(value, str):
        return strip_nul(value)
    if isinstance(value, dict):
        return {strip_nul(str(k)): strip_nul_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_nul_json(v) for v in value]
    return value


def canonical_json(value: object) -> str:
    """One spelling of a JSON value: the arguments' hash and the rules' subject use it."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def short(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
