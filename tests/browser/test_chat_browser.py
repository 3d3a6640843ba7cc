"""The whole approval flow in Chromium against a live daphne with the demo model."""

from __future__ import annotations

import os
import re

import pytest
from django.contrib.auth.hashers import make_password

from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 15_000  # ms, every wait below is bounded by it
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop


@pytest.fixture
def member(settings):
    user = make_user("carol")
    # The live server checks passwords with the real hashers, not the test's MD5.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]
    user.password = make_password(PASSWORD)
    user.save(update_fields=["password"])
    return user


@pytest.fixture
def page(browser, studio_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT)
    page = context.new_page()
    yield page
    context.close()


def login(page, studio_server, username="carol"):
    page.goto(studio_server.url + "/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(studio_server.url + "/")


def new_chat(page) -> str:
    page.click("text=New chat")
    page.wait_for_url(re.compile(r".*/c/\d+/$"))
    page.wait_for_selector("#conn-state[data-state=online]")
    return page.url


def ask(page, text: str) -> None:
    page.fill("#message-input", text)
    page.press("#message-input", "Enter")


def pending_card(page):
    return page.locator('[data-approval-id][data-status="pending"]').last


def test_deny_allow_and_always_allow(page, studio_server, member, artifacts):
    login(page, studio_server)
    page.screenshot(path=str(artifacts / "01-conversations.png"))
    new_chat(page)

    ask(page, "run python: print(6 * 7)")
    card = pending_card(page)
    card.wait_for()
    assert card.locator("text=print(6 * 7)").count() == 1
    assert page.locator("#conversation-title").inner_text() == "run python: print(6 * 7)"
    page.screenshot(path=str(artifacts / "02-pending-card.png"))
    card.locator("button[value=deny]").click()
    page.locator('[data-status="denied"]').first.wait_for()
    page.locator(".msg-assistant", has_text="You declined the python call").wait_for()
    assert page.locator(".tool-result").count() == 1
    assert (
        "The user declined to run this tool call."
        in page.locator(".tool-result").first.inner_text()
    )
    # The tool did not run: no output "42" anywhere (timestamps may hold a 42).
    assert page.locator(".tool-result pre", has_text=re.compile(r"^\s*42\s*$")).count() == 0
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")
    page.screenshot(path=str(artifacts / "03-denied.png"))

    ask(page, "run python: print(6 * 7)")
    card = pending_card(page)
    card.wait_for()
    card.locator("button[value=allow]").click()
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*42\s*$")).wait_for()
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")
    page.screenshot(path=str(artifacts / "04-allowed-output.png"))

    ask(page, "run python: print(7 * 7)")
    card = pending_card(page)
    card.wait_for()
    card.locator("button[value=always]").click()
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*49\s*$")).wait_for()
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")
    page.locator('[data-grant-tool="python"]').wait_for()

    cards_before = page.locator("[data-approval-id]").count()
    ask(page, "run python: print(8 * 8)")
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*64\s*$")).wait_for()
    # That call ran without asking: no pending card was ever shown.
    assert page.locator('[data-status="pending"]').count() == 0
    assert page.locator("[data-approval-id]").count() == cards_before + 1
    assert page.locator(".reason-always_allow").count() >= 2
    page.screenshot(path=str(artifacts / "05-always-allow.png"), full_page=True)


def test_two_tabs_stay_in_step(browser, studio_server, member, artifacts):
    context = browser.new_context()
    context.set_default_timeout(TIMEOUT)
    tab1 = context.new_page()
    login(tab1, studio_server)
    url = new_chat(tab1)
    tab2 = context.new_page()
    tab2.goto(url)
    tab2.wait_for_selector("#conn-state[data-state=online]")

    ask(tab1, "$ echo two-tabs")
    pending_card(tab2).wait_for()
    pending_card(tab1).locator("button[value=allow]").click()
    tab2.locator('[data-status="allowed"]').wait_for()
    tab2.locator(".tool-result pre", has_text="two-tabs").wait_for()
    tab2.screenshot(path=str(artifacts / "06-second-tab.png"))
    context.close()


def test_reload_while_pending_keeps_live_buttons(page, studio_server, member, artifacts):
    login(page, studio_server)
    new_chat(page)
    ask(page, "run python: print('after reload')")
    pending_card(page).wait_for()
    page.reload()
    page.wait_for_selector("#conn-state[data-state=online]")
    card = pending_card(page)
    card.wait_for()
    page.screenshot(path=str(artifacts / "07-reloaded-pending.png"))
    card.locator("button[value=allow]").click()
    page.locator(".tool-result pre", has_text="after reload").wait_for()
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")


def test_stop_cancels_a_pending_call(page, studio_server, member):
    login(page, studio_server)
    new_chat(page)
    ask(page, "$ echo never")
    pending_card(page).wait_for()
    page.click("#stop-button")
    page.locator('[data-approval-id][data-status="denied"]', has_text="Cancelled").wait_for()
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")
    assert page.locator(".tool-result pre", has_text=re.compile(r"^\s*never\s*$")).count() == 0


def test_failed_decision_post_shows_an_error_and_reenables(page, studio_server, member):
    login(page, studio_server)
    new_chat(page)
    ask(page, "$ echo retry")
    card = pending_card(page)
    card.wait_for()
    page.route("**/approvals/*/decide/", lambda route: route.abort())
    card.locator("button[value=allow]").click()
    page.locator("text=Could not send your decision. Try again.").wait_for()
    assert card.locator("button[value=allow]").is_enabled()
    page.unroute("**/approvals/*/decide/")
    card.locator("button[value=allow]").click()
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*retry\s*$")).wait_for()


def test_deny_with_a_note(page, studio_server, member):
    login(page, studio_server)
    new_chat(page)
    ask(page, "run python: import os")
    card = pending_card(page)
    card.wait_for()
    card.locator("summary", has_text="Add a note").click()
    card.locator("textarea[name=note]").fill("Use pathlib instead.")
    card.locator("button[value=deny]").click()
    decided = page.locator('[data-approval-id][data-status="denied"]')
    decided.wait_for()
    assert decided.locator("blockquote.note").inner_text() == "Use pathlib instead."
    result = page.locator(".tool-result pre").last.inner_text()
    assert result == "The user declined to run this tool call. The user said: Use pathlib instead."
