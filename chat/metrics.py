"""How the runs stand now, for ``/metrics`` (read at scrape time)."""

from __future__ import annotations

from django.db.models import Count, Q
from prometheus_client.core import GaugeMetricFamily

from chat.models import Run


class RunStates:
    """``studio_runs`` going on, by state: working (a process steps it), waiting
    (for a decision), ready (to be claimed)."""

    def describe(self) -> list:
        return []  # nothing is read at registration

    def collect(self):
        counts = Run.objects.running().aggregate(
            working=Count("id", filter=~Q(owner="")),
            waiting=Count("id", filter=Q(owner="") & ~Q(waiting_on="")),
            ready=Count("id", filter=Q(owner="", waiting_on="")),
        )
        runs = GaugeMetricFamily("studio_runs", "Runs going on, by state.", labels=["state"])
        for state in ("working", "waiting", "ready"):
            runs.add_metric([state], counts[state])
        yield runs
