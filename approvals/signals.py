"""Signals approvals offers other apps, so it never imports them."""

from __future__ import annotations

from django.dispatch import Signal

# Sent by ``manage.py purge_approvals`` before it expires and deletes rows,
# with ``dry_run`` and ``report`` (a list each receiver appends a line to).
# Chat answers it by retiring the runs of dead server processes.
purge_requested = Signal()
