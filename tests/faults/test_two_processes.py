"""Faults with real processes: two daphnes on PostgreSQL and a Redis of our own.

Runs outlive their processes: SIGTERM, SIGKILL, a rolling restart, a Redis
restart. (A PostgreSQL restart: tests/faults/test_postgres_restart.py.)
"""

from __future__ import annotations

import threading
import time

import pytest
from django.utils import timezone

from approvals.models import ToolApproval
from chat.models import Message
from tests.factories import make_approval, make_conversation
from tests.helpers.clients import APPROVAL_ID, Browserish, Tab, session_cookie
from tests.helpers.live import LiveServer, two_servers
from tests.helpers.procs import read_line, spawn, until
from tests.helpers.runs import park_a_run, run_of
from tests.helpers.services import cluster_env

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

BOUND = 30


@pytest.fixture
def cluster(redis_server, workspace_root, tmp_path):
    with two_servers(tmp_path, **cluster_env(redis_server.url, workspace_root)) as pair:
        yield pair


def results(conversation) -> list[str]:
    return list(
        Message.objects.filter(conversation=conversation, role="tool").values_list(
            "content", flat=True
        )
    )


def decide_and_see(server, session, conversation, approval_id: str, expect: str) -> None:
    """Decide through ``server`` and watch the result arrive in a tab of it."""
    tab = Tab(server.ws_url, conversation.pk, session, origin=server.url)
    tab.until('id="transcript"')
    page = Browserish(server.url, session)
    try:
        mark = tab.mark()
        response = page.decide(approval_id, "allow")
        assert response.status_code == 200 and response.json()["resolved"] is True
        tab.until(expect, since=mark)
        tab.until('data-running="false"', since=mark)
    finally:
        tab.close()
        page.close()


def decide_outside_and_see(tab: Tab, approval_id: str, user, redis_url: str) -> None:
    """Allow from a process that serves no loop; the result arrives in ``tab`` (then closed)."""
    child = spawn("decide_proc.py", approval_id, user.username, "allow", REDIS_URL=redis_url)
    try:
        assert read_line(child, BOUND).strip() == "ready"
        child.stdin.write("go\n")
        child.stdin.flush()
        assert '"resolved": true' in read_line(child, BOUND)
        tab.until('<pre class="output">42')
        tab.until('data-running="false"')
    finally:
        child.kill()
        tab.close()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_waiting_run_outlives_its_process(cluster, conversation, alice, how):
    """Waiting is only rows: the process going away (cleanly or not) changes nothing,
    and a decision through the other process runs the call there."""
    a, b = cluster
    session = session_cookie(alice)
    tab, approval_id = park_a_run(a, conversation, session)
    started = time.monotonic()
    a.stop() if how == "sigterm" else a.kill()
    assert time.monotonic() - started < 6, "the process took too long to exit"
    tab.ws.close()
    row = ToolApproval.objects.get(approval_id=approval_id)
    assert row.status == "pending"
    assert run_of(conversation).state == "waiting"

    decide_and_see(b, session, conversation, approval_id, '<pre class="output">42')
    run = run_of(conversation)
    assert (run.status, run.resumes) == ("done", 0)
    assert results(conversation) == ["42\n"]


def test_sigterm_gives_a_working_call_its_grace(cluster, conversation, alice, workspace_root):
    a, b = cluster
    session = session_cookie(alice)
    code = "import time; time.sleep(1.5); print('slept')"
    tab, approval_id = park_a_run(a, conversation, session, code)
    page = Browserish(a.url, session)
    assert page.decide(approval_id, "allow").status_code == 200
    page.close()
    until(lambda: ToolApproval.objects.get(approval_id=approval_id).started_at, "the call start")
    a.stop()  # SIGTERM while the call runs: it finishes, and so does the run
    tab.ws.close()
    run = run_of(conversation)
    assert run.status == "done", run.state
    assert results(conversation) == ["slept\n"]


def test_a_call_running_when_its_process_was_killed_is_reported_never_rerun(
    cluster, conversation, alice
):
    a, b = cluster
    session = session_cookie(alice)
    marks = conversation.workspace / "marks.txt"
    code = "open('marks.txt', 'a').write('ran\\n'); import time; time.sleep(60)"
    tab, approval_id = park_a_run(a, conversation, session, code)
    page = Browserish(a.url, session)
    assert page.decide(approval_id, "allow").status_code == 200
    page.close()
    until(lambda: marks.exists() and marks.read_text() == "ran\n", "the call start")
    a.kill()
    tab.ws.close()
    # B finds the dead process's run once its heartbeat is stale, and resumes it.
    tab_b = Tab(b.ws_url, conversation.pk, session, origin=b.url)
    tab_b.until("the server stopped while this ran")
    until(lambda: run_of(conversation).status == "done", "the resumed run's end")
    tab_b.close()
    assert marks.read_text() == "ran\n", "the interrupted call ran again"
    [result] = results(conversation)
    assert result.startswith("Error: interrupted: the server stopped while this ran")
    assert run_of(conversation).resumes == 1


