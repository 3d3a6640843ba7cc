"""Claiming a run: one conditional update, first claim wins, on any database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.services.decisions import approval_decide
from chat.models import Run
from chat.runs.state import run_claim, run_release
from chat.services import run_create
from tests.factories import make_approval
from tests.helpers.races import run_together

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]


def new_run(conversation, user, n: int, owner: str = "") -> Run:
    run, _ = run_create(
        run_id=f"00000000-0000-0000-0000-{n:012d}",
        conversation_id=conversation.pk,
        user=user,
        text="go",
        owner=owner,
    )
    return run


def test_two_claims_race_and_one_wins(conversation, alice):
    """Runs on PostgreSQL too (anydb): one conditional update, first claim wins."""
    for round_ in range(20):
        run = new_run(conversation, alice, round_)
        claims = run_together(
            [
                lambda n=n, run_id=str(run.pk): run_claim(run_id=run_id, owner=f"process-{n}")
                for n in range(4)
            ]
        )
        winners = [c for c in claims if c is not None]
        assert len(winners) == 1, claims
        assert Run.objects.get(pk=run.pk).owner == winners[0].run.owner
        Run.objects.filter(pk=run.pk).update(status="done")


def test_a_run_being_stepped_is_not_claimed_until_its_owner_is_stale(conversation, alice, settings):
    run = new_run(conversation, alice, 1, owner="process-a")
    assert run_claim(run_id=str(run.pk), owner="process-b") is None
    old = timezone.now() - timedelta(seconds=settings.STUDIO_RUN_STALE_SECONDS + 1)
    Run.objects.filter(pk=run.pk).update(heartbeat_at=old)
    claim = run_claim(run_id=str(run.pk), owner="process-b")
    assert claim is not None and claim.resumed
    assert Run.objects.get(pk=run.pk).resumes == 1


def test_a_waiting_run_is_claimed_only_once_its_call_is_decided(conversation, alice):
    run = new_run(conversation, alice, 1, owner="process-a")
    approval = make_approval(conversation, run_id=str(run.pk))
    assert run_release(run_id=str(run.pk), owner="process-a", waiting_on=approval.approval_id)
    assert run_claim(run_id=str(run.pk), owner="process-b") is None  # nothing to do yet
    approval_decide(approval_id=approval.approval_id, user=alice, decision="allow")
    claim = run_claim(run_id=str(run.pk), owner="process-b")
    assert claim is not None and not claim.resumed  # woken, not taken over
    assert Run.objects.get(pk=run.pk).state == "working"


def test_a_release_by_a_process_that_lost_the_run_changes_nothing(conversation, alice):
    run = new_run(conversation, alice, 1, owner="process-b")
    assert not run_release(run_id=str(run.pk), owner="process-a", waiting_on="x")
    assert Run.objects.get(pk=run.pk).owner == "process-b"


def test_a_run_id_that_is_no_run_of_ours_claims_nothing():
    assert run_claim(run_id="not-a-uuid", owner="process-a") is None
    assert run_claim(run_id="", owner="process-a") is None


def test_a_run_handed_over_at_its_start_is_claimed_as_started_not_resumed(conversation, alice):
    """A process that serves no loop (a WSGI worker) makes the run with no owner."""
    run = new_run(conversation, alice, 1, owner="")
    assert Run.objects.get(pk=run.pk).handed_over
    claim = run_claim(run_id=str(run.pk), owner="process-a")
    assert claim is not None and claim.started and not claim.resumed
    stored = Run.objects.get(pk=run.pk)
    assert (stored.owner, stored.handed_over, stored.resumes) == ("process-a", False, 0)
    # Left again by an exiting process, the same run is taken over, not started.
    Run.objects.filter(pk=run.pk).update(owner="")
    claim = run_claim(run_id=str(run.pk), owner="process-b")
    assert claim is not None and claim.resumed and not claim.started


def test_a_run_remembers_the_process_that_stepped_it_last(conversation, alice):
    """Where its python session is: kept while it waits, moved by a claim."""
    run = new_run(conversation, alice, 2, owner="process-a")
    approval = make_approval(conversation, run_id=run.pk)
    assert run_release(run_id=str(run.pk), owner="process-a", waiting_on=approval.approval_id)
    assert Run.objects.get(pk=run.pk).stepped_by == "process-a"  # while it waits, too
    approval_decide(approval_id=approval.approval_id, user=alice, decision="allow")
    assert run_claim(run_id=str(run.pk), owner="process-b").run.stepped_by == "process-b"
    assert Run.objects.get(pk=run.pk).stepped_by == "process-b"
