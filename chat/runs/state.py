"""A run's row and its transitions: the run state machine.

Every transition is one conditional update (or a row held ``FOR UPDATE``),
so two processes never both win one::

                 run_create (chat.services)
                          |
                          v
      +------------> working (owner = a process, claim = n) ----------+
      |                   |        |           |                      |
      |    run_release    |        | run_finish|   runs_abandon,      |
      |   (a call waits)  |        v           |   the owner's heart- |
      |                   v      done / error / |   beat goes stale    |
      |   waiting (no owner, waiting_on = a call)   cancelled          |
      |                   |                     v                     |
      +--- run_claim -----+        left (no owner, not waiting) <-----+
           (decided, timed out, stopped;       |
            or left: claim = n + 1)   run_claim (taken over)

``run_fence`` holds the row for one step's owner and claim number inside
each of that step's writes: a step whose run was claimed since (it paused
past ``STUDIO_RUN_STALE_SECONDS``) is fenced out and writes nothing more.
``run_heartbeat`` keeps the working runs alive and says which were lost or
stopped; an owner that exited on this host is known at once
(``processes_gone``), not only by its stale heartbeat; ``runs_to_resume`` is what a sweep may claim.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from approvals.models import ToolApproval
from approvals.services.waiting import approval_cancel_run, approvals_time_out
from chat.mcp import servers_version
from chat.models import Run
from studio import process
from studio.db import one_or_none

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    run: Run
    # Taken over from a process that exited or died (not woken by a decision).
    resumed: bool
    # Its first step: handed over by the process that started it (run_create).
    started: bool = False
    # The MCP servers' version as the claim read the run (``chat.mcp.servers_version``).
    mcp_version: tuple | None = None


def run_claim(*, run_id: str, owner: str) -> Claim | None:
    """Take the run to step it, if it can go on and nobody steps it; first claim wins.

    It can be claimed when it waits and the call it waits on was decided (or
    it was stopped), when an exiting process left it, or when its owner's
    heartbeat is older than STUDIO_RUN_STALE_SECONDS (that process died).
    One conditional update on the row as read decides between claimants.
    """
    try:
        uuid.UUID(str(run_id))
    except ValueError:
        return None  # an approval of no run of ours (written by hand, imported)
    run = one_or_none(
        Run.objects.running()
        .select_related("conversation__model", "started_by")
        .annotate(**servers_version())
        .filter(pk=run_id)
    )
    if run is None:
        return None
    now = timezone.now()
    stale = run.heartbeat_at < now - timedelta(seconds=settings.STUDIO_RUN_STALE_SECONDS)
    if run.owner and not stale and not process.gone(run.owner_process):
        return None  # being stepped
    started = run.handed_over and not run.owner
    resumed = bool(run.owner) or (not run.waiting_on and not started)
    claimable = Run.objects.filter(
        pk=run.pk, status=Run.Status.RUNNING, owner=run.owner, heartbeat_at=run.heartbeat_at
    )
    if not run.owner and run.waiting_on and not run.stop_requested:
        # Nothing to do while the call it waits on still waits.
        claimable = claimable.exclude(
            Exists(ToolApproval.objects.pending().filter(approval_id=OuterRef("waiting_on")))
        )
    won = claimable.update(
        owner=owner,
        owner_process=process.identity(),
        stepped_by=owner,
        waiting_on="",
        heartbeat_at=now,
        handed_over=False,
        resumes=F("resumes") + int(resumed),
        claim=F("claim") + 1,
    )
    if not won:
        return None
    if resumed:
        logger.info("run %s resumed here (it was %s)", run.pk, run.owner or "left by its process")
    run.owner, run.waiting_on, run.heartbeat_at, run.handed_over = owner, "", now, False
    # The row matched as read, so its number was the one read.
    run.stepped_by, run.claim = owner, run.claim + 1
    mcp_version = (run.mcp_servers, run.mcp_servers_at)
    return Claim(run=run, resumed=resumed, started=started, mcp_version=mcp_version)


class Fenced(Exception):
    """A step's claim on its run is gone (another process took the run over, or
    it ended): the step writes nothing more."""


def run_held(*, run_id: str, owner: str, claim: int):
    """The run, while this owner's claim number still holds it (the fence's test)."""
    return Run.objects.filter(pk=run_id, status=Run.Status.RUNNING, owner=owner, claim=claim)


def run_fence(*, run_id: str, owner: str, claim: int) -> bool:
    """Hold the run for this step's claim until the transaction commits; raises ``Fenced``.

    The first statement of every write a step makes, inside that write's
    transaction: it locks the run's row, so a takeover (a conditional update
    of the same row) either waits for this write or this write sees it.
    Returns False when Stop was pressed: a step then starts nothing new (no
    model turn saved, no card, no tool), whichever process Stop was pressed
    in and wherever its message went.

    ``FOR NO KEY UPDATE`` (PostgreSQL): it conflicts with a takeover's update,
    not with another write's insert of a row that refers to the run (a result
    message fenced by its audit row's update, ``Agent._fenced``), which
    holding the row ``FOR UPDATE`` would deadlock with.
    """
    stop_requested = one_or_none(
        run_held(run_id=run_id, owner=owner, claim=claim)
        .select_for_update(no_key=True)
        .values_list("stop_requested", flat=True)
    )
    if stop_requested is None:
        raise Fenced(run_id)
    return not stop_requested


def approval_pending(approval_id: str) -> bool:
    return ToolApproval.objects.pending().filter(approval_id=approval_id).exists()


def run_release(*, run_id: str, owner: str, waiting_on: str, claim: int | None = None) -> bool:
    """The run waits for a decision on ``waiting_on``: it belongs to no process now.

    ``claim``: only if the step's claim still holds it (see ``run_fence``).
    """
    runs = Run.objects.running().filter(pk=run_id, owner=owner)
    if claim is not None:
        runs = runs.filter(claim=claim)
    return bool(runs.update(owner="", waiting_on=waiting_on, heartbeat_at=timezone.now()))


def runs_abandon(*, run_ids: list[str], owner: str) -> int:
    """Leave runs this exiting process was stepping for another process to resume at once."""
    return (
        Run.objects.running()
        .filter(pk__in=run_ids, owner=owner)
        .update(owner="", waiting_on="", heartbeat_at=timezone.now())
    )


def runs_forget_process(*, owner: str) -> int:
    """This process exits, and the python sessions it held end: no run prefers it now."""
    return Run.objects.running().filter(stepped_by=owner).update(stepped_by="")


def run_finish(
    *,
    run_id: str,
    status: str,
    owner: str | None = None,
    claim: int | None = None,
    error: str = "",
    unless_stopped: bool = False,
) -> bool:
    """Record how the run ended (by its owner, and with its claim, when given);
    False when the run had ended already or another holds it (or, with
    ``unless_stopped``, when Stop was pressed)."""
    runs = Run.objects.filter(pk=run_id, status=Run.Status.RUNNING)
    if unless_stopped:
        runs = runs.filter(stop_requested=False)
    if owner is not None:
        runs = runs.filter(owner=owner)
    if claim is not None:
        runs = runs.filter(claim=claim)
    return bool(
        runs.update(
            status=status,
            owner="",
            waiting_on="",
            error=error[:2000],
            finished_at=timezone.now(),
        )
    )


@dataclass(frozen=True)
class Heartbeat:
    # Runs another claim took over meanwhile (this process paused past
    # STUDIO_RUN_STALE_SECONDS): their steps here must end, writing nothing.
    lost: list[str]
    # Runs Stop was pressed for (its message may have been lost).
    stopped: list[str]


def run_heartbeat(*, owner: str, claims: dict[str, int]) -> Heartbeat:
    """Mark the runs ``owner`` steps (run id -> claim number) alive, and say which
    of them it lost and which were stopped."""
    if not owner or not claims:
        return Heartbeat(lost=[], stopped=[])
    held = Q()
    for run_id, claim in claims.items():
        held |= Q(pk=run_id, claim=claim)
    runs = Run.objects.running().filter(held, owner=owner)
    runs.update(heartbeat_at=timezone.now())
    alive = dict(runs.values_list("id", "stop_requested"))
    return Heartbeat(
        lost=[run_id for run_id in claims if uuid.UUID(run_id) not in alive],
        stopped=[str(run_id) for run_id, stop in alive.items() if stop],
    )


def run_stop_request(*, conversation_id: int, user) -> Run | None:
    """Mark the conversation's run as stopped and end the calls it waits on; returns it.

    A waiting run's next step (the calls ending wakes it) then ends it; a
    working one hears of it through its cancel token (the caller's part).
    """
    run = (
        Run.objects.running()
        .filter(conversation_id=conversation_id, conversation__owner=user)
        .only("id", "owner")
        .first()
    )
    if run is None:
        return None
    Run.objects.filter(pk=run.pk).update(stop_requested=True)
    approval_cancel_run(run_id=str(run.pk))
    return run


# At most this many runs are resumed per sweep (the next sweep takes the rest).
SWEEP_BATCH = 200


def runs_to_resume(*, since: datetime | None = None) -> list[str]:
    """Runs that can go on and that nobody steps: what a sweep resumes.

    First the calls whose time is up end (their runs are woken like any).
    Then: runs an exiting process left, runs whose owner died, and waiting
    runs whose call was decided (``since``: only those decided since then;
    None: every waiting run is looked at).
    """
    approvals_time_out()
    now = timezone.now()
    running = Run.objects.running()
    stale = Q(heartbeat_at__lt=now - timedelta(seconds=settings.STUDIO_RUN_STALE_SECONDS))
    dead = running.exclude(owner="").filter(stale | Q(owner_process__in=processes_gone()))
    left = running.filter(owner="", waiting_on="")
    waiting = running.filter(owner="").exclude(waiting_on="")
    if since is None:
        pending = ToolApproval.objects.pending().filter(approval_id=OuterRef("waiting_on"))
        decided = waiting.exclude(Exists(pending))
    else:
        recent = ToolApproval.objects.decided().filter(decided_at__gte=since - SWEEP_OVERLAP)
        decided = waiting.filter(waiting_on__in=recent.values("approval_id"))
    ids: list[str] = []
    for runs in (dead, left, decided):
        ids += [str(i) for i in runs.values_list("id", flat=True)[: SWEEP_BATCH - len(ids)]]
    return ids


def processes_gone() -> list[str]:
    """Processes of this host that own runs and have exited: a restart (or a
    crash) is known at once, not after STUDIO_RUN_STALE_SECONDS."""
    host = process.this_host()
    if not host:
        return []
    owners = (
        Run.objects.running()
        .exclude(owner="")
        .filter(owner_process__startswith=host)
        .exclude(owner_process=process.identity())
        .values_list("owner_process", flat=True)
        .distinct()
    )
    return [owner for owner in owners if process.gone(owner)]


# The quick sweep reaches this far before the previous one (clock skew
# between processes, commits that took a moment).
SWEEP_OVERLAP = timedelta(seconds=5)
