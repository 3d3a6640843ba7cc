from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

_FENCE = re.compile(r"```([\w+-]*)[ \t]*\n?(.*?)```", re.S)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*([^*\n]+)\*\*")
_LINK = re.compile(r"(?<![\"'=])(https?://[^\s<]+[^\s<.,;:!?)\]'\"])")

COLLAPSE_LINES = 15


@register.filter
def markdown_lite(text: str) -> SafeString:
    """Escape first, then a safe subset: code fences, `code`, **bold**, links, paragraphs."""
    parts: list[str] = []
    last = 0
    for match in _FENCE.finditer(text or ""):
        parts.append(_inline(text[last : match.start()]))
        lang = escape(match.group(1))
        parts.append(
            f'<pre class="code" data-lang="{lang}"><code>{escape(match.group(2))}</code></pre>'
        )
        last = match.end()
    parts.append(_inline((text or "")[last:]))
    return mark_safe("".join(parts))  # noqa: S308 - every piece is escaped above


def _inline(chunk: str) -> str:
    if not chunk.strip():
        return ""
    html = escape(chunk)
    html = _INLINE_CODE.sub(r"<code>\1</code>", html)
    html = _BOLD.sub(r"<strong>\1</strong>", html)
    html = _LINK.sub(r'<a href="\1" rel="noopener noreferrer" target="_blank">\1</a>', html)
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", html) if p.strip()]
    return "".join(f"<p>{p.replace(chr(10), '<br>')}</p>" for p in paragraphs)


@register.filter
def line_count(text: str) -> int:
    return (text or "").count("\n") + 1


@register.filter
def is_long(text: str) -> bool:
    text = text or ""
    return text.count("\n") >= COLLAPSE_LINES or len(text) > 2000
