"""The approvals dashboard: what happened over a period, aggregated in the database.

Each ``*_data`` function is a bounded number of aggregate queries (none
loops over rows), so the page costs the same with a thousand rows or a
million; ``charts`` draws them as static SVG with pygal.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta

import pygal
from django.db import connection
from django.db.models import Aggregate, Count, DateField, F, FloatField, Func, Min, Q, Window
from django.db.models.functions import Ceil, RowNumber, TruncDate
from django.utils import timezone
from pygal.style import Style

from approvals.models import ENDED_REASONS, ToolApproval, ToolRule
from studio.text import short

Status = ToolApproval.Status
Reason = ToolApproval.Reason

PERIODS = (7, 30, 90)
TOP = 10  # rows in the "most" charts
MAX_TOOLS = 12  # tools in the per-tool charts (the busiest)

PERSON = (Reason.USER, Reason.EDITED, Reason.ALWAYS_ALLOW)
AUTOMATIC = (Reason.RULE, Reason.POLICY, Reason.CONFIRM_OFF)

# Outcome of a decided call -> (label, condition)
OUTCOMES = {
    "by_person": ("Allowed by a person", Q(status=Status.ALLOWED, reason__in=PERSON)),
    "automatic": ("Allowed by a rule or setting", Q(status=Status.ALLOWED, reason__in=AUTOMATIC)),
    "denied": (
        "Denied (person or rule)",
        Q(status=Status.DENIED, reason__in=(Reason.USER, Reason.RULE)),
    ),
    "ended": ("Timed out, cancelled or expired", Q(reason__in=ENDED_REASONS)),
}


class PercentileDisc(Aggregate):
    """PostgreSQL's nearest-rank percentile (what the portable fallback computes too)."""

    function = "percentile_disc"
    template = "%(function)s(%(percentile)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, percentile: float, **extra):
        super().__init__(expression, percentile=float(percentile), **extra)


@dataclass
class Dashboard:
    days: int
    since: date
    per_day: list[dict] = field(default_factory=list)
    decision_times: list[dict] = field(default_factory=list)
    asked_share: list[dict] = field(default_factory=list)
    most_denied: list[dict] = field(default_factory=list)
    rule_hits: list[dict] = field(default_factory=list)
    pending: list[dict] = field(default_factory=list)
    sources: list[dict] = field(default_factory=list)

    @property
    def pending_total(self) -> int:
        return sum(row["count"] for row in self.pending)


def dashboard_data(days: int, *, today: date | None = None) -> Dashboard:
    today = today or timezone.now().date()
    since = today - timedelta(days=days - 1)
    # A range on the indexed column (not a per-row date cast).
    start = timezone.make_aware(datetime.combine(since, time.min))
    rows = ToolApproval.objects.filter(requested_at__gte=start)
    board = Dashboard(days=days, since=since)
    board.per_day = _per_day(rows, since, today)
    board.decision_times = _decision_times(rows)
    board.asked_share = _asked_share(rows)
    board.most_denied = _most_denied(rows)
    board.rule_hits = _rule_hits(rows)
    board.pending = _pending()
    board.sources = _sources(rows)
    return board


def _sources(rows) -> list[dict]:
    """Where the period's calls were asked: the chat, or the API by token."""
    found = (
        rows.values("source", "api_token__name", "api_token__user__username")
        .annotate(
            total=Count("pk"),
            allowed=Count("pk", filter=Q(status=Status.ALLOWED)),
            denied=Count("pk", filter=Q(status=Status.DENIED)),
        )
        .order_by("-total", "source", "api_token__name")[:TOP]
    )
    return [dict(row) for row in found]


def _per_day(rows, since: date, today: date) -> list[dict]:
    counts = {
        row["day"]: row
        for row in rows.annotate(day=_day("requested_at"))
        .values("day")
        .annotate(**{key: Count("pk", filter=q) for key, (_, q) in OUTCOMES.items()})
        .order_by("day")
    }
    days = []
    for offset in range((today - since).days + 1):
        day = since + timedelta(days=offset)
        found = counts.get(day, {})
        days.append({"day": day, **{key: found.get(key, 0) for key in OUTCOMES}})
    return days


