"""Signals approvals offers other apps, so it never imports them."""

from __future__ import annotations

from django.dispatch import Signal

# Sent after commit whenever pending calls leave "pending" (a decision, a
# timeout, a Stop, an expiry), with ``run_ids``: the runs that may go on.
# Chat answers it by resuming those runs in this process.
calls_settled = Signal()

# Sent by purge_approvals inside its transaction, after it deleted old rows,
# with ``dry_run``. Receivers remove what was kept only for those rows and
# return a line to report ("" for nothing): chat removes the chats its members
# deleted once no approval row of theirs is left.
approvals_purged = Signal()
