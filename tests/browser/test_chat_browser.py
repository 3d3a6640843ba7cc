"""The whole approval flow in Chromium against a live daphne with the demo model."""

from __future__ import annotations

import os
import re
import time

import pytest

from tests.browser.ui import (
    TIMEOUT,
    ask,
    card_for,
    login,
    new_chat,
    output,
    pending_card,
    run_finished,
    start_chat,
)
from tests.helpers.live import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop


def test_deny_allow_and_always_allow(page, studio_server, member, artifacts):
    login(page, studio_server)
    page.screenshot(path=str(artifacts / "01-conversations.png"))
    new_chat(page)

    card = card_for(page, "run python: print(6 * 7)")
    assert card.locator("pre.code", has_text="print(6 * 7)").count() == 1
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

    card = card_for(page, "run python: print(6 * 7)")
    card.locator("button[value=allow]").click()
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*42\s*$")).wait_for()
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")
    page.screenshot(path=str(artifacts / "04-allowed-output.png"))

    card = card_for(page, "run python: print(7 * 7)")
    card.locator("summary", has_text="Always allow").click()
    card.locator("button[value=always]").click()
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*49\s*$")).wait_for()
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")
    page.locator('[data-rule-tool="python"]').wait_for()

    cards_before = page.locator("[data-approval-id]").count()
    ask(page, "run python: print(8 * 8)")
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*64\s*$")).wait_for()
    # That call ran without asking: no pending card was ever shown.
    assert page.locator('[data-status="pending"]').count() == 0
    assert page.locator("[data-approval-id]").count() == cards_before + 1
    assert page.locator(".reason-always_allow").count() == 1
    assert page.locator(".reason-rule").count() == 1  # the next call: allowed by that rule
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
    start_chat(page, studio_server)
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
    start_chat(page, studio_server)
    ask(page, "$ echo never")
    pending_card(page).wait_for()
    page.click("#stop-button")
    page.locator('[data-approval-id][data-status="denied"]', has_text="Cancelled").wait_for()
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")
    assert page.locator(".tool-result pre", has_text=re.compile(r"^\s*never\s*$")).count() == 0


def test_failed_decision_post_shows_an_error_and_reenables(page, studio_server, member):
    start_chat(page, studio_server)
    card = card_for(page, "$ echo retry")
    page.route("**/approvals/*/decide/", lambda route: route.abort())
    card.locator("button[value=allow]").click()
    page.locator(
        "p.decide-error:not([hidden])", has_text="Could not send your decision. Try again."
    ).wait_for()
    assert card.locator("button[value=allow]").is_enabled()
    page.unroute("**/approvals/*/decide/")
    card.locator("button[value=allow]").click()
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*retry\s*$")).wait_for()


def test_deny_with_a_note(page, studio_server, member):
    start_chat(page, studio_server)
    card = card_for(page, "run python: import os")
    card.locator("summary", has_text="Add a note").click()
    card.locator("textarea[name=note]").fill("Use pathlib instead.")
    card.locator("button[value=deny]").click()
    decided = page.locator('[data-approval-id][data-status="denied"]')
    decided.wait_for()
    assert decided.locator("blockquote.note").inner_text() == "Use pathlib instead."
    result = page.locator(".tool-result pre").last.inner_text()
    assert result == "The user declined to run this tool call. The user said: Use pathlib instead."


