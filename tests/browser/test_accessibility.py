"""axe-core on the pages people decide on: the chat with a waiting card, the inbox,
the admin's approvals list. No serious or critical violation."""

from __future__ import annotations

import os

import pytest
from axe_playwright_python.sync_playwright import Axe

from tests.browser.ui import card_for, login, start_chat
from tests.factories import make_approval, make_conversation

pytestmark = pytest.mark.django_db(transaction=True)
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

SERIOUS = ("serious", "critical")


def serious_violations(page) -> list[str]:
    results = Axe().run(page)
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — "
        + "; ".join(n["target"][0] for n in v["nodes"][:3])
        for v in results.response["violations"]
        if v["impact"] in SERIOUS
    ]


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_the_chat_with_a_waiting_card(browser, studio_server, member, width):
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        start_chat(page, studio_server)
        card_for(page, "run python: print(2 + 2)")
        assert serious_violations(page) == []
    finally:
        context.close()


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_the_inbox(browser, studio_server, member, width):
    make_approval(make_conversation(member, title="Budget"), tool_name="terminal",
                  arguments={"command": "ls -la"}, subject="ls -la")  # fmt: skip
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        login(page, studio_server)
        page.goto(studio_server.url + "/approvals/")
        page.locator(".inbox-entry").first.wait_for()
        assert serious_violations(page) == []
    finally:
        context.close()


def test_the_admin_approvals_list(browser, studio_server, admin_member, member):
    chat = make_conversation(member, title="Budget")
    make_approval(chat, status="allowed", reason="user", decided_by=member)
    make_approval(chat)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        login(page, studio_server, "ada")
        page.goto(studio_server.url + "/admin/approvals/toolapproval/")
        page.locator("#result_list").wait_for()
        assert serious_violations(page) == []
    finally:
        context.close()
