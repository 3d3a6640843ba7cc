"""Issue 55, the first minute, in Chromium at 390, 1024 and 1280 px wide (800 high):
a new chat opens on its message box with the cursor in it, the sidebar follows
its title, and a waiting card is never under the pinned message box."""

from __future__ import annotations

import os

import pytest

from tests.browser.ui import ask, card_for, login, new_chat, run_finished

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop

WIDTHS = [390, 1024, 1280]
HEIGHT = 800


def in_view(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= HEIGHT


@pytest.mark.parametrize("width", WIDTHS)
def test_a_new_chat_opens_on_its_message_box(sized, studio_server, member, width):
    page = sized
    page.set_viewport_size({"width": width, "height": HEIGHT})
    login(page, studio_server)
    new_chat(page)
    # The settings and files beside (or below) a new chat are taller than it:
    # the page used to open scrolled to their bottom, past the message box.
    assert in_view(page, "#message-input"), page.evaluate("window.scrollY")
    assert in_view(page, "#conversation-title")
    assert page.evaluate("document.activeElement.id") == "message-input"
    # A skip link is the first stop for a keyboard, and leads to the box.
    first = page.evaluate(
        "(() => { const e = document.querySelector('a[href], button, input:not([type=hidden]),"
        " textarea, select, summary'); return [e.className, e.textContent]; })()"
    )
    assert first == ["skip-link", "Skip to the message box"]
    page.focus(".skip-link")
    assert page.locator(".skip-link").is_visible()  # shown when it has the focus
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "message-input"

    # The first message names the chat, and the sidebar follows without a reload.
    ask(page, "```python\nprint(6 * 7)\n```")
    # (On a phone the sidebar is a closed drawer: its entry is there, hidden.)
    page.wait_for_function(
        "document.querySelector('#conversation-list li.current .conversation-title')"
        ".textContent === 'print(6 * 7)'"
    )
    assert page.locator("#conversation-title").inner_text() == "print(6 * 7)"
    assert page.title().startswith("print(6 * 7) · Studio")


@pytest.mark.parametrize("width", WIDTHS)
def test_a_waiting_card_is_never_under_the_message_box(sized, studio_server, member, width):
    page = sized
    page.set_viewport_size({"width": width, "height": HEIGHT})
    login(page, studio_server)
    new_chat(page)
    for n in range(3):  # a chat long enough to scroll
        ask(page, f"Tell me about step {n}, at some length please.")
        # Its reply is in (run_finished alone may still see the state before it).
        page.locator("#transcript .msg-assistant").nth(n).wait_for()
        run_finished(page)
    card = card_for(page, "run python: print(6 * 7)")
    edit = card.locator("summary", has_text="Edit")
    edit.wait_for()
    composer_top = page.locator(".composer-row").bounding_box()["y"]
    for control in (card.locator("summary", has_text="Always allow"), edit):
        box = control.bounding_box()
        assert box["y"] + box["height"] <= composer_top + 1, (box, composer_top)
    card.locator("button[value=allow]").click()
    result = page.locator(".tool-result pre", has_text="42")
    result.wait_for()
    run_finished(page)
    # The result follows into view, as new messages do.
    box = result.bounding_box()
    assert box["y"] + box["height"] <= page.locator(".composer-row").bounding_box()["y"] + 1


def test_a_phone_shows_no_key_hints_and_a_placeholder_that_fits(browser, studio_server, member):
    """Issue 55: the a/d/e hints showed on touch screens; the placeholder was cut off."""
    context = browser.new_context(
        viewport={"width": 390, "height": HEIGHT}, has_touch=True, is_mobile=True
    )
    try:
        page = context.new_page()
        login(page, studio_server)
        new_chat(page)
        box = page.locator("#message-input")
        assert box.get_attribute("placeholder") == "Message the agent"
        fits = page.evaluate(
            "(() => { const b = document.getElementById('message-input');"
            " const c = document.createElement('canvas').getContext('2d');"
            " c.font = getComputedStyle(b).font;"
            " return c.measureText(b.placeholder).width < b.clientWidth; })()"
        )
        assert fits
        assert not page.locator(".message-keys").is_visible()
        card = card_for(page, "run python: print(6 * 7)")
        assert card.locator("button[value=allow]").is_visible()
        assert not card.locator("kbd").first.is_visible()
        card.locator("button[value=deny]").click()
        run_finished(page)
    finally:
        context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_running_call_shows_its_output_as_it_comes(
    sized, studio_server, member, width, artifacts
):
    """Issue 55: a long call is seen working; its last lines show on its card
    while it runs, then its whole result takes their place."""
    page = sized
    page.set_viewport_size({"width": width, "height": HEIGHT})
    login(page, studio_server)
    new_chat(page)
    card = card_for(page, "$ for i in $(seq 1 8); do echo line-$i; sleep 0.4; done")
    card.locator("button[value=allow]").click()
    live = page.locator("pre.live-output", has_text="line-2")
    live.wait_for()
    # Seen while it runs: not the end yet, and the spinner is still there.
    assert "line-8" not in live.inner_text()
    assert page.locator(".tool-running").is_visible()
    assert in_view(page, "pre.live-output")
    page.screenshot(path=str(artifacts / f"55-live-output-{width}.png"))
    page.locator(".tool-result pre", has_text="line-8").wait_for()
    run_finished(page)
    assert page.locator("pre.live-output").count() == 0
    assert page.locator(".tool-result pre").first.inner_text().startswith("line-1")


DROP = """([name, text]) => {
    const files = new DataTransfer();
    files.items.add(new File([text], name, {type: "text/plain"}));
    const box = document.getElementById("message-input");
    const how = {dataTransfer: files, bubbles: true, cancelable: true};
    box.dispatchEvent(new DragEvent("dragover", how));
    box.dispatchEvent(new DragEvent("drop", how));
}"""
PASTE = """([name, text]) => {
    const files = new DataTransfer();
    files.items.add(new File([text], name, {type: "text/plain"}));
    document.getElementById("message-input").dispatchEvent(
        new ClipboardEvent("paste", {clipboardData: files, bubbles: true, cancelable: true}));
}"""


@pytest.mark.parametrize("width", WIDTHS)
def test_files_go_with_a_message(sized, studio_server, member, width, artifacts):
    """Issue 55: files chosen by the paperclip, dropped on the box or pasted into
    it go with the message: uploaded first (all or none), named to the model."""
    from chat.models import Conversation, Message

    page = sized
    page.set_viewport_size({"width": width, "height": HEIGHT})
    login(page, studio_server)
    new_chat(page)
    csv = {"name": "data.csv", "mimeType": "text/csv", "buffer": b"a,b\n1,2\n"}
    page.set_input_files("#attach-input", files=[csv])
    page.evaluate(DROP, ["notes.txt", "dropped"])
    page.evaluate(PASTE, ["pasted.txt", "pasted"])
    chips = page.locator("#attachments li")
    assert [chip.locator("span").inner_text() for chip in chips.all()] == [
        "data.csv",
        "notes.txt",
        "pasted.txt",
    ]
    # One goes again before sending.
    page.locator("#attachments button[aria-label='Remove pasted.txt']").click()
    assert chips.count() == 2
    page.screenshot(path=str(artifacts / f"56-files-with-a-message-{width}.png"))
    ask(page, "Please look at these.")
    mine = page.locator("#transcript .msg-user").last
    mine.locator(".user-text", has_text="with this message: data.csv, notes.txt.").wait_for()
    page.locator("#workspace-file-list", has_text="notes.txt").wait_for()
    assert page.locator("#attachments").is_hidden()
    run_finished(page)
    conversation = Conversation.objects.filter(owner=member).latest("pk")
    assert (conversation.workspace / "notes.txt").read_text() == "dropped"
    assert not (conversation.workspace / "pasted.txt").exists()
    sent = Message.objects.filter(conversation=conversation, role="user").last().content
    assert sent == (
        "Please look at these.\n\nFiles added to the working folder with this message: "
        "data.csv, notes.txt."
    )

    # Files alone make a message; a name Studio refuses sends nothing and keeps the rest.
    page.evaluate(DROP, [".hidden", "x"])
    page.locator("#message-input").fill("With a bad one.")
    page.press("#message-input", "Enter")
    page.locator("#notice", has_text="is not a file name Studio keeps").wait_for()
    assert Message.objects.filter(conversation=conversation, role="user").count() == 1
    assert page.locator("#message-input").input_value() == "With a bad one."
    page.locator("#attachments button[aria-label='Remove .hidden']").click()
    page.locator("#message-input").fill("")
    page.evaluate(DROP, ["more.txt", "more"])
    page.locator("#send-button").click()
    page.locator("#transcript .user-text", has_text="with this message: more.txt.").wait_for()
    run_finished(page)

    # A message refused (a call still waits) keeps its files; sent again, they go with it.
    card = card_for(page, "$ echo waiting")
    page.evaluate(DROP, ["later.txt", "later"])
    page.locator("#message-input").fill("Once it is done.")
    page.press("#message-input", "Enter")
    page.locator("#notice", has_text="still working on your previous message").wait_for()
    assert [chip.locator("span").inner_text() for chip in chips.all()] == ["later.txt"]
    card.locator("button[value=deny]").click()
    run_finished(page)
    page.press("#message-input", "Enter")
    page.locator("#transcript .user-text", has_text="with this message: later.txt.").wait_for()
    assert page.locator("#attachments").is_hidden()
