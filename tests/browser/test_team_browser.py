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


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_a_reviewer_allows_a_review_call_from_the_inbox(
    browser, studio_server, member, reviewer, artifacts, width
):
    ToolRule.objects.create(tool="terminal", action="review", note="Shell needs a second pair.")
    contexts = [browser.new_context(viewport={"width": width, "height": 900}) for _ in range(2)]
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
    # It waits on Bob, not on her: her header does not count it, and the
    # chat says whom it waits for (issue 37).
    carol.locator("#run-status", has_text="Waiting for a reviewer…").wait_for()
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


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_the_inbox_filters_batches_confirms_and_remembers(
    browser, studio_server, member, width, artifacts
):
    """Issue 37: filters by tool and member, Allow all for one turn's calls, a decided
    card leaves with a word, and a "Decided by me" history."""
    from tests.factories import make_approval, make_conversation

    shell = make_conversation(member, title="Shell work")
    code = make_conversation(member, title="Some code")
    for command in ("ls", "pwd"):
        make_approval(shell, tool_name="terminal", arguments={"command": command},
                      subject=command, run_id="turn-1")  # fmt: skip
    make_approval(code, tool_name="python", arguments={"code": "print(1)"},
                  subject="print(1)", run_id="turn-2")  # fmt: skip
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(TIMEOUT)
    page = context.new_page()
    login(page, studio_server, "carol")
    page.goto(studio_server.url + "/approvals/")
    entries = page.locator(".inbox-entry:not([hidden])")
    page.locator(".inbox-batch").wait_for()
    assert entries.count() == 3
    assert page.locator(".inbox-batch").inner_text().count("2") >= 1

    page.select_option("select[data-filter=tool]", "python")
    page.wait_for_function("document.querySelectorAll('.inbox-entry:not([hidden])').length === 1")
    assert page.locator(".inbox-batch").count() == 0  # its turn's calls are filtered out
    page.select_option("select[data-filter=member]", "carol")
    assert entries.count() == 1
    page.select_option("select[data-filter=tool]", "")
    page.locator(".inbox-batch").wait_for()
    overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")
    assert overflow <= 0, f"{overflow}px of sideways scroll at {width}px"
    page.screenshot(path=str(artifacts / f"42-inbox-{width}.png"), full_page=True)

    page.locator(".inbox-batch button[value=allow]").click()
    confirmed = page.locator(".inbox-decided[role=status]")
    confirmed.first.wait_for()
    assert "Allowed by carol" in confirmed.first.inner_text()
    page.wait_for_function("document.querySelectorAll('.inbox-decided').length === 0")
    assert entries.count() == 1
    entries.first.locator("button[value=deny]").click()
    page.locator(".inbox-decided", has_text="Denied").wait_for()
    page.locator(".inbox-empty:not([hidden])").wait_for()

    # "Decided by me" follows at once, and is the same after a reload.
    history = page.locator(".decided-list li")
    for _ in range(2):
        page.wait_for_function("document.querySelectorAll('.decided-list li').length === 3")
        assert history.first.locator(".badge").inner_text() == "Denied"
        page.reload()
    assert sorted(ToolApproval.objects.values_list("status", flat=True)) == [
        "allowed",
        "allowed",
        "denied",
    ]
    context.close()


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_a_chat_shared_read_only_with_the_team(browser, studio_server, member, settings, width):
    """Issue 55: a member shares a chat; a teammate reads it, its calls and how
    they were decided, with no button to press; unshared, it is gone for them."""
    from tests.browser.ui import card_for, output, run_finished, start_chat
    from tests.factories import make_live_member

    make_live_member(settings, "dave")
    contexts = [browser.new_context(viewport={"width": width, "height": 900}) for _ in range(2)]
    owner, teammate = (context.new_page() for context in contexts)
    try:
        for page in (owner, teammate):
            page.set_default_timeout(TIMEOUT)
        url = start_chat(owner, studio_server)
        card = card_for(owner, "run python: print(6 * 7)")
        card.locator("button[value=allow]").click()
        output(owner, "42").wait_for()
        run_finished(owner)
        owner.locator("button", has_text="Share read-only with the team").click()
        owner.locator("[data-shared]").wait_for()

        login(teammate, studio_server, "dave")
        teammate.locator(".shared-chats a", has_text="run python").click()
        teammate.wait_for_url(url)
        teammate.locator("[data-read-only]", has_text="shared with the team").wait_for()
        assert output(teammate, "42").is_visible()
        assert "Allowed by carol" in teammate.inner_text("#transcript")
        for control in ("#composer", "#settings", "button[value=allow]", ".msg-edit"):
            assert teammate.locator(control).count() == 0, control
        overflow = teammate.evaluate("document.documentElement.scrollWidth - innerWidth")
        assert overflow <= 0

        owner.locator("button", has_text="Stop sharing").click()
        owner.locator("button", has_text="Share read-only with the team").wait_for()
        assert teammate.goto(url).status == 404
    finally:
        for context in contexts:
            context.close()
