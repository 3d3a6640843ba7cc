"""Issue 38: the member's conversations at hand, in Chromium, at three widths."""

from __future__ import annotations

import os
import re

import pytest

from chat.models import Conversation, Message
from tests.browser.ui import TIMEOUT, ask, login, new_chat, pending_card, run_finished
from tests.factories import make_conversation

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop

WIDE = 1200  # at and above it the sidebar is a column; below, a drawer


def open_sidebar(page, width: int) -> None:
    """Show the sidebar: it is always there on a wide screen; a drawer otherwise."""
    sidebar = page.locator("#sidebar")
    if width >= WIDE:
        assert sidebar.is_visible() and not page.locator(".sidebar-toggle").is_visible()
        return
    assert not sidebar.is_visible()
    page.locator(".sidebar-toggle").click()
    sidebar.wait_for(state="visible")
    page.wait_for_function("document.activeElement.id === 'conversation-search'")


def close_sidebar(page, width: int) -> None:
    if width < WIDE:
        page.keyboard.press("Escape")
        page.locator("#sidebar").wait_for(state="hidden")
        assert page.evaluate("document.activeElement.classList.contains('sidebar-toggle')")


def item(page, title: str):
    return page.locator("#conversation-list li", has_text=title)


def no_sideways_scroll(page, width: int) -> None:
    # What sticks out, to say in the failure.
    wide = page.evaluate(
        """width => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > width)
            .map(e => `${e.tagName}.${e.className}#${e.id}`).slice(0, 8)""",
        width,
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= width, wide


def opens_in_place(page, row, width: int) -> None:
    """The ⋯ menu floats by its button: opening it moves neither the button
    nor the chat below; it is on screen whole; Escape closes it, not the drawer."""
    page.wait_for_function("document.getAnimations().length === 0")  # the drawer has slid in
    summary = row.locator("summary")
    below = row.locator("xpath=following-sibling::li[1]")
    before = summary.bounding_box(), below.bounding_box() if below.count() else None
    summary.click()
    menu = row.locator(".item-menu-body")
    menu.wait_for()
    after = summary.bounding_box(), below.bounding_box() if below.count() else None
    assert abs(before[0]["x"] - after[0]["x"]) < 1 and abs(before[0]["y"] - after[0]["y"]) < 1
    if before[1] is not None:
        assert abs(before[1]["y"] - after[1]["y"]) < 1, "the menu pushed the list down"
    box = menu.bounding_box()
    viewport = page.viewport_size
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, box
    assert box["y"] >= 0 and box["y"] + box["height"] <= viewport["height"], box
    no_sideways_scroll(page, width)
    page.keyboard.press("Escape")
    menu.wait_for(state="hidden")
    assert page.evaluate("document.activeElement.tagName") == "SUMMARY"
    assert page.locator("#sidebar").is_visible()


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_switch_search_rename_archive_and_delete_from_the_sidebar(
    sized, studio_server, member, width
):
    notes = make_conversation(member, title="Alpha notes")
    zoo = make_conversation(member, title="Animals")
    Message.objects.create(conversation=zoo, role="user", content="Tell me about the zebra")
    page = sized
    login(page, studio_server)
    page.goto(studio_server.url + notes.get_absolute_url())
    page.wait_for_selector("#conn-state[data-state=online]")
    open_sidebar(page, width)
    no_sideways_scroll(page, width)
    current = item(page, "Alpha notes").locator("a")
    assert current.get_attribute("aria-current") == "page"

    # Search reads messages too, while typing.
    page.fill("#conversation-search", "zeb")
    page.wait_for_function(
        "document.querySelectorAll('#conversation-list li[data-conversation]').length === 1"
    )
    assert item(page, "Animals").count() == 1

    # One click away: the other chat.
    item(page, "Animals").locator("a").click()
    page.wait_for_url(re.compile(rf".*/c/{zoo.pk}/$"))
    page.wait_for_selector("#conn-state[data-state=online]")

    # Rename the chat on screen: the list and its heading follow.
    open_sidebar(page, width)
    row = item(page, "Animals")
    opens_in_place(page, row, width)
    row.locator("summary").click()
    row.locator("input[name=title]").fill("   ")
    row.locator("button", has_text="Rename").click()
    row.locator(".form-error", has_text="Give the chat a name.").wait_for()
    assert Conversation.objects.get(pk=zoo.pk).title == "Animals"
    row.locator("input[name=title]").fill("Zoo trip")
    row.locator("button", has_text="Rename").click()
    page.locator("#conversation-title", has_text="Zoo trip").wait_for()
    item(page, "Zoo trip").wait_for()

    # Archive the other one; it shows again under Archived.
    row = item(page, "Alpha notes")
    row.locator("summary").click()
    row.locator("button", has_text="Archive").click()
    row.wait_for(state="detached")
    page.locator("#sidebar-search input[name=archived]").check()
    item(page, "Alpha notes").wait_for()
    assert item(page, "Zoo trip").count() == 0
    page.locator("#sidebar-search input[name=archived]").uncheck()
    item(page, "Zoo trip").wait_for()
    no_sideways_scroll(page, width)
    close_sidebar(page, width)

    # Delete the chat on screen: confirmed, then back to the list. Unticked,
    # the form says what to do (in words of its own, not the browser's).
    open_sidebar(page, width)
    row = item(page, "Zoo trip")
    row.locator("summary").click()
    row.locator("button", has_text="Delete").click()
    row.locator(".form-error", has_text="Tick the box to confirm the delete.").wait_for()
    assert Conversation.objects.get(pk=zoo.pk).deleted_at is None
    row.locator("input[name=confirm]").check()
    row.locator("button", has_text="Delete").click()
    page.wait_for_url(studio_server.url + "/")
    assert "Zoo trip" not in page.inner_text("#conversation-list")
    assert Conversation.objects.get(pk=zoo.pk).deleted_at is not None
    assert not Message.objects.filter(conversation=zoo).exists()


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_a_waiting_marker_comes_and_goes_live(browser, studio_server, member, width):
    """A call waits in one tab's chat: the other tab's sidebar marks that chat, live."""
    context = browser.new_context(viewport={"width": width, "height": 800})
    context.set_default_timeout(TIMEOUT)
    try:
        asking = context.new_page()
        login(asking, studio_server)
        new_chat(asking)
        ask(asking, "hello")  # gives the chat its title and its place in the list
        run_finished(asking)
        waits_pk = int(re.search(r"/c/(\d+)/", asking.url).group(1))

        watching = context.new_page()
        other = make_conversation(member, title="Watching from here")
        watching.goto(studio_server.url + other.get_absolute_url())
        watching.wait_for_selector("#conn-state[data-state=online]")
        open_sidebar(watching, width)
        marker = watching.locator(f"#waiting-{waits_pk}")
        assert marker.is_hidden()

        ask(asking, "run python: print(5 * 5)")
        card = pending_card(asking)
        card.wait_for()
        marker.wait_for(state="visible")
        assert marker.inner_text() == "waiting"
        assert watching.locator(f"#waiting-{other.pk}").is_hidden()

        card.locator("button[value=deny]").click()
        marker.wait_for(state="hidden")
        no_sideways_scroll(watching, width)
    finally:
        context.close()


@pytest.mark.parametrize("width", [390, 1280])
def test_regenerate_and_edit_fork_the_chat_and_gate_the_new_calls(
    sized, studio_server, member, width
):
    page = sized
    login(page, studio_server)
    new_chat(page)
    ask(page, "run python: print(6 * 7)")
    card = pending_card(page)
    card.wait_for()
    card.locator("button[value=allow]").click()
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*42\s*$")).wait_for()
    run_finished(page)

    # Regenerate: the reply folds away and the same call waits again.
    page.locator("#regenerate-button").click()
    card = pending_card(page)
    card.wait_for()
    fold = page.locator("details.earlier")
    assert fold.count() == 1 and "Earlier version" in fold.locator("summary").inner_text()
    assert not fold.locator(".tool-result").first.is_visible()  # folded, yet there
    card.locator("button[value=deny]").click()
    run_finished(page)

    # Edit the message: a new branch with its own gated call.
    user_message = page.locator("#transcript > .msg-user").last
    user_message.locator(".msg-edit summary").click()
    user_message.locator("textarea[name=message]").fill("run python: print(2 + 3)")
    user_message.locator("button", has_text="Send edited").click()
    card = pending_card(page)
    card.wait_for()
    assert "print(2 + 3)" in card.inner_text()
    card.locator("button[value=allow]").click()
    page.locator(".tool-result pre", has_text=re.compile(r"^\s*5\s*$")).wait_for()
    run_finished(page)
    assert page.locator("#transcript > details.earlier").count() == 1  # the edit replaced all
    assert page.locator("details.earlier details.earlier").count() == 1  # the regenerate, inside
    page.locator("#transcript > details.earlier > summary").click()
    page.locator("details.earlier details.earlier > summary").click()
    page.locator("details.earlier .tool-result pre", has_text="42").wait_for()
    no_sideways_scroll(page, width)