def _day(column: str):
    """The local calendar day of a timestamp, computed in the database.

    SQLite's TruncDate calls back into Python for every row; while the site
    runs in UTC its own ``date()`` gives the same day at C speed.
    """
    if connection.vendor == "sqlite" and timezone.get_current_timezone_name() == "UTC":
        return Func(F(column), function="date", output_field=DateField())
    return TruncDate(column)


def _decision_times(rows) -> list[dict]:
    """Median and 90th percentile of the seconds a person took, per tool (nearest rank)."""
    decided = rows.filter(decided_by__isnull=False, decision_seconds__isnull=False)
    if connection.vendor == "postgresql":
        found = (
            decided.values("tool_name")
            .annotate(
                count=Count("pk"),
                median=PercentileDisc("decision_seconds", 0.5),
                p90=PercentileDisc("decision_seconds", 0.9),
            )
            .order_by("-count", "tool_name")[:MAX_TOOLS]
        )
        return [dict(row) for row in found]
    # Elsewhere (SQLite): rank each tool's times in one window query and keep
    # only the two nearest-rank rows per tool.
    tools = dict(
        decided.values("tool_name")
        .annotate(count=Count("pk"))
        .order_by("-count", "tool_name")
        .values_list("tool_name", "count")[:MAX_TOOLS]
    )
    by_tool = Window(Count("pk"), partition_by=[F("tool_name")])
    ranked = decided.filter(tool_name__in=tools).annotate(
        rank=Window(
            RowNumber(), partition_by=[F("tool_name")], order_by=F("decision_seconds").asc()
        ),
        median_rank=Ceil(by_tool * 0.5),
        p90_rank=Ceil(by_tool * 0.9),
    )
    picked = ranked.filter(Q(rank=F("median_rank")) | Q(rank=F("p90_rank"))).values(
        "tool_name", "decision_seconds", "rank", "median_rank", "p90_rank"
    )
    result = {name: {"tool_name": name, "count": count} for name, count in tools.items()}
    for row in picked:
        found = result[row["tool_name"]]
        if row["rank"] == row["median_rank"]:
            found["median"] = row["decision_seconds"]
        if row["rank"] == row["p90_rank"]:
            found["p90"] = row["decision_seconds"]
    return list(result.values())


def _asked_share(rows) -> list[dict]:
    found = (
        rows.values("tool_name")
        .annotate(total=Count("pk"), automatic=Count("pk", filter=Q(reason__in=AUTOMATIC)))
        .order_by("-total", "tool_name")[:MAX_TOOLS]
    )
    share = []
    for row in found:
        asked = row["total"] - row["automatic"]
        share.append({**row, "asked": asked, "asked_percent": round(100 * asked / row["total"], 1)})
    return share


def _most_denied(rows) -> list[dict]:
    denied = rows.filter(OUTCOMES["denied"][1])
    found = (
        denied.values("tool_name", "subject")
        .annotate(count=Count("pk"))
        .order_by("-count", "tool_name", "subject")[:TOP]
    )
    return [dict(row) for row in found]


def _rule_hits(rows) -> list[dict]:
    rules = list(ToolRule.objects.filter(hits__gt=0).order_by("-hits", "pk")[:TOP])
    if not rules:
        return []
    # The row of the decision that made a rule links it too, but is no hit.
    hit_rows = rows.filter(rule__in=rules).exclude(reason=Reason.ALWAYS_ALLOW)
    in_period = dict(hit_rows.values("rule").annotate(n=Count("pk")).values_list("rule", "n"))
    found = []
    for rule in rules:
        period = in_period.get(rule.pk, 0)
        # Rows older than the counter (or a counter reset) never make "all
        # time" read less than "this period".
        found.append({"rule": rule, "hits": max(rule.hits, period), "in_period": period})
    return found


def _pending() -> list[dict]:
    found = (
        ToolApproval.objects.pending()
        .values("tool_name")
        .annotate(
            count=Count("pk"),
            for_review=Count("pk", filter=Q(needs_review=True)),
            oldest=Min("requested_at"),
        )
        .order_by("-count", "tool_name")
    )
    return [dict(row) for row in found]


# --- charts ---------------------------------------------------------------------------

DANGER = "#c92a2a"


def _style(*colors: str) -> Style:
    return Style(
        background="transparent",
        plot_background="transparent",
        foreground="#333",
        foreground_strong="#222",
        foreground_subtle="#ddd",
        colors=colors,
        font_family="system-ui, sans-serif",
        label_font_size=11,
        major_label_font_size=11,
        legend_font_size=12,
        title_font_size=14,
    )


