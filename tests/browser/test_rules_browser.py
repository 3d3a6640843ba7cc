"""Edit, rules and batch decisions in Chromium, against a live daphne with the demo model."""

from __future__ import annotations

import os
import re

import pytest

from approvals.models import ToolApproval, ToolRule
from tests.browser.ui import (
    ask,
    card_for,
    login,
    new_chat,
    output,
    pending_card,
    run_finished,
    start_chat,
)

pytestmark = pytest.mark.django_db(transaction=True)
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_edit_a_python_call_then_it_runs_as_edited(sized, studio_server, member, artifacts, width):
    page = sized
    start_chat(page, studio_server)
    card = card_for(page, "run python: print(6 * 7)")
    card.locator("summary", has_text="Edit").click()
    editor = card.locator("textarea[name='arg.code']")
    assert editor.input_value() == "print(6 * 7)"
    editor.fill("print(6 * 9)\nprint('edited')")
    page.screenshot(path=str(artifacts / f"30-edit-open-{width}.png"))
    card.locator("button", has_text="Allow with edits").click()

    result = page.locator(".tool-result pre", has_text=re.compile(r"^54\nedited$", re.M))
    result.wait_for()
    run_finished(page)
    decided = page.locator('[data-approval-id][data-reason="edited"]')
    assert decided.locator(".badge").inner_text() == "Allowed with edits"
    assert decided.locator(".diff-del").all_inner_texts() == ["-print(6 * 7)"]
    assert decided.locator(".diff-add").all_inner_texts() == ["+print(6 * 9)", "+print('edited')"]
    # One line per line: no blank line between the - and + lines (issue 37).
    assert decided.locator("pre.diff").inner_text().split("\n") == [
        "-print(6 * 7)", "+print(6 * 9)", "+print('edited')",
    ]  # fmt: skip
    box = decided.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width
    # What ran comes first on the card, and the output is the call's own: the
    # line about the edit is for the model (issue 55).
    assert decided.locator("[data-ran] pre").inner_text() == "print(6 * 9)\nprint('edited')"
    assert result.inner_text().strip() == "54\nedited"
    page.screenshot(path=str(artifacts / f"31-edited-output-{width}.png"), full_page=True)


def test_an_edit_that_breaks_the_schema_is_refused_with_the_reason(page, studio_server, member):
    start_chat(page, studio_server)
    card = card_for(page, 'call web_fetch {"url": "https://example.com/"}')
    card.locator("summary", has_text="Edit").click()
    card.locator("input[name='arg.url']").fill("")
    card.locator("button", has_text="Allow with edits").click()
    error = card.locator(".decide-edit p.decide-error:not([hidden])")
    error.wait_for()
    assert "url" in error.inner_text()
    assert pending_card(page).count() == 1  # still waiting, nothing changed
    assert ToolApproval.objects.get().status == ToolApproval.Status.PENDING


def test_always_allow_commands_starting_with_a_word(page, studio_server, member, artifacts):
    start_chat(page, studio_server)
    card = card_for(page, "$ ls")
    card.locator("summary", has_text="Always allow").click()
    card.locator("label.choice", has_text="commands starting with “ls”").click()
    page.screenshot(path=str(artifacts / "32-always-allow-choices.png"))
    card.locator("button[value=always]").click()
    run_finished(page)
    rule = page.locator('[data-rule-tool="terminal"]')
    rule.wait_for()
    assert rule.get_attribute("data-rule-pattern") == "ls *"

    ask(page, "$ ls -la")
    page.locator('[data-approval-id][data-reason="rule"]').wait_for()  # the run started
    run_finished(page)
    assert page.locator('[data-status="pending"]').count() == 0  # it ran without asking

    ask(page, "$ ls; rm x")
    card = pending_card(page)
    card.wait_for()  # the rule does not vouch for what follows the ";"
    card.locator("button[value=deny]").click()
    run_finished(page)

    ask(page, "$ rm x")
    card = pending_card(page)
    card.wait_for()  # another command still asks
    assert card.locator("pre", has_text="rm x").count() == 1
    page.screenshot(path=str(artifacts / "33-rule-then-ask.png"), full_page=True)
    card.locator("button[value=deny]").click()
    run_finished(page)
    assert ToolRule.objects.get().hits == 1


def test_an_admin_deny_rule_blocks_without_a_card(page, studio_server, admin_member, artifacts):
    login(page, studio_server, "ada")
    page.goto(studio_server.url + "/admin/approvals/toolrule/add/")
    page.select_option("select[name=tool]", "terminal")  # a choice: no typos
    page.fill("input[name=pattern]", "rm -rf*")
    page.select_option("select[name=action]", "deny")
    page.fill("[name=note]", "Never delete recursively.")
    page.click("input[name=_save]")
    page.locator("text=was added successfully").wait_for()
    page.screenshot(path=str(artifacts / "34-admin-deny-rule.png"))

    page.goto(studio_server.url + "/")
    new_chat(page)
    # Confirmation off: an admin's Deny still holds.
    page.uncheck("#confirm-toggle")
    page.locator("#settings .hint", has_text="Tools run without asking").wait_for()
    ask(page, "$ rm -rf build")
    blocked = "Blocked by a rule: Never delete recursively."
    page.locator(".tool-result pre", has_text=blocked).wait_for()
    run_finished(page)
    assert page.locator('[data-status="pending"]').count() == 0
    row = ToolApproval.objects.get()
    assert (row.status, row.reason) == ("denied", "rule")
    assert row.rule_snapshot["pattern"] == "rm -rf*"


def test_two_calls_of_one_turn_decided_with_allow_all(page, studio_server, member, artifacts):
    start_chat(page, studio_server)
    ask(page, "$ echo first\n$ echo second")
    page.locator('[data-approval-id][data-status="pending"]').nth(1).wait_for()
    page.screenshot(path=str(artifacts / "35-batch.png"), full_page=True)
    page.locator(".batch button[value=allow]").click()
    output(page, "first").wait_for()
    output(page, "second").wait_for()
    run_finished(page)
    assert page.locator('[data-approval-id][data-status="allowed"]').count() == 2
    assert page.locator(".batch button").count() == 0  # the group is decided
