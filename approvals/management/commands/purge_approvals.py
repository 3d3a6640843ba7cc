from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from approvals.models import ToolApproval
from chat.services import run_retire_stale


class Command(BaseCommand):
    help = (
        "Expire pending tool approvals whose waiter can no longer be alive (marked "
        "denied, reason 'expired') and delete decided approvals older than --older-than "
        "days. Pending approvals of runs whose server process died (stale heartbeat) "
        "are expired at once. Safe to run repeatedly, e.g. from cron."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            default=90,
            metavar="DAYS",
            help="Delete decided approvals decided more than DAYS ago (default 90).",
        )
        parser.add_argument(
            "--expire-pending-older-than",
            type=float,
            default=None,
            metavar="SECONDS",
            help="Expire pending approvals requested more than SECONDS ago "
            "(default: STUDIO_APPROVAL_TIMEOUT, after which no waiter is left).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print what would be done; change nothing."
        )

    def handle(
        self,
        *args,
        older_than: float,
        expire_pending_older_than: float | None,
        dry_run: bool,
        **options,
    ) -> None:
        verbosity = options["verbosity"]
        if older_than < 0 or (
            expire_pending_older_than is not None and expire_pending_older_than < 0
        ):
            self.stderr.write(self.style.ERROR("Ages must not be negative."))
            raise SystemExit(2)
        now = timezone.now()
        pending_age = (
            settings.STUDIO_APPROVAL_TIMEOUT
            if expire_pending_older_than is None
            else expire_pending_older_than
        )
        stale = ToolApproval.objects.stale(before=now - timedelta(seconds=pending_age))
        old = ToolApproval.objects.decided_before(before=now - timedelta(days=older_than))

        if dry_run:
            dead_runs, orphaned = run_retire_stale(dry_run=True)
            expire_count, delete_count = stale.count(), old.count()
            verb = "Would expire"
        else:
            with transaction.atomic():
                dead_runs, orphaned = run_retire_stale()
                # One UPDATE and one DELETE, whatever the number of rows. Rows
                # expired now are fresh (decided_at=now), so the delete below
                # never takes them in the same run.
                expire_count = stale.update(
                    status=ToolApproval.Status.DENIED,
                    reason=ToolApproval.Reason.EXPIRED,
                    decided_at=now,
                )
                delete_count, _ = old.delete()
            verb = "Expired"
        if verbosity >= 1 and dead_runs:
            self.stdout.write(
                self.style.NOTICE(
                    f"{'Would retire' if dry_run else 'Retired'} {dead_runs} run(s) of dead "
                    f"server processes with {orphaned} pending approval(s)."
                )
            )
        if verbosity >= 1:
            style = self.style.NOTICE if dry_run else self.style.SUCCESS
            deleted = "would delete" if dry_run else "deleted"
            self.stdout.write(
                style(
                    f"{verb} {expire_count} pending approval(s) older than {pending_age:g} s; "
                    f"{deleted} {delete_count} decided approval(s) "
                    f"older than {older_than:g} day(s)."
                )
            )
