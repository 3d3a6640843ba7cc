"""The team's approvals in Chromium: a Review call decided by a reviewer from the inbox."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth.hashers import make_password

from approvals.models import ToolApproval, ToolRule
from tests.browser.ui import TIMEOUT, ask, login, new_chat, output, pending_card, run_finished
from tests.factories import PASSWORD, make_reviewer

pytestmark = pytest.mark.django_db(transaction=True)
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop

COUNT = "#approvals-count"


@pytest.fixture
def reviewer(settings):
    user = make_reviewer("bob")
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    user.password = make_password(PASSWORD)
    user.save(update_fields=["password"])
    return user


def count_is(page, n: int) -> None:
    page.wait_for_selector(f'{COUNT}[data-pending-count="{n}"]', state="attached")


def test_a_reviewer_allows_a_review_call_from_the_inbox(
    browser, studio_server, member, reviewer, artifacts
):
    ToolRule.objects.create(tool="terminal", action="review", note="Shell needs a second pair.")
    contexts = [browser.new_context(viewport={"width": 1280, "height": 900}) for _ in range(2)]
    carol, bob = (c.new_page() for c in contexts)
    for page in (carol, bob):
        page.context.set_default_timeout(TIMEOUT)
    login(bob, studio_server, "bob")
    bob.goto(studio_server.url + "/approvals/")
    bob.locator(".inbox-empty:not([hidden])").wait_for()
    login(carol, studio_server, "carol")
    new_chat(carol)

    ask(carol, "$ echo four-eyes")
    card = pending_card(carol)
    card.wait_for()
    assert card.locator("[data-review-note]").count() == 1
    assert card.locator("button[value=allow]").count() == 0  # hers to deny, not to allow
    assert card.locator("button[value=deny]").count() == 1
    # It waits on Bob, not on her: her header does not count it (issue 37).
    count_is(carol, 0)
    assert carol.locator(COUNT).is_hidden()
    assert not carol.title().startswith("(")

    # The call arrives in Bob's open inbox by itself.
    entry = bob.locator(".inbox-entry").first
    entry.wait_for()
    count_is(bob, 1)
    bob.wait_for_function("document.title.startsWith('(1) ')")
    assert "asked by carol" in entry.inner_text()
    assert entry.locator(".badge", has_text="Waiting for your review").count() == 1
    bob.screenshot(path=str(artifacts / "40-inbox-review.png"), full_page=True)
    entry.locator("button[value=allow]").click()

    output(carol, "four-eyes").wait_for()
    run_finished(carol)
    count_is(carol, 0)
    count_is(bob, 0)
    assert not carol.locator(COUNT).is_visible() and not bob.locator(COUNT).is_visible()
    assert not carol.title().startswith("(")
    bob.locator(".inbox-empty:not([hidden])").wait_for()  # the entry left the inbox
    assert bob.locator(".inbox-entry").count() == 0
    decided = carol.locator('[data-approval-id][data-status="allowed"]')
    assert "Allowed by bob" in decided.inner_text()
    carol.screenshot(path=str(artifacts / "41-reviewed-output.png"), full_page=True)
    row = ToolApproval.objects.get()
    assert (row.requested_by.username, row.decided_by.username) == ("carol", "bob")
    for context in contexts:
        context.close()


def test_the_reviewer_can_read_the_chat_but_not_write(browser, studio_server, member, reviewer):
    ToolRule.objects.create(tool="terminal", action="review")
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT)
    carol = context.new_page()
    login(carol, studio_server, "carol")
    chat_url = new_chat(carol)
    ask(carol, "$ echo context")
    pending_card(carol).wait_for()
    other = browser.new_context()
    other.set_default_timeout(TIMEOUT)
    bob = other.new_page()
    login(bob, studio_server, "bob")
    bob.goto(studio_server.url + "/approvals/")
    bob.locator(".inbox-context a").first.click()
    bob.wait_for_url(chat_url + "#approval-*")
    bob.locator("[data-read-only]").wait_for()
    assert bob.locator("#message-input").count() == 0 and bob.locator("#settings").count() == 0
    assert bob.locator(".msg-user", has_text="$ echo context").count() == 1
    pending_card(bob).locator("button[value=deny]").click()
    run_finished(carol)
    context.close()
    other.close()
