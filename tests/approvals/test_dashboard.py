"""The approvals dashboard: every chart's numbers against a known fixture, bounded queries."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from approvals.dashboard import dashboard_data
from approvals.models import ToolRule
from tests.factories import make_approval, make_conversation

pytestmark = [pytest.mark.django_db, pytest.mark.anydb]

TODAY = timezone.now().date()


def at(days_ago: int, hour: int = 12):
    day = TODAY - timedelta(days=days_ago)
    return timezone.make_aware(datetime(day.year, day.month, day.day, hour))


@pytest.fixture
def fixture(alice, bob):
    chat = make_conversation(alice)

    def row(days_ago, tool="python", status="allowed", reason="user", **extra):
        return make_approval(
            chat,
            tool_name=tool,
            status=status,
            reason=reason,
            requested_at=at(days_ago),
            decided_at=None if status == "pending" else at(days_ago, 13),
            decided_by=bob if reason in ("user", "edited", "always_allow") else None,
            **extra,
        )

    # Today: five person decisions on python (1, 2, 3, 4, 10 s), two by rules.
    for seconds in (1, 2, 3, 4, 10):
        row(0, decision_seconds=seconds)
    row(0, reason="rule")
    row(0, reason="confirm_off")
    # Three days ago: denials, a timeout, a terminal decision.
    for _ in range(3):
        row(3, tool="terminal", status="denied", subject="rm -rf x", decision_seconds=5)
    row(3, tool="web_fetch", status="denied", reason="rule", subject="https://evil.example/")
    row(3, tool="terminal", status="denied", reason="timeout")
    # Twenty days ago (in 30 and 90, not 7): one cancelled, one allowed edit.
    row(20, status="denied", reason="cancelled")
    row(20, reason="edited", decision_seconds=7)
    # Sixty days ago (only in 90).
    row(60, reason="always_allow", decision_seconds=100)
    # Waiting now (requested today).
    row(0, tool="terminal", status="pending", reason="")
    row(0, tool="terminal", status="pending", reason="", needs_review=True)
    ToolRule.objects.create(tool="terminal", pattern="ls *", action="allow", hits=12)
    ToolRule.objects.create(tool="*", action="ask", hits=0)
    return chat


def test_approvals_per_day_by_outcome(fixture):
    board = dashboard_data(7, today=TODAY)
    assert len(board.per_day) == 7 and board.per_day[-1]["day"] == TODAY
    today, three_ago = board.per_day[-1], board.per_day[-4]
    assert (today["by_person"], today["automatic"], today["denied"], today["ended"]) == (5, 2, 0, 0)
    assert (three_ago["by_person"], three_ago["denied"], three_ago["ended"]) == (0, 4, 1)
    assert (
        sum(d["by_person"] + d["automatic"] + d["denied"] + d["ended"] for d in board.per_day) == 12
    )


def test_time_to_decision_per_tool(fixture):
    times = {row["tool_name"]: row for row in dashboard_data(7, today=TODAY).decision_times}
    assert (times["python"]["count"], times["python"]["median"], times["python"]["p90"]) == (
        5,
        3,
        10,
    )
    assert (times["terminal"]["median"], times["terminal"]["p90"]) == (5, 5)
    assert set(times) == {"python", "terminal"}  # rules' rows took no one's time
    # 90 days: python took 1, 2, 3, 4, 7, 10, 100 s -> ranks ceil(3.5)=4 and ceil(6.3)=7
    times = {row["tool_name"]: row for row in dashboard_data(90, today=TODAY).decision_times}
    assert (times["python"]["count"], times["python"]["median"], times["python"]["p90"]) == (
        7, 4, 100,
    )  # fmt: skip


def test_asked_vs_without_asking(fixture):
    share = {row["tool_name"]: row for row in dashboard_data(7, today=TODAY).asked_share}
    assert (share["python"]["total"], share["python"]["asked"], share["python"]["automatic"]) == (
        7, 5, 2,
    )  # fmt: skip
    assert share["python"]["asked_percent"] == 71.4
    assert (share["terminal"]["asked"], share["terminal"]["automatic"]) == (6, 0)
    assert (share["web_fetch"]["asked"], share["web_fetch"]["automatic"]) == (0, 1)


def test_most_denied_and_rule_hits_and_pending(fixture):
    board = dashboard_data(7, today=TODAY)
    assert [(r["tool_name"], r["subject"], r["count"]) for r in board.most_denied] == [
        ("terminal", "rm -rf x", 3),
        ("web_fetch", "https://evil.example/", 1),
    ]
    assert [(str(r["rule"].pattern), r["hits"]) for r in board.rule_hits] == [("ls *", 12)]
    assert board.pending == [
        {"tool_name": "terminal", "count": 2, "for_review": 1, "oldest": at(0)},
    ]


def test_the_period_switch(fixture):
    assert sum(d["ended"] for d in dashboard_data(30, today=TODAY).per_day) == 2
    assert sum(d["by_person"] for d in dashboard_data(30, today=TODAY).per_day) == 6
    assert sum(d["by_person"] for d in dashboard_data(90, today=TODAY).per_day) == 7
    assert len(dashboard_data(90, today=TODAY).per_day) == 90


def test_the_page_draws_every_chart_with_its_numbers_in_bounded_queries(
    fixture, admin_user, settings
):
    client = Client()
    client.force_login(admin_user)
    url = reverse("admin:approvals_toolapproval_dashboard")
    with CaptureQueriesContext(connection) as few:
        page = client.get(url, {"days": 7})
    html = page.content.decode()
    assert page.status_code == 200 and 'data-days="7"' in html
    for chart in (
        "per-day",
        "decision-times",
        "asked-share",
        "most-denied",
        "rule-hits",
        "pending",
    ):
        section = html.split(f'id="chart-{chart}"')[1].split("</section>")[0]
        assert 'class="pygal-chart"' in section, chart
        assert "<table" in section, chart
    assert "<script" not in html.split('id="approvals-dashboard"')[1]  # pictures, no scripts
    assert "rm -rf x" in html and "data-pending-total>2<" in html
    # Many more tools and rows: the same number of queries (every chart is capped).
    for i in range(30):
        make_approval(fixture, tool_name=f"tool{i}", decision_seconds=i, status="allowed",
                      reason="user", decided_by=admin_user, requested_at=at(1))  # fmt: skip
    with CaptureQueriesContext(connection) as many:
        client.get(url, {"days": 7})
    assert len(many) <= 40, [q["sql"] for q in many.captured_queries]
    assert len(many) - len(few) <= 2 * 12  # at most the per-tool percentile looks
    # The period switch, and a bad period falls back to 30 days.
    assert 'data-days="90"' in client.get(url, {"days": 90}).content.decode()
    assert 'data-days="30"' in client.get(url, {"days": "forever"}).content.decode()


def test_only_admins_who_may_view_approvals_see_it(alice, fixture):
    client = Client()
    client.force_login(alice)
    assert client.get(reverse("admin:approvals_toolapproval_dashboard")).status_code == 302


def test_counts_on_whole_numbers_and_denials_in_red(fixture):
    """Issue 37: the count charts had ticks at 0.1 ... 1, and denials were drawn green."""
    import re

    from approvals.dashboard import DANGER, charts

    svgs = charts(dashboard_data(7, today=TODAY))
    for name in ("per_day", "asked_share", "most_denied", "rule_hits", "pending"):
        # Every number on an axis (the value axis, whichever way the bars run).
        numbers = re.findall(r"<text[^>]*>([0-9][0-9.,]*)</text>", svgs[name])
        assert numbers and all(n.isdigit() for n in numbers), (name, numbers)
    assert f"fill:{DANGER}" in svgs["most_denied"].replace(" ", "")


def test_a_rules_all_time_count_is_never_below_this_period(fixture):
    rule = ToolRule.objects.create(tool="python", action="allow", hits=1)
    for _ in range(3):  # rows the rule decided, more than its counter says
        make_approval(fixture, status="allowed", reason="rule", rule=rule, requested_at=at(1))
    # The decision that made it links the rule too, but is not a hit.
    make_approval(fixture, status="allowed", reason="always_allow", rule=rule, requested_at=at(1))
    (found,) = [r for r in dashboard_data(7, today=TODAY).rule_hits if r["rule"] == rule]
    assert (found["in_period"], found["hits"]) == (3, 3)


def test_a_persons_allow_and_a_rules_allow_are_told_apart_by_colour(fixture):
    """Issue 55: the per-day chart drew them in two near-identical greens."""
    from approvals.dashboard import ALLOWED_BY_PERSON, ALLOWED_BY_RULE, charts

    make_approval(fixture, status="allowed", reason="user", requested_at=at(1))
    make_approval(fixture, status="allowed", reason="rule", requested_at=at(1))
    svg = charts(dashboard_data(7, today=TODAY))["per_day"].replace(" ", "")
    assert f"fill:{ALLOWED_BY_PERSON}" in svg and f"fill:{ALLOWED_BY_RULE}" in svg

    def rgb(colour: str) -> tuple[int, ...]:
        return tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))

    person, rule = rgb(ALLOWED_BY_PERSON), rgb(ALLOWED_BY_RULE)
    distance = sum(abs(a - b) for a, b in zip(person, rule, strict=True))
    assert distance > 150
