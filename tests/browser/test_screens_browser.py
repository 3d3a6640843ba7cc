"""Issue 37 at 390, 1024 and 1280 px in Chromium: the safe choice first,
failures in words, the small mends, and the admin's audit list."""

from __future__ import annotations

import os
import re

import pytest

from tests.browser.ui import card_for, login, new_chat, run_finished

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop

WIDTHS = [390, 1024, 1280]


def fits(page, width: int) -> None:
    assert page.evaluate("document.documentElement.scrollWidth") <= width


@pytest.mark.parametrize("width", WIDTHS)
def test_the_narrowest_always_allow_comes_first_and_failures_read_as_words(
    sized, studio_server, member, width
):
    page = sized
    login(page, studio_server)
    # The empty state reads as a sentence.
    empty = page.locator("#conversation-list .empty").inner_text()
    assert empty == "No conversations yet. Start one with New chat."
    new_chat(page)

    card = card_for(page, "$ rm -rf build")
    card.locator("summary", has_text="Always allow").click()
    choices = card.locator(".always-menu label.choice:has(input[type=radio])")
    assert [text.strip() for text in choices.all_inner_texts()] == [
        "this exact command",
        "commands starting with “rm -rf”",
        "commands starting with “rm”",
        "every terminal call in this chat, whatever it does",
    ]
    assert choices.first.locator("input").is_checked()
    box = card.locator(".always-menu").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width
    card.locator("button[value=deny]").click()
    run_finished(page)

    # A call that needed the network is told, in words, that tools have none.
    code = "import urllib.request; urllib.request.urlopen('http://example.com', timeout=5)"
    card = card_for(page, f"run python: {code}")
    # Said before anyone approves it, beside the buttons, not under the fold.
    warned = card.locator("[data-no-network]")
    assert "this code opens network connections" in warned.inner_text()
    box = warned.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width
    card.locator("button[value=allow]").click()
    said = page.locator(".tool-error-line", has_text="exited with status 1")
    said.wait_for()  # above the folded traceback, not inside it
    assert "Tools run without a network" in said.inner_text() and said.is_visible()
    run_finished(page)
    fits(page, width)

    # No page asks for a favicon that is not there.
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert page.request.get(studio_server.url + icon).status == 200


@pytest.mark.parametrize("width", WIDTHS)
def test_the_lockout_page_says_how_long_the_pause_lasts(sized, studio_server, member, width):
    page = sized
    for _ in range(6):
        page.goto(studio_server.url + "/accounts/login/")
        page.fill("input[name=username]", "carol")
        page.fill("input[name=password]", "not the password")
        page.click("button[type=submit]")
        if page.locator("[data-locked-out]").count():
            break
    text = page.locator("[data-locked-out]").inner_text()
    assert re.search(r"paused for 15 minutes after 5 wrong passwords", text), text
    fits(page, width)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_admin_audit_list_is_read_only_and_says_each_state(
    sized, studio_server, admin_member, member, width
):
    from approvals.models import ToolApproval
    from tests.factories import make_approval, make_conversation

    conversation = make_conversation(member, title="Audit me")
    for status, reason in [("denied", "cancelled"), ("denied", "timeout"), ("denied", "user")]:
        make_approval(conversation, status=status, reason=reason)
    page = sized
    login(page, studio_server, username=admin_member.get_username())
    page.goto(studio_server.url + "/admin/approvals/toolapproval/")
    body = page.locator("#result_list").inner_text()
    for label in ("Cancelled", "Timed out", "Denied"):
        assert label in body, label
    # No delete, not even for a superuser: no action, no button.
    assert page.locator("select[name=action] option[value=delete_selected]").count() == 0
    page.locator("#result_list tbody tr a").first.click()
    page.wait_for_load_state("load")
    assert page.locator("a.deletelink").count() == 0
    assert ToolApproval.objects.count() == 3
    if width >= 1024:
        fits(page, width)
