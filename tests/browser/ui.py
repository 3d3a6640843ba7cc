"""What the browser tests do on a page: log in, start a chat, send, find a card."""

from __future__ import annotations

import re

from tests.factories import PASSWORD

TIMEOUT = 15_000  # ms, every wait of the browser tests is bounded by it


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


def start_chat(page, studio_server, username="carol") -> str:
    """Log in and open a new conversation; returns its URL."""
    login(page, studio_server, username)
    return new_chat(page)


def card_for(page, text: str):
    """Send ``text`` and return the card it makes wait."""
    ask(page, text)
    card = pending_card(page)
    card.wait_for()
    return card


def run_finished(page) -> None:
    page.wait_for_selector('#run-controls[data-running="false"]', state="attached")


def output(page, text: str):
    """The output block whose whole text is ``text`` (not a timestamp that contains it)."""
    return page.locator(".tool-result pre", has_text=re.compile(rf"^\s*{re.escape(text)}\s*$"))
