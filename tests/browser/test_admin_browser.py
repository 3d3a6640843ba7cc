"""The admin in Chromium at 1280 px: the approvals list fits, the dashboard draws."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ToolRule
from tests.browser.ui import login
from tests.factories import make_approval, make_conversation

pytestmark = pytest.mark.django_db(transaction=True)
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def audit_rows(admin_member, member):
    chat = make_conversation(
        member,
        title="A very long conversation title about the quarterly budget and the servers",
    )
    now = timezone.now()
    kinds = [
        ("allowed", "user", "python", {"code": "import pandas as pd\n" + "x = 1\n" * 40}),
        ("denied", "user", "terminal", {"command": "rm -rf /srv/www/releases/2026-12-01"}),
        ("allowed", "rule", "web_fetch", {"url": "https://docs.python.org/3/library/" + "a" * 80}),
        ("denied", "timeout", "terminal", {"command": "make deploy ENV=production"}),
        ("pending", "", "files__write", {"path": "/tmp/x", "content": "y" * 300}),
    ]
    for day in range(12):
        for status, reason, tool, arguments in kinds:
            make_approval(
                chat,
                tool_name=tool,
                arguments=arguments,
                subject=next(iter(arguments.values())),
                status=status,
                reason=reason,
                decided_by=member if reason == "user" else None,
                requested_at=now - timedelta(days=day, minutes=5),
                decided_at=None if status == "pending" else now - timedelta(days=day),
                decision_seconds=30 + day if reason == "user" else None,
            )
    ToolRule.objects.create(tool="web_fetch", pattern="https://docs.python.org/*", action="allow",
                            hits=12)  # fmt: skip


def test_the_approvals_list_fits_1280_px(page, studio_server, audit_rows, artifacts):
    login(page, studio_server, "ada")
    page.goto(studio_server.url + "/admin/approvals/toolapproval/")
    page.locator("#result_list").wait_for()
    overflow = page.evaluate(
        """() => [document.documentElement, document.querySelector('#changelist .results')]
            .map(el => el.scrollWidth - el.clientWidth)"""
    )
    assert overflow == [0, 0], f"horizontal scrolling (page, table): {overflow}px"
    headers = page.locator("#result_list thead th").all_inner_texts()
    for name in ("REQUESTED", "STATUS", "TOOL NAME", "ARGUMENTS", "REQUESTED BY",
                 "DECIDED BY", "REASON"):  # fmt: skip
        assert any(name in h.upper() for h in headers), (name, headers)
    # The chat's title reads on two lines, not as a word and a cut.
    title = page.locator("td.field-chat span").first
    assert title.get_attribute("title").startswith("A very long conversation title")
    lines = title.evaluate(
        "s => Math.round(s.getBoundingClientRect().height"
        " / parseFloat(getComputedStyle(s).lineHeight))"
    )
    assert lines == 2, lines
    assert title.evaluate("s => s.scrollWidth <= s.clientWidth")  # nothing cut sideways
    assert title.inner_text().startswith("A very long conversation")
    page.screenshot(path=str(artifacts / "50-admin-list-1280.png"))


def test_the_dashboard_draws_its_charts(page, studio_server, audit_rows, artifacts):
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    login(page, studio_server, "ada")
    page.goto(studio_server.url + "/admin/")
    page.click("text=Approvals dashboard")
    page.locator("#approvals-dashboard").wait_for()
    for chart in ("pending", "per-day", "decision-times", "asked-share", "most-denied",
                  "rule-hits"):  # fmt: skip
        svg = page.locator(f"#chart-{chart} svg.pygal-chart")
        assert svg.count() == 1, chart
        assert svg.bounding_box()["width"] > 300, chart
    bars = page.locator("#chart-per-day svg .series rect, #chart-per-day svg .series path")
    assert bars.count() > 10
    page.screenshot(path=str(artifacts / "51-dashboard-30-days.png"), full_page=True)
    page.click("[data-period='7']")
    page.locator("#approvals-dashboard[data-days='7']").wait_for()
    page.screenshot(path=str(artifacts / "52-dashboard-7-days.png"), full_page=True)
    assert errors == []


@pytest.mark.parametrize("width", [1280, 1024])
def test_the_approvals_list_fits_with_every_column(browser, studio_server, admin_member, width):
    """Issue 37: clipped by 23 px at 1280, Reason and Conversation hidden at 1024."""
    from django.contrib.auth import get_user_model

    ada = get_user_model().objects.get(username="ada")
    chat = make_conversation(ada, title="A rather long conversation title for the audit list")
    for _ in range(5):
        command = "ls -la /some/long/path/" * 3
        make_approval(chat, tool_name="terminal", arguments={"command": command},
                      subject=command, status="denied", reason="cancelled")  # fmt: skip
    context = browser.new_context(viewport={"width": width, "height": 800})
    page = context.new_page()
    try:
        login(page, studio_server, "ada")
        page.goto(studio_server.url + "/admin/approvals/toolapproval/")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        headers = page.locator("#result_list thead th")
        names = [t.strip() for t in headers.all_inner_texts()]
        assert names[-2:] == ["REASON", "CONVERSATION"], names
        right = page.evaluate(
            "Math.max(...Array.from(document.querySelectorAll('#result_list th, #result_list td'))"
            ".map(c => c.getBoundingClientRect().right))"
        )
        assert right <= width, right
    finally:
        context.close()


@pytest.mark.parametrize("width", [390, 1024, 1280])
def test_the_audit_list_and_the_dashboard_fit_a_phone_too(
    browser, studio_server, audit_rows, width
):
    """Issue 37 at every width: the page never scrolls sideways; on a phone the
    results table scrolls inside its own box, and the charts shrink to fit."""
    context = browser.new_context(viewport={"width": width, "height": 800})
    page = context.new_page()
    try:
        login(page, studio_server, "ada")
        page.goto(studio_server.url + "/admin/approvals/toolapproval/")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        table = page.locator("#result_list")
        assert table.locator("tbody tr").count() > 0
        page.goto(studio_server.url + "/admin/")
        page.click("text=Approvals dashboard")
        page.locator("#approvals-dashboard").wait_for()
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        box = page.locator("#chart-per-day svg.pygal-chart").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= width
    finally:
        context.close()
