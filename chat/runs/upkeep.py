"""A process's upkeep of runs: the heartbeat, the sweep and the wind-down at exit.

Each is a small function a test can call (``heartbeat_once``, ``wind_down``);
``heartbeat`` and ``sweep`` are the runtime's services that call them.
"""

from __future__ import annotations

import asyncio
import logging
import time

from django.conf import settings
from django.utils import timezone

from chat.runs.commands import run_wake
from chat.runs.local import local_runs
from chat.runs.state import (
    run_heartbeat,
    runs_abandon,
    runs_forget_process,
    runs_to_resume,
)
from chat.tools.sessions import SESSIONS
from studio.runtime import Runtime, release_connection

logger = logging.getLogger(__name__)

# The sweep re-reads every waiting run this often, besides its quick look at
# the calls decided since its last one.
FULL_SWEEP_SECONDS = 60.0


async def heartbeat(rt: Runtime) -> None:
    """Tell the database this process's working runs are alive (STUDIO_RUN_STALE_SECONDS),
    and hear of a Stop whose message was lost."""
    while True:
        await asyncio.sleep(settings.STUDIO_RUN_HEARTBEAT_SECONDS)
        try:
            await rt.off_loop(heartbeat_once, rt)
        except Exception:
            logger.warning("run heartbeat failed", exc_info=True)
            continue
        if SESSIONS.held():
            try:
                # A Stop or Restart pressed in another process ends this one's session.
                await rt.off_loop(SESSIONS.end_reset)
            except Exception:
                logger.warning("python sessions check failed", exc_info=True)


def heartbeat_once(rt: Runtime) -> None:
    """Mark this process's working runs alive; end the steps of runs another claim
    took over (this process paused past STUDIO_RUN_STALE_SECONDS), stop the
    runs Stop was pressed for."""
    local = local_runs(rt).all()
    beat = run_heartbeat(
        owner=rt.inbox.name, claims={run_id: run.claim for run_id, run in local.items()}
    )
    for run_id in beat.lost:
        logger.warning("run %s was taken over while this process paused; its step ends", run_id)
        local[run_id].cancel.abandon()
    for run_id in beat.stopped:
        local[run_id].cancel.cancel()


async def sweep(rt: Runtime) -> None:
    """Resume what no message resumed: timeouts, runs of processes that exited or
    died, decisions whose resume was lost. Any process may; first claim wins."""
    since, full_at = timezone.now(), float("-inf")
    while True:
        await asyncio.sleep(settings.STUDIO_APPROVAL_POLL_SECONDS)
        if rt.stopping:
            return
        started, now = time.monotonic(), timezone.now()
        full = started - full_at >= FULL_SWEEP_SECONDS
        try:
            run_ids = await rt.off_loop(runs_to_resume, since=None if full else since)
        except Exception:
            logger.warning("run sweep failed", exc_info=True)
            continue
        since = now
        if full:
            full_at = started
        run_wake(run_ids)


def wind_down(rt: Runtime) -> None:
    """The process is exiting: give working steps STUDIO_SHUTDOWN_GRACE_SECONDS to finish,
    then leave the rest for another process. Waiting runs belong to no process."""
    grace = settings.STUDIO_SHUTDOWN_GRACE_SECONDS
    deadline = time.monotonic() + grace
    beat = 0.0
    owner = rt.inbox.name
    table = local_runs(rt)
    while table.all() and time.monotonic() < deadline:
        if time.monotonic() - beat >= 1.0:
            beat = time.monotonic()
            try:
                heartbeat_once(rt)
            except Exception:
                logger.warning("run heartbeat failed while winding down", exc_info=True)
        time.sleep(0.05)
    left = table.all()
    if owner and table.stepped_any:
        try:
            runs_forget_process(owner=owner)
        except Exception:
            logger.warning("could not clear this process from its runs", exc_info=True)
    if not left:
        release_connection()
        return
    for local in left.values():
        local.cancel.abandon()
    try:
        runs_abandon(run_ids=list(left), owner=owner)
    finally:
        release_connection()
    logger.warning(
        "%d run(s) still working after %.0f s; left for another process to resume",
        len(left),
        grace,
    )
