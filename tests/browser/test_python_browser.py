"""Issue 38: a python that remembers, in Chromium: a variable one call defines is
read by the next; Restart python starts afresh, and the model is told."""

from __future__ import annotations

import os
import re

import pytest

from tests.browser.ui import card_for, login, new_chat, output, run_finished

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop


def allowed(page, text: str) -> None:
    card_for(page, text).locator("button[value=allow]").click()
    run_finished(page)


@pytest.mark.parametrize("width", [390, 1280])
def test_a_variable_lives_on_until_python_restarts(sized, studio_server, member, width):
    page = sized
    login(page, studio_server)
    new_chat(page)
    allowed(page, "run python: answer = 6 * 7")
    allowed(page, "run python: print(answer)")
    output(page, "42").wait_for()

    page.locator("#python-restart").click()
    page.locator("#settings [role=status]", has_text="Python restarted").wait_for()
    allowed(page, "run python: print('answer' in globals())")
    result = page.locator(".tool-result pre", has_text=re.compile(r"^\s*False\b")).last
    result.wait_for()
    assert "A new python session started" in result.inner_text()
    assert page.evaluate("document.documentElement.scrollWidth") <= width
