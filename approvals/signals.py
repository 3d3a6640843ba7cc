"""Signals approvals offers other apps, so it never imports them."""

from __future__ import annotations

from django.dispatch import Signal

# Sent after commit whenever pending calls leave "pending" (a decision, a
# timeout, a Stop, an expiry), with ``run_ids``: the runs that may go on.
# Chat answers it by resuming those runs in this process.
calls_settled = Signal()