# Allowed by a person and by a rule or setting read apart at
# a glance (green and cyan): they were two near-identical greens.
ALLOWED_BY_PERSON, ALLOWED_BY_RULE = "#2b8a3e", "#15aabf"
STYLE = _style(ALLOWED_BY_PERSON, ALLOWED_BY_RULE, DANGER, "#868e96", "#3b5bdb", "#e67700")
# Denials are drawn in the danger colour, whatever their place among the series.
DENIED_STYLE = _style(DANGER)


def _count_axis(top: float) -> list[int]:
    """Whole-number ticks from 0 past ``top``: counts are never 0.1 of a call."""
    step = max(1, math.ceil(top / 6))
    return list(range(0, int(top) + step + 1, step))


_SCRIPT = re.compile(r"<script\b.*?</script>", re.S)


def _chart(kind, *, style: Style = STYLE, **options) -> pygal.Graph:
    return kind(
        style=style,
        js=[],  # no scripts (and never a CDN): the SVG is a picture
        disable_xml_declaration=True,
        width=760,
        height=300,
        legend_at_bottom=True,
        legend_at_bottom_columns=2,
        truncate_legend=-1,
        truncate_label=50,
        print_values=False,
        **options,
    )


def _svg(chart: pygal.Graph) -> str:
    return _SCRIPT.sub("", chart.render(is_unicode=True))


def charts(board: Dashboard) -> dict[str, str]:
    """The dashboard's pictures as inline SVG (the page shows the numbers as tables too)."""
    keys = ("per_day", "decision_times", "asked_share", "most_denied", "rule_hits", "pending")
    svgs: dict[str, str] = dict.fromkeys(keys, "")
    per_day = _chart(
        pygal.StackedBar,
        title=f"Approvals per day, by outcome (last {board.days} days)",
        x_label_rotation=-45 if board.days > 7 else 0,
        show_minor_x_labels=False,
    )
    labels = [row["day"].strftime("%b %d") for row in board.per_day]
    per_day.x_labels = labels
    per_day.y_labels = _count_axis(
        max((sum(row[key] for key in OUTCOMES) for row in board.per_day), default=0)
    )
    per_day.x_labels_major = labels[:: max(1, len(labels) // 10)]
    for key, (label, _) in OUTCOMES.items():
        per_day.add(label, [row[key] for row in board.per_day])
    svgs["per_day"] = _svg(per_day)

    def tool(row: dict) -> str:
        return row["tool_name"]

    # key: (chart kind, title, a bar's label, {legend: row key}, options); all but
    # the decision times are counts.
    bars = {
        "decision_times": (
            pygal.Bar,
            "Time to a person's decision per tool (seconds)",
            tool,
            {"median": "median", "90th percentile": "p90"},
            {},
        ),
        "asked_share": (
            pygal.HorizontalStackedBar,
            "Calls that asked vs ran without asking, per tool",
            tool,
            {"asked a person": "asked", "without asking": "automatic"},
            {},
        ),
        "most_denied": (
            pygal.HorizontalBar,
            "Most denied calls",
            lambda row: f"{row['tool_name']}: {short(row['subject'], 48)}",
            {"denied": "count"},
            {"show_legend": False, "style": DENIED_STYLE},
        ),
        "rule_hits": (
            pygal.HorizontalBar,
            "Rule hits",
            lambda row: short(str(row["rule"]), 48),
            {"all time": "hits", f"last {board.days} days": "in_period"},
            {},
        ),
        "pending": (
            pygal.Bar,
            "Waiting right now, per tool",
            tool,
            {"waiting": "count", "for a reviewer": "for_review"},
            {},
        ),
    }
    for key, (kind, title, label, series, options) in bars.items():
        rows = getattr(board, key)
        if rows:  # an empty chart says nothing the table does not
            chart = _chart(kind, title=title, **options)
            chart.x_labels = [label(row) for row in rows]
            for legend, column in series.items():
                chart.add(legend, [row[column] for row in rows])
            if key != "decision_times":
                stacked = kind is pygal.HorizontalStackedBar
                sums = [
                    sum(row[c] for c in series.values())
                    if stacked
                    else max(row[c] for c in series.values())
                    for row in rows
                ]
                chart.y_labels = _count_axis(max(sums, default=0))
            svgs[key] = _svg(chart)
    return svgs
