"""The ``web_search`` tool: a SearxNG instance's JSON API (STUDIO_SEARXNG_URL).

The engine is the admin's own service (often on a private address), so the
search itself is not address-guarded like ``web_fetch``; what comes back is
capped and shown as text: title, URL and snippet per result.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from django.conf import settings

from chat.tools.base import Tool, ToolResult
from studio.cancel import CancelToken
from studio.text import strip_nul

MAX_RESULTS = 10
SNIPPET = 300
TIMEOUT = 15.0


def run(arguments: dict, *, cancel: CancelToken, timeout: float, workspace: Path) -> ToolResult:
    query = arguments["query"].strip()
    if not query:
        return ToolResult.error("the query is empty.")
    count = max(1, min(int(arguments.get("count", 5)), MAX_RESULTS))
    base = settings.STUDIO_SEARXNG_URL
    try:
        with httpx.Client(timeout=min(timeout, TIMEOUT), trust_env=False) as client:
            response = client.get(
                f"{base}/search", params={"q": query, "format": "json"}, follow_redirects=False
            )
    except httpx.HTTPError as exc:
        return ToolResult.error(f"the search engine at {base} could not be reached ({exc}).")
    if response.status_code != 200:
        return ToolResult.error(f"the search engine answered HTTP {response.status_code}.")
    try:
        results = response.json().get("results", [])
    except (ValueError, AttributeError):
        return ToolResult.error("the search engine sent something that is not search results.")
    lines = []
    for result in results[:count]:
        if not isinstance(result, dict):
            continue
        title = strip_nul(str(result.get("title") or "")).strip()
        url = strip_nul(str(result.get("url") or "")).strip()
        snippet = " ".join(strip_nul(str(result.get("content") or "")).split())
        if len(snippet) > SNIPPET:
            snippet = snippet[: SNIPPET - 1] + "…"
        lines.append(f"{len(lines) + 1}. {title}\n   {url}\n   {snippet}".rstrip())
    if not lines:
        return ToolResult(f"No results for {query!r}.")
    return ToolResult(f"Results for {query!r}:\n\n" + "\n".join(lines))


TOOL = Tool(
    name="web_search",
    description="Search the web; returns titles, URLs and snippets of the top results.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to search for."},
            "count": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_RESULTS,
                "description": f"How many results (1-{MAX_RESULTS}, default 5).",
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    run=run,
)
