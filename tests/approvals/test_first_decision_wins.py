"""First decision wins: 16 racing deciders, as threads and as OS processes."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections

from approvals.models import ToolApproval
from approvals.services.decisions import approval_decide
from tests.factories import make_approval
from tests.helpers.procs import spawn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anydb]

DECIDERS = 16
BOUND = 60


def test_16_threads_exactly_one_wins(conversation, alice):
    approval = make_approval(conversation)
    barrier = threading.Barrier(DECIDERS, timeout=BOUND)
    results: list[bool] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def decide(i: int) -> None:
        try:
            barrier.wait()
            result = approval_decide(
                approval_id=approval.approval_id, user=alice, decision="allow" if i % 2 else "deny"
            )
            with lock:
                results.append(result.resolved)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=decide, args=(i,)) for i in range(DECIDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert sorted(results) == [False] * (DECIDERS - 1) + [True]
    row = ToolApproval.objects.get(pk=approval.pk)
    assert row.status in ("allowed", "denied") and row.decided_at is not None


def test_16_processes_exactly_one_wins(conversation, alice):
    approval = make_approval(conversation)
    procs = [
        spawn("decide_proc.py", approval.approval_id, "alice", "allow" if i % 2 else "deny")
        for i in range(DECIDERS)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", p.stderr.read()
        # Release them together: each is blocked on its stdin.
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outcomes = []
        for p in procs:
            out, err = p.communicate(timeout=BOUND)
            assert p.returncode == 0, err
            outcomes.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    winners = [o for o in outcomes if o["resolved"]]
    assert len(winners) == 1
    row = ToolApproval.objects.get(pk=approval.pk)
    assert row.status == winners[0]["status"]
    assert all(o["status"] == row.status for o in outcomes)