def test_a_message_over_the_limit_is_refused_with_the_limit_named_never_cut(
    page, studio_server, member
):
    """Issue 37: a 54,000-character paste sent 20,000 characters without a word."""
    start_chat(page, studio_server)
    page.fill("#message-input", "x" * 17_000)
    count = page.locator("#message-count")
    assert count.is_hidden()  # far from the limit: no counter
    page.fill("#message-input", "x" * 18_500)
    assert count.inner_text() == "18,500 / 20,000 characters"  # near it: a counter
    page.fill("#message-input", "y" * 54_000)
    assert "too long to send" in count.inner_text()
    page.press("#message-input", "Enter")
    notice = page.locator("#notice")
    notice.wait_for(state="visible", timeout=TIMEOUT)
    assert "limited to 20,000 characters; this one has 54,000" in notice.inner_text()
    # Nothing was sent, and nothing was cut: the whole paste is still there.
    assert page.locator("#transcript .msg-user").count() == 0
    assert len(page.input_value("#message-input")) == 54_000
    # A message within the limit goes, as ever (and shows where the refused one did not).
    page.fill("#message-input", "hello")
    page.press("#message-input", "Enter")
    page.locator("#transcript .msg-user").first.wait_for(timeout=TIMEOUT)


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_a_card_by_keyboard_and_for_a_screen_reader(browser, studio_server, member, width):
    """Issue 37: a new card takes focus, a/d/e decide it, focus never falls to <body>,
    the card is a named region whose buttons name their call, and a live region speaks."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(TIMEOUT)
    try:
        _keyboard_and_screen_reader(context.new_page(), studio_server)
    finally:
        context.close()


def _keyboard_and_screen_reader(page, studio_server):
    start_chat(page, studio_server)
    focused_card = "document.activeElement && document.activeElement.dataset.status === 'pending'"
    ask(page, "run python: print(2 + 2)")
    page.wait_for_function(focused_card, timeout=TIMEOUT)
    card = pending_card(page)
    assert card.get_attribute("role") == "region"
    assert card.get_attribute("aria-label") == "python call waiting: print(2 + 2)"
    allow = card.locator("button[value=allow]")
    assert allow.get_attribute("aria-label") == "Allow the python call: print(2 + 2)"
    assert allow.inner_text().split() == ["Allow", "a"]  # the key, shown on the button
    announcer = page.locator("#announcer")
    page.wait_for_function(
        "document.getElementById('announcer').textContent.includes('waiting')", timeout=TIMEOUT
    )
    assert announcer.inner_text() == "python call waiting: print(2 + 2)"

    page.keyboard.press("a")
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*4\s*$")).wait_for()
    page.wait_for_function(
        "document.activeElement && document.activeElement.id === 'message-input'",
        timeout=TIMEOUT,
    )
    page.wait_for_function(
        "document.getElementById('announcer').textContent === 'python call allowed: print(2 + 2)'",
        timeout=TIMEOUT,
    )

    ask(page, "run python: print(3 + 3)")
    page.wait_for_function(focused_card, timeout=TIMEOUT)
    page.keyboard.press("d")
    page.locator('[data-status="denied"]').first.wait_for()
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")
    ask(page, "run python: print(4 + 4)")
    page.wait_for_function(focused_card, timeout=TIMEOUT)
    page.keyboard.press("e")
    editor = pending_card(page).locator("details.edit-menu textarea")
    editor.wait_for()
    assert page.evaluate("document.activeElement.tagName") == "TEXTAREA"


def test_every_page_fits_a_phone_without_sideways_scroll(browser, studio_server, member):
    """Issue 37: at 390 px the chat laid out 814 px wide; code and long words ran off-screen."""
    context = browser.new_context(viewport={"width": 390, "height": 800})
    page = context.new_page()
    try:
        page.goto(studio_server.url + "/accounts/login/")
        pages = {"login": page.url}
        start_chat(page, studio_server)
        card_for(page, "run python: print('" + "x" * 300 + "')")
        ask(page, "y" * 400)  # one long word from the member
        pages.update(chat=page.url, index=studio_server.url + "/")
        pages["inbox"] = studio_server.url + "/approvals/"
        for name, url in pages.items():
            if name != "login":
                page.goto(url)
            page.wait_for_load_state("load")
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, (name, width)
        # The message box stays on screen.
        page.goto(pages["chat"])
        box = page.locator("#message-input").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    finally:
        context.close()


def test_a_card_stays_live_across_a_server_restart(browser, member, workspace_root, artifacts):
    """Issue 35: the server restarts while a card waits; the page reconnects by
    itself, the card still decides the call, and nothing says "Cancelled"."""
    from chat.models import Run

    env = {"STUDIO_WORKSPACE_ROOT": str(workspace_root), "STUDIO_APPROVAL_POLL_SECONDS": "0.5"}
    server = LiveServer(log_path=artifacts / "daphne-restart-1.log", **env).start()
    successor = None
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT)
    try:
        page = context.new_page()
        sockets = []
        page.on("websocket", lambda ws: sockets.append(ws.url))
        start_chat(page, server)
        card = card_for(page, "run python: print(6 * 7)")
        deadline = time.monotonic() + TIMEOUT / 1000
        while not Run.objects.filter(status="running", owner="").exclude(waiting_on="").exists():
            assert time.monotonic() < deadline, "the run never came to wait"
            time.sleep(0.05)

        server.stop()  # SIGTERM
        page.wait_for_selector("#conn-state:not([data-state=online])")
        successor = LiveServer(port=server.port, log_path=artifacts / "daphne-restart-2.log", **env)
        successor.start()
        page.wait_for_selector("#conn-state[data-state=online]")
        # The page's first socket said when the page was drawn; the reconnect
        # did not (it may have missed anything: it gets the whole state).
        chat = [url for url in sockets if "/ws/c/" in url]
        assert re.search(r"/ws/c/\d+/\?since=\d+$", chat[0]), chat
        assert len(chat) >= 2 and all(url.endswith("/") for url in chat[1:]), chat

        card.locator("button[value=allow]").click()
        output(page, "42").wait_for()
        run_finished(page)
        assert page.locator('[data-reason="cancelled"]').count() == 0
        assert "Cancelled" not in page.locator("#transcript").inner_text()
    finally:
        context.close()
        server.stop()
        if successor is not None:
            successor.stop()


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_retry_after_a_model_error_and_a_long_message_folds(
    browser, member, workspace_root, artifacts, width
):
    """Issue 37: the model down leaves a Retry (never its URL); a long message folds;
    both fit the screen."""
    from tests.helpers.fake_openai import FakeOpenAI, Reply, content_chunks

    with FakeOpenAI() as fake:
        fake.replies += [
            Reply(status=503),
            Reply(chunks=content_chunks("Back ", "again.")),
            Reply(chunks=content_chunks("Read it all.")),
        ]
        server = LiveServer(
            log_path=artifacts / f"daphne-retry-{width}.log",
            STUDIO_WORKSPACE_ROOT=str(workspace_root),
            LLM_BASE_URL=fake.base_url,
        ).start()
        context = browser.new_context(viewport={"width": width, "height": 800})
        context.set_default_timeout(TIMEOUT)
        try:
            page = context.new_page()
            start_chat(page, server)
            ask(page, "hello")
            retry = page.locator("#retry-button")
            retry.wait_for()
            assert fake.base_url not in page.content() and "127.0.0.1" not in page.inner_text(
                "body"
            )
            retry.click()
            page.locator(".msg-assistant", has_text="Back again.").wait_for()
            run_finished(page)
            assert retry.count() == 0

            long = "\n".join(f"line {n}: " + "words " * 12 for n in range(60))
            page.fill("#message-input", long)
            page.press("#message-input", "Enter")
            fold = page.locator(".msg-user details.fold").last
            fold.wait_for()
            assert "Show all of it (60 lines" in fold.locator("summary").inner_text()
            assert not fold.locator(".user-text").is_visible()
            fold.locator("summary").click()
            assert fold.locator(".user-text").is_visible()
            run_finished(page)
            overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")
            assert overflow <= 0, f"{overflow}px of sideways scroll at {width}px"
            page.screenshot(path=str(artifacts / f"13-retry-and-fold-{width}.png"), full_page=True)
        finally:
            context.close()
            server.stop()
