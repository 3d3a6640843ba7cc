"""Approvals for any agent, with real processes: daphne on PostgreSQL and a Redis
of our own, the shipped client and the Claude Code hook in processes of their own."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from approvals.models import ToolApproval, ToolRule
from approvals.services.api import token_create
from tests.helpers.clients import Browserish, session_cookie
from tests.helpers.live import LiveServer, free_port
from tests.helpers.procs import ROOT, read_line, until
from tests.helpers.services import cluster_env

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

BOUND = 30


@pytest.fixture
def server(redis_server, workspace_root, tmp_path):
    live = LiveServer(
        log_path=tmp_path / "a.log", **cluster_env(redis_server.url, workspace_root)
    ).start()
    yield live
    live.stop()


@pytest.fixture
def secret(alice):
    return token_create(user=alice, name="laptop")[1]


def agent(server_url: str, secret: str, mode: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "tests/helpers/api_client_proc.py"), server_url, secret,
         mode, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def waiting_row(**filters) -> ToolApproval:
    return until(
        lambda: ToolApproval.objects.filter(status="pending", source="api", **filters).first(),
        "the agent's call to wait in Studio",
        BOUND,
    )


def answer_of(child: subprocess.Popen) -> dict:
    try:
        return json.loads(read_line(child, BOUND))
    finally:
        child.kill()
        child.wait(10)


@pytest.mark.parametrize("mode", ["approve", "async"])
def test_an_agent_process_gets_the_decision_made_in_studio(server, alice, secret, mode):
    child = agent(server.url, secret, mode)
    assert read_line(child, BOUND).strip() == "asking"
    row = waiting_row()
    page = Browserish(server.url, session_cookie(alice))
    try:
        response = page.decide(row.approval_id, "edit", arguments=json.dumps({"env": "staging"}))
        assert response.status_code == 200 and response.json()["resolved"] is True
    finally:
        page.close()
    out = answer_of(child)
    assert out["status"] == "allowed" and out["arguments"] == {"env": "staging"}


def test_the_decorator_runs_only_what_was_approved(server, alice, secret):
    child = agent(server.url, secret, "decorated")
    assert read_line(child, BOUND).strip() == "asking"
    row = waiting_row()
    page = Browserish(server.url, session_cookie(alice))
    try:
        page.decide(row.approval_id, "edit", arguments=json.dumps({"env": "staging"}))
    finally:
        page.close()
    assert answer_of(child) == {"ran": "deployed to staging"}
    row.refresh_from_db()
    # What it did is on the audit row.
    assert row.run_outcome == "ok" and row.output_summary == "'deployed to staging'"


def test_a_deny_reaches_the_decorated_function_as_an_exception(server, alice, secret):
    child = agent(server.url, secret, "decorated")
    read_line(child, BOUND)
    row = waiting_row()
    page = Browserish(server.url, session_cookie(alice))
    try:
        page.decide(row.approval_id, "deny", note="not on a Friday")
    finally:
        page.close()
    out = answer_of(child)
    assert "denied by alice" in out["denied"] and "not on a Friday" in out["denied"]


def test_a_long_poll_outlives_a_server_restart(
    redis_server, workspace_root, tmp_path, alice, secret
):
    """The client is waiting on one process when it stops; the call is decided
    through another; the first comes back on its port and the client, retrying,
    gets the decision (and asked only once: one row)."""
    env = cluster_env(redis_server.url, workspace_root)
    port = free_port()
    a = LiveServer(log_path=tmp_path / "a.log", port=port, **env).start()
    b = LiveServer(log_path=tmp_path / "b.log", **env).start()
    try:
        child = agent(a.url, secret, "approve")
        assert read_line(child, BOUND).strip() == "asking"
        row = waiting_row()
        time.sleep(0.5)  # its long poll is waiting in a
        a.stop()
        page = Browserish(b.url, session_cookie(alice))
        try:
            assert page.decide(row.approval_id, "allow").json()["resolved"] is True
        finally:
            page.close()
        time.sleep(1)
        assert child.poll() is None  # still trying a, which is down
        a = LiveServer(log_path=tmp_path / "a2.log", port=port, **env).start()
        out = answer_of(child)
        assert out["status"] == "allowed" and out["decided_by"] == "alice"
        assert ToolApproval.objects.filter(source="api").count() == 1
    finally:
        a.stop()
        b.stop()


def hook(server_url: str, secret: str, event: dict, **env: str) -> subprocess.Popen:
    child = subprocess.Popen(
        [str(ROOT / ".venv/bin/studio-approval-hook")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={"PATH": "/usr/bin:/bin", "STUDIO_URL": server_url, "STUDIO_TOKEN": secret,
             "STUDIO_HOOK_WAIT": "60", **env},
    )  # fmt: skip
    child.stdin.write(json.dumps(event))
    child.stdin.close()
    return child


def hook_answer(child: subprocess.Popen) -> dict:
    try:
        child.wait(BOUND)
    finally:
        child.kill()
    return json.loads(child.stdout.read())["hookSpecificOutput"]


BASH_CALL = {
    "session_id": "s-1",
    "hook_event_name": "PreToolUse",
    "tool_name": "Bash",
    "tool_input": {"command": "git push --force", "description": "Push the branch"},
    "tool_use_id": "toolu_01",
    "cwd": "/home/dev/project",
}


def test_the_claude_code_hook_asks_studio_and_passes_an_edit_on(server, alice, secret):
    child = hook(server.url, secret, BASH_CALL)
    row = waiting_row(tool_name="terminal")
    assert row.subject == "git push --force" and row.title == "Push the branch"
    page = Browserish(server.url, session_cookie(alice))
    try:
        page.decide(row.approval_id, "edit", arguments=json.dumps({"command": "git push"}))
    finally:
        page.close()
    out = hook_answer(child)
    assert out["hookEventName"] == "PreToolUse" and out["permissionDecision"] == "allow"
    assert out["updatedInput"] == {"command": "git push", "description": "Push the branch"}


def test_the_hook_denies_by_rule_and_falls_back_to_ask_when_studio_is_down(server, alice, secret):
    ToolRule.objects.create(
        tool="terminal", pattern="git push --force*", action="deny", note="never force"
    )
    child = hook(server.url, secret, BASH_CALL)
    out = hook_answer(child)
    assert out["permissionDecision"] == "deny"
    assert out["permissionDecisionReason"] == "Studio: denied (Blocked by a rule)"
    down = f"http://127.0.0.1:{free_port()}"
    child = hook(down, secret, {**BASH_CALL, "tool_use_id": "toolu_02"}, STUDIO_HOOK_WAIT="2")
    out = hook_answer(child)
    assert out["permissionDecision"] == "ask"
    assert "could not be reached" in out["permissionDecisionReason"]


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def test_long_polls_hold_no_thread(server, alice, secret):
    """Forty agents waiting at once: the server's threads stay as they were (each
    poll waits on the event loop), and every one hears its own decision."""
    import threading

    import httpx

    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
        ids = [
            http.post("/api/v1/approvals", json={"tool": "deploy", "arguments": {"n": n}}).json()[
                "id"
            ]
            for n in range(40)
        ]
        # Warm: the pools a first request starts are there before counting.
        http.get(f"/api/v1/approvals/{ids[0]}", params={"wait": "0"})
    before = threads_of(server.pid)
    answers: dict[str, str] = {}

    def wait_for(approval_id: str) -> None:
        with httpx.Client(base_url=server.url, headers=headers, timeout=70) as http:
            answer = http.get(f"/api/v1/approvals/{approval_id}", params={"wait": "60"})
            answers[approval_id] = answer.json()["status"]

    waiters = [threading.Thread(target=wait_for, args=(i,)) for i in ids]
    for waiter in waiters:
        waiter.start()
    time.sleep(2)  # all forty are waiting in the server now
    during = threads_of(server.pid)
    assert not answers
    assert during - before < 5, (before, during)
    page = Browserish(server.url, session_cookie(alice))
    try:
        for n, approval_id in enumerate(ids):
            page.decide(approval_id, "allow" if n % 2 else "deny")
    finally:
        page.close()
    for waiter in waiters:
        waiter.join(BOUND)
    assert [answers[i] for i in ids] == ["denied", "allowed"] * 20
