"""MCP tools and images in Chromium, against a live daphne with the demo model."""

from __future__ import annotations

import os
import re
import sys

import pytest

from tests.browser.ui import card_for, login, new_chat, start_chat
from tests.helpers.procs import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("root_sandbox")]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

SERVER = ROOT / "tests" / "helpers" / "mcp_server.py"


def test_an_admin_adds_an_mcp_server_and_its_gated_tool_runs(
    page, studio_server, admin_member, artifacts
):
    login(page, studio_server, "ada")
    page.goto(studio_server.url + "/admin/chat/mcpserver/add/")
    page.fill("input[name=name]", "tools")
    page.fill("input[name=command]", f"{sys.executable} {SERVER} stdio")
    page.fill("textarea[name=environment]", "TEAM_TOKEN=not-shown-again")
    page.click("input[name=_save]")
    page.locator("text=was added successfully").wait_for()
    page.screenshot(path=str(artifacts / "20-admin-mcp-server.png"))

    page.goto(studio_server.url + "/")
    new_chat(page)
    card = card_for(page, 'call tools__remove {"path": "notes.txt"}')
    assert card.locator(".tool-name").inner_text() == "tools › remove"
    assert card.locator(".hint").all_inner_texts() == ["destructive", "open-world"]
    page.screenshot(path=str(artifacts / "21-mcp-card-with-hints.png"))
    card.locator("button[value=allow]").click()
    page.locator(".tool-result pre", has_text="removed notes.txt").wait_for()
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")
    # The settings panel lists the server's tools, switched on.
    assert page.locator('[data-mcp-server="tools"] input[value="tools__echo"]').is_checked()


def test_a_plot_appears_as_a_picture(page, studio_server, admin_member, artifacts):
    start_chat(page, studio_server, "ada")
    card = card_for(
        page, "run python: import matplotlib.pyplot as plt; plt.plot([1, 3, 2]); plt.show()"
    )
    card.locator("button[value=allow]").click()
    image = page.locator(".tool-images img").first
    image.wait_for()
    # Studio's own copy, under a key of its own: never the workspace's file.
    assert re.search(r"/files/[\w-]{12}/figure-\d+\.png$", image.get_attribute("src"))
    page.wait_for_function(
        "img => img.complete && img.naturalWidth > 100", arg=image.element_handle()
    )
    page.screenshot(path=str(artifacts / "22-plot-inline.png"))