def test_a_restart_reports_a_killed_call_at_once(
    redis_server, workspace_root, tmp_path, conversation, alice
):
    """The tab hears of a call its killed process left at once, not after the
    heartbeat goes stale: the process started in its place sees it is gone."""
    env = cluster_env(redis_server.url, workspace_root) | {"STUDIO_RUN_STALE_SECONDS": "600"}
    session = session_cookie(alice)
    marks = conversation.workspace / "marks.txt"
    code = "open('marks.txt', 'a').write('ran\\n'); import time; time.sleep(60)"
    a = LiveServer(log_path=tmp_path / "a.log", **env).start()
    try:
        tab, approval_id = park_a_run(a, conversation, session, code)
        page = Browserish(a.url, session)
        assert page.decide(approval_id, "allow").status_code == 200
        page.close()
        until(lambda: marks.exists(), "the call start")
        a.kill()
        killed = time.monotonic()
        tab.ws.close()
    finally:
        a.stop()
    again = LiveServer(log_path=tmp_path / "again.log", **env).start()
    try:
        tab = Tab(again.ws_url, conversation.pk, session, origin=again.url)
        tab.until("the server stopped while this ran", timeout=BOUND)
        assert time.monotonic() - killed < BOUND, "reported only when the heartbeat went stale"
        until(lambda: run_of(conversation).status == "done", "the resumed run's end")
        tab.close()
    finally:
        again.stop()
    assert marks.read_text() == "ran\n", "the interrupted call ran again"
    assert run_of(conversation).resumes == 1


def test_two_processes_race_to_resume_one_run(cluster, alice):
    """Decided behind both processes' backs: both sweeps find the run at once."""
    a, b = cluster
    session = session_cookie(alice)
    for _ in range(5):
        conversation = make_conversation(alice)
        tab, approval_id = park_a_run(a, conversation, session)
        tab.close()
        ToolApproval.objects.filter(approval_id=approval_id).update(
            status="allowed", reason="user", decided_at=timezone.now()
        )
        until(lambda c=conversation: run_of(c).status == "done", "the resumed run's end")
        assert results(conversation) == ["42\n"]


def test_a_rolling_restart_loses_nothing(redis_server, workspace_root, tmp_path, alice):
    env = cluster_env(redis_server.url, workspace_root)
    session = session_cookie(alice)
    with two_servers(tmp_path, **env) as (a, b):
        conversations = [make_conversation(alice) for _ in range(6)]
        waiting = []
        for n, conversation in enumerate(conversations):
            tab, approval_id = park_a_run((a, b)[n % 2], conversation, session, f"print({n})")
            tab.close()
            waiting.append(approval_id)
        # One process after the other: stop it, start its successor.
        a.stop()
        a2 = LiveServer(log_path=tmp_path / "a2.log", **env).start()
        b.stop()
        b2 = LiveServer(log_path=tmp_path / "b2.log", **env).start()
        try:
            pages = [Browserish(s.url, session) for s in (a2, b2)]
            for n, approval_id in enumerate(waiting):
                assert pages[n % 2].decide(approval_id, "allow").status_code == 200
            for n, conversation in enumerate(conversations):
                until(lambda c=conversation: run_of(c).status == "done", f"run {n}'s end")
                assert results(conversation) == [f"{n}\n"]
            for page in pages:
                page.close()
        finally:
            a2.stop()
            b2.stop()


def test_a_waiting_run_survives_a_redis_restart(cluster, redis_server, conversation, alice):
    a, b = cluster
    session = session_cookie(alice)
    tab, approval_id = park_a_run(a, conversation, session)
    redis_server.stop()
    redis_server.start()
    # Decided in the other process, which resumes the run; the tab on A
    # recovers (it re-joined its group after the restart) and shows the end.
    page = Browserish(b.url, session)
    mark = tab.mark()
    response = page.decide(approval_id, "allow")
    assert response.status_code == 200 and response.json()["resolved"] is True
    tab.until('<pre class="output">42', since=mark)
    tab.until('data-running="false"', since=mark)
    assert run_of(conversation).status == "done"
    tab.close()
    page.close()


