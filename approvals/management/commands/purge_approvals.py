from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from approvals.export import archive_write
from approvals.models import ToolApproval
from approvals.services.waiting import approvals_expire_stale
from approvals.signals import approvals_purged


class Command(BaseCommand):
    help = (
        "Expire pending tool approvals older than their timeout (marked denied, reason "
        "'expired'; a running server times them out itself) and delete decided approvals "
        "older than --older-than days. Open tabs see expired cards change, and a server "
        "resumes their runs. Safe to run repeatedly, e.g. from cron."
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
            "(default: STUDIO_APPROVAL_TIMEOUT).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print what would be done; change nothing."
        )
        parser.add_argument(
            "--archive",
            metavar="FILE",
            default=None,
            help="Append the rows about to be deleted to FILE as JSON lines first (every "
            "field). If FILE cannot be written, nothing is deleted.",
        )

    def handle(
        self,
        *args,
        older_than: float,
        expire_pending_older_than: float | None,
        dry_run: bool,
        archive: str | None = None,
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
        old = ToolApproval.objects.decided_before(before=now - timedelta(days=older_than))
        doomed: list[int] | None = None
        if archive and not dry_run:
            # The archive first: if it cannot be written, nothing is deleted.
            doomed = list(old.order_by("pk").values_list("pk", flat=True))
            try:
                archived = archive_write(Path(archive), _rows(doomed))
            except OSError as exc:
                raise CommandError(f"Could not write the archive {archive}: {exc}") from None
            if verbosity >= 1:
                self.stdout.write(f"Archived {archived} decided approval(s) to {archive}.")
        with transaction.atomic():
            # Rows expired now are fresh (decided_at=now), so the delete below
            # never takes them in the same run.
            expired = approvals_expire_stale(
                before=now - timedelta(seconds=pending_age), dry_run=dry_run
            )
            if dry_run:
                deleted = old.count()
            elif doomed is not None:
                deleted = _delete(doomed)  # exactly the archived rows
            else:
                deleted = old.delete()[0]
            # Other apps remove what they kept for these rows alone.
            reports = [said for _, said in approvals_purged.send(self.__class__, dry_run=dry_run)]
        if verbosity >= 1:
            style = self.style.NOTICE if dry_run else self.style.SUCCESS
            verb, deleted_verb = (
                ("Would expire", "would delete") if dry_run else ("Expired", "deleted")
            )
            self.stdout.write(
                style(
                    f"{verb} {expired} pending approval(s) older than {_age(pending_age)}; "
                    f"{deleted_verb} {deleted} decided approval(s) "
                    f"older than {older_than:g} day(s)."
                )
            )
            for said in filter(None, reports):
                self.stdout.write(style(said))


CHUNK = 1000


def _rows(ids: list[int]) -> Iterator[ToolApproval]:
    for start in range(0, len(ids), CHUNK):
        yield from ToolApproval.objects.filter(pk__in=ids[start : start + CHUNK]).order_by("pk")


def _delete(ids: list[int]) -> int:
    deleted = 0
    for start in range(0, len(ids), CHUNK):
        deleted += ToolApproval.objects.filter(pk__in=ids[start : start + CHUNK]).delete()[0]
    return deleted


def _age(seconds: float) -> str:
    """``259200`` reads as "3 days", ``7200`` as "2 hours"; other ages in seconds."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} s"
