"""Model replies are Markdown: rendered with markdown-it-py, cleaned with nh3."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from chat.templatetags.chat_tags import markdown

XSS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD4=)",
    "![x](javascript:alert(1))",
    '<a href="javascript:alert(1)">x</a>',
    "<iframe src=//evil></iframe>",
    "<svg onload=alert(1)>",
    '<div style="background:url(javascript:alert(1))">x</div>',
    "`<script>` and ```\n<script>alert(1)</script>\n```",
    '[x](https://ok.example "t" onmouseover=alert(1))',
    "<details open ontoggle=alert(1)>",
    "<<script>script>alert(1)<</script>/script>",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
]


class Elements(HTMLParser):
    """Every element and attribute the browser would build from the output."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.found.append((tag, attrs))


ALLOWED = {"p", "a", "code", "pre", "strong", "em", "ul", "ol", "li", "br", "blockquote"}


@pytest.mark.parametrize("probe", XSS)
def test_no_probe_becomes_markup_that_runs(probe):
    parser = Elements()
    parser.feed(str(markdown(probe)))
    for tag, attrs in parser.found:
        assert tag in ALLOWED, (tag, probe)
        for name, value in attrs:
            assert not name.startswith("on") and name != "style", (name, probe)
            if name in ("href", "src"):
                assert (value or "").startswith(("http://", "https://", "mailto:")), probe


def test_raw_html_is_shown_as_text():
    assert str(markdown("<b>bold?</b>")) == "<p>&lt;b&gt;bold?&lt;/b&gt;</p>\n"


def test_tables_render():
    html = str(markdown("| tool | calls |\n|---|---:|\n| python | 3 |\n| terminal | 1 |"))
    assert "<table>" in html and "<th>tool</th>" in html
    assert re.findall(r"<td>(.*?)</td>", html) == ["python", "3", "terminal", "1"]


def test_lists_render():
    html = str(markdown("Steps:\n\n1. fetch\n2. parse\n\n- a\n  - nested\n- b"))
    assert re.search(r"<ol>\s*<li>fetch</li>\s*<li>parse</li>\s*</ol>", html)
    assert "<ul>" in html and html.count("<ul>") == 2 and "<li>nested</li>" in html


def test_code_headings_emphasis_and_links():
    html = str(
        markdown(
            "# Title\n\n**b** *i* ~~s~~ `x<y`\n\n```py\nif a < b:\n    pass\n```\n\nsee https://example.com"
        )
    )
    assert "<h1>Title</h1>" in html
    assert "<strong>b</strong>" in html and "<em>i</em>" in html and "<s>s</s>" in html
    assert "<code>x&lt;y</code>" in html
    assert '<pre><code class="language-py">if a &lt; b:' in html
    assert (
        '<a href="https://example.com" target="_blank" rel="noopener noreferrer nofollow">' in html
    )


def test_a_reply_drawn_again_is_kept_drawn_and_a_long_one_is_not():
    from chat.templatetags.chat_tags import _KEPT_REPLY_CHARS, _markdown_kept

    reply = "Kept? See https://example.com/kept-reply and **this**."
    first = markdown(reply, 7)
    hits = _markdown_kept.cache_info().hits
    assert markdown(reply, 7) == first and _markdown_kept.cache_info().hits == hits + 1
    # Another conversation's download links differ: drawn for it.
    assert markdown(reply, 8) == first and _markdown_kept.cache_info().hits == hits + 1
    long = "word " * (_KEPT_REPLY_CHARS // 5 + 1)
    misses = _markdown_kept.cache_info().misses
    assert markdown(long) == markdown(long)
    assert _markdown_kept.cache_info().misses == misses  # never kept


def test_a_kept_reply_keeps_its_deployment_prefix_in_download_links():
    from django.urls import set_script_prefix

    reply = "[the report](workspace:report.csv)"
    try:
        set_script_prefix("/studio/")
        assert 'href="/studio/c/7/workspace/report.csv"' in markdown(reply, 7)
    finally:
        set_script_prefix("/")
    assert 'href="/c/7/workspace/report.csv"' in markdown(reply, 7)