def test_16_decision_posts_over_two_processes(cluster, conversation, alice):
    a, b = cluster
    session = session_cookie(alice)
    approval = make_approval(conversation)
    pages = [Browserish(server.url, session) for server in (a, b) for _ in range(8)]
    for page in pages:
        page.csrf()
    barrier = threading.Barrier(len(pages), timeout=BOUND)
    codes: list[int] = []
    lock = threading.Lock()

    def post(page: Browserish, decision: str) -> None:
        barrier.wait()
        code = page.decide(approval.approval_id, decision).status_code
        with lock:
            codes.append(code)

    threads = [
        threading.Thread(target=post, args=(p, "allow" if i % 2 else "deny"))
        for i, p in enumerate(pages)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND)
    assert sorted(codes) == [200] + [409] * 15
    row = ToolApproval.objects.get(pk=approval.pk)
    assert row.status in ("allowed", "denied") and row.decided_by == alice
    for page in pages:
        page.close()


def test_a_decision_made_outside_any_server_goes_back_where_its_run_was(
    redis_server, workspace_root, tmp_path, alice
):
    """A process that serves no loop (a WSGI worker, a command) records the decision;
    a server resumes the run through the shared channel, long before any sweep, and
    it is the server that stepped the run (its python session is there), though
    every server hears the channel. Runs parked in either server, four times: one
    that went to either server by chance would pass only once in sixteen."""
    env = {**cluster_env(redis_server.url, workspace_root), "STUDIO_APPROVAL_POLL_SECONDS": "300"}
    session = session_cookie(alice)
    with two_servers(tmp_path, **env) as (a, b):
        for server in (a, b, b, a):
            conversation = make_conversation(alice)
            tab, approval_id = park_a_run(server, conversation, session)
            stepped_by = run_of(conversation).stepped_by
            decide_outside_and_see(tab, approval_id, alice, redis_server.url)
            run = run_of(conversation)
            assert run.status == "done" and stepped_by
            assert (run.stepped_by, run.resumes) == (stepped_by, 0)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_decision_made_outside_any_server_is_taken_by_another_if_its_server_is_gone(
    redis_server, workspace_root, tmp_path, conversation, alice, how
):
    """The server that stepped the run is gone: another takes the run long before
    any sweep. Exiting (a deploy), it said so and is not waited for; killed, it is
    waited for a moment (PREFERRED_FIRST_SECONDS)."""
    env = {**cluster_env(redis_server.url, workspace_root), "STUDIO_APPROVAL_POLL_SECONDS": "300"}
    session = session_cookie(alice)
    with two_servers(tmp_path, **env) as (a, b):
        tab, approval_id = park_a_run(a, conversation, session)
        tab.close()
        gone = run_of(conversation).stepped_by
        if how == "sigterm":
            a.stop()
        else:
            a.kill()
        assert run_of(conversation).stepped_by == ("" if how == "sigterm" else gone)
        tab = Tab(b.ws_url, conversation.pk, session, origin=b.url)
        tab.until('id="transcript"')
        decide_outside_and_see(tab, approval_id, alice, redis_server.url)
    run = run_of(conversation)
    assert run.status == "done" and run.stepped_by not in ("", gone)


def test_a_message_sent_outside_any_server_is_handed_over_and_started(
    redis_server, workspace_root, tmp_path, conversation, alice
):
    """Issue 36: the WSGI layout's no-script send. A process that serves no loop
    saves the message and hands the run over; a server starts it as new (its
    message shown, no "restarted" notice), long before any sweep."""
    env = {**cluster_env(redis_server.url, workspace_root), "STUDIO_APPROVAL_POLL_SECONDS": "300"}
    session = session_cookie(alice)
    with two_servers(tmp_path, **env) as (a, b):
        tab = Tab(a.ws_url, conversation.pk, session, origin=a.url)
        tab.until('id="transcript"')
        mark = tab.mark()
        child = spawn(
            "launch_proc.py", str(conversation.pk), alice.username, "run python: print(6 * 7)",
            REDIS_URL=redis_server.url,
        )  # fmt: skip
        try:
            assert read_line(child, BOUND).strip() == "ready"
            child.stdin.write("go\n")
            child.stdin.flush()
            assert '"ok": true' in read_line(child, BOUND)
            frames = tab.until('data-status="pending"', since=mark)
            assert "run python: print(6 * 7)" in frames and "restarted" not in frames
            approval_id = APPROVAL_ID.findall(frames)[-1]
        finally:
            child.kill()
            tab.close()
        run = run_of(conversation)
        assert (run.resumes, run.handed_over) == (0, False)
        decide_and_see(b, session, conversation, approval_id, '<pre class="output">42')
    assert run_of(conversation).status == "done"
