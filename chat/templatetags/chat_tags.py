from __future__ import annotations

import functools
import re
from html import escape as html_escape
from html import unescape as html_unescape
from pathlib import PurePosixPath
from urllib.parse import unquote

import nh3
from django import template
from django.urls import get_script_prefix, reverse
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

register = template.Library()

COLLAPSE_LINES = 15

# CommonMark with tables, strikethrough and bare links; raw HTML is *not*
# passed through (it is shown as text), and nh3 cleans what comes out anyway.
_MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": True}).enable(
    ["table", "strikethrough", "linkify"]
)
_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "s", "code", "pre", "blockquote",
    "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td", "a",
}  # fmt: skip
_ATTRIBUTES = {"a": {"href", "title"}, "code": {"class"}, "ol": {"start"}}
# Built once: ``nh3.clean`` with options builds its sanitizer on every call
# (11 of its 14 us for a one-line reply, measured here), and a page draws
# one reply per assistant message.
_CLEANER = nh3.Cleaner(
    tags=_TAGS,
    attributes=_ATTRIBUTES,
    url_schemes={"http", "https", "mailto"},
    link_rel="noopener noreferrer nofollow",
    set_tag_attribute_values={"a": {"target": "_blank"}},
)


# The model links a workspace file as [name](workspace:path); markdown-it
# writes the href percent-encoded, and the download view checks the path.
_WORKSPACE_LINK = re.compile(r'href="workspace:([^"]*)"')


# A page, a reconnecting tab and every open tab of a chat draw the same
# replies again; their Markdown (bare links above all) is the costliest part
# of drawing them. Replies up to this size are kept, drawn, per process.
_KEPT_REPLY_CHARS = 8192


@register.filter
def markdown(text: str, conversation_id: int | None = None) -> SafeString:
    """The model's Markdown as safe HTML: rendered, then sanitized. With the
    conversation, ``workspace:`` links become downloads of its workspace files."""
    text = text or ""
    if len(text) <= _KEPT_REPLY_CHARS:
        # (Download links carry the deployment's prefix: part of the key.)
        return _markdown_kept(text, conversation_id, get_script_prefix())
    return _markdown(text, conversation_id)


@functools.lru_cache(maxsize=1024)
def _markdown_kept(text: str, conversation_id: int | None, prefix: str) -> SafeString:
    return _markdown(text, conversation_id)


def _markdown(text: str, conversation_id: int | None) -> SafeString:
    html = _MARKDOWN.render(text)
    if conversation_id:
        html = _WORKSPACE_LINK.sub(lambda m: _download_href(conversation_id, m.group(1)), html)
    return mark_safe(_CLEANER.clean(html))  # noqa: S308 - sanitized by nh3 just here


def _download_href(conversation_id: int, encoded: str) -> str:
    path = unquote(html_unescape(encoded))
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or any(p in (".", "..") for p in parts):
        return 'href=""'  # not a path in the workspace: the link leads nowhere
    url = reverse("chat:download", args=[conversation_id, path])
    return f'href="{html_escape(url)}"'


@register.filter
def first_line(text: str) -> str:
    return (text or "").split("\n", 1)[0]


@register.filter
def after_first_line(text: str) -> str:
    """The rest of a result whose first line is for the model (a stop's)."""
    return (text or "").split("\n", 1)[1].strip("\n") if "\n" in (text or "") else ""


@register.filter
def line_count(text: str) -> int:
    return (text or "").count("\n") + 1


@register.filter
def is_long(text: str) -> bool:
    text = text or ""
    return text.count("\n") >= COLLAPSE_LINES or len(text) > 2000


# A long message shows this much, and the rest folded.
FOLD_LINES = 8
FOLD_CHARS = 800


@register.filter
def fold(text: str) -> tuple[str, str]:
    """(what shows, what is folded: empty when the text is not long)."""
    text = text or ""
    if not is_long(text):
        return text, ""
    head = "\n".join(text.split("\n")[:FOLD_LINES])[:FOLD_CHARS]
    return head, text[len(head) :]
