"""What the approvals look like now, for ``/metrics`` (read at scrape time)."""

from __future__ import annotations

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from approvals.models import ToolApproval


class WaitingCalls:
    """``studio_calls_waiting`` by tool and reviewer, and the oldest one's age."""

    def describe(self) -> list:
        return []  # nothing is read at registration

    def collect(self):
        pending = ToolApproval.objects.pending()
        waiting = GaugeMetricFamily(
            "studio_calls_waiting",
            "Tool calls waiting for a decision, by tool and whether they wait for a reviewer.",
            labels=["tool", "for_reviewer"],
        )
        rows = pending.values("tool_name", "needs_review").annotate(n=Count("id"))
        for row in rows.order_by("tool_name", "needs_review"):
            waiting.add_metric([row["tool_name"], str(row["needs_review"]).lower()], row["n"])
        yield waiting
        oldest = pending.aggregate(at=Min("requested_at"))["at"]
        age = (timezone.now() - oldest).total_seconds() if oldest is not None else 0.0
        yield GaugeMetricFamily(
            "studio_oldest_waiting_call_age_seconds",
            "How long the call waiting longest has waited (0 when none waits).",
            value=max(0.0, age),
        )
