"""Rows one process claims and POSTs from a small pool of its own.

The webhook's announcements (``approvals.webhook``) and the API's callbacks
(``approvals.callbacks``) are both this: each poll (and, for callbacks, at
once after a decision commits) a process claims the rows that are due, one
conditional update per row so that each is claimed by one process across
processes, and POSTs each from its own small pool: never a run's thread,
never the event loop. A message lost on the way costs a poll, not a POST.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from datetime import datetime

from django.conf import settings
from django.db.models import QuerySet

from approvals.models import ToolApproval
from studio.runtime import DaemonPool, release_connection


def claim_each(rows: QuerySet, pks: Iterable, *, field: str, now: datetime) -> list:
    """The ``pks`` this caller claimed: each of ``rows`` whose ``field`` was unset,
    set to ``now`` by one conditional update (the first caller wins it)."""
    unset = {f"{field}__isnull": True}
    return [pk for pk in pks if rows.filter(pk=pk, **unset).update(**{field: now})]


class ClaimedPosts:
    """What is due (``claim``), each row POSTed (``post``) on a pool of two threads."""

    def __init__(
        self,
        name: str,
        *,
        claim: Callable[[], list[ToolApproval]],
        post: Callable[[ToolApproval], object],
        logger: logging.Logger,
        enabled: Callable[[], bool] = lambda: True,
    ) -> None:
        self.name, self.claim, self.post = name, claim, post
        self.logger, self.enabled = logger, enabled
        self._pool: DaemonPool | None = None

    def pool(self) -> DaemonPool:
        if self._pool is None:
            self._pool = DaemonPool(2, f"studio-{self.name.split()[-1]}")
        return self._pool

    def tick(self) -> int:
        """Claim what is due and hand each POST to the pool; returns how many."""
        claimed = self.claim()
        for approval in claimed:
            self.pool().submit(self._post_and_release, approval)
        return len(claimed)

    def nudge(self) -> None:
        """Something became due: look now, not at the next poll."""
        self.pool().submit(self._tick_and_release)

    async def loop(self, rt) -> None:
        """A runtime service: look for due rows every poll (a nudge may have been lost)."""
        while True:
            await asyncio.sleep(settings.STUDIO_APPROVAL_POLL_SECONDS)
            if not self.enabled():
                continue
            try:
                await rt.off_loop(self.tick)
            except Exception:
                self.logger.warning("%s: looking for due rows failed", self.name, exc_info=True)

    def _post_and_release(self, approval: ToolApproval) -> None:
        try:
            self.post(approval)
        except Exception:
            self.logger.exception("%s for %s failed", self.name, approval.approval_id)
        finally:
            release_connection()

    def _tick_and_release(self) -> None:
        try:
            self.tick()
        except Exception:
            self.logger.warning("%s: looking for due rows failed", self.name, exc_info=True)
        finally:
            release_connection()
