"""A python that remembers: one sandboxed interpreter per conversation, against
the real sandbox. Its variables last between calls; its limits cover the whole
interpreter; nothing of it outlives Stop, a restart, a timeout or its idle time."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
from django.utils import timezone

from chat.models import Conversation
from chat.services import python_sessions_reset
from chat.tools import builtin_tools
from chat.tools.sessions import ENDED_TEXT, FRESH_TEXT, SEEN_MARK, SESSIONS
from studio.cancel import CancelToken
from tests.factories import make_conversation

pytestmark = [pytest.mark.usefixtures("root_sandbox"), pytest.mark.django_db]

TIMEOUT = 10.0
BOUND = 10.0


@pytest.fixture(autouse=True)
def _no_session_marks_left(settings):
    """Rolled-back tests reuse primary keys, so a later test's conversation-N
    would find this one's session mark and be told of a "new session"."""
    yield
    for mark in Path(settings.STUDIO_WORKSPACE_ROOT).glob(f"conversation-*/{SEEN_MARK}"):
        shutil.rmtree(mark.parent, ignore_errors=True)


@pytest.fixture
def chat(alice, settings):
    settings.STUDIO_PYTHON_SESSIONS = True
    conversation = make_conversation(alice)
    # Rolled-back tests reuse primary keys: start from an empty workspace.
    shutil.rmtree(conversation.workspace, ignore_errors=True)
    return conversation


def python(code: str, chat, *, timeout: float = TIMEOUT, cancel=None):
    return builtin_tools()["python"].execute(
        {"code": code}, cancel=cancel or CancelToken(), timeout=timeout, workspace=chat.workspace
    )


def session_pids(chat) -> list[int]:
    """The host pids of this chat's interpreter (its sandbox's processes)."""
    session = SESSIONS.sessions.get(chat.workspace)
    return [] if session is None else [session.proc.pid]


def alive(pid: int) -> bool:
    return subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode == 0


def until(predicate, bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def test_a_variable_defined_in_one_call_is_read_in_the_next(chat):
    first = python("import math\nrows = [1, 2, 3]\nprint('loaded')", chat)
    assert first.ok and first.text == "loaded\n"  # the first session has nothing to lose
    second = python("rows.append(4)\nprint(sum(rows), math.pi > 3)", chat)
    assert second.ok and second.text == "10 True\n"
    # An error leaves the session as it was; the traceback is the call's own.
    failed = python("rows.append(5)\nraise ValueError('boom')", chat)
    assert not failed.ok and failed.text.startswith("Error: exited with status 1.")
    assert 'File "<stdin>", line 2' in failed.text and "ValueError: boom" in failed.text
    assert python("print(rows)", chat).text == "[1, 2, 3, 4, 5]\n"
    # sys.exit ends the call, not the session.
    assert "status 3" in python("import sys\nsys.exit(3)", chat).text
    assert python("print(len(rows))", chat).text == "5\n"


def test_the_session_is_sandboxed_like_a_call(chat):
    out = python(
        "import os, socket\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "print(len(pids), os.getuid() != 0)\n"
        "s = socket.socket()\n"
        "s.settimeout(2)\n"
        "try:\n    s.connect(('127.0.0.1', 5432)); print('CONNECTED')\n"
        "except OSError:\n    print('REFUSED')\n",
        chat,
    ).text
    count, not_root, reached = out.split()
    assert int(count) < 6 and not_root == "True" and reached == "REFUSED", out
    # The same interpreter again: still alone, still no network.
    assert "REFUSED" in python("s2 = socket.socket(); s2.settimeout(2)\ntry:\n"
                               "    s2.connect(('127.0.0.1', 6379)); print('CONNECTED')\n"
                               "except OSError:\n    print('REFUSED')", chat).text  # fmt: skip


def test_memory_is_capped_for_the_whole_interpreter_not_per_call(chat, settings):
    settings.STUDIO_TOOL_MEMORY_MB = 256
    first = python("a = bytearray(150 * 1024 * 1024)\nprint('held')", chat)
    assert first.text.startswith("held")
    second = python("b = bytearray(150 * 1024 * 1024)\nprint('held again')", chat)
    assert not second.ok and "held again" not in second.text
    assert "memory" in second.text and second.text.endswith(ENDED_TEXT)
    # The next call starts afresh, and says so.
    third = python("print('a' in globals())", chat)
    assert third.text == "False\n" + FRESH_TEXT


def test_a_timeout_ends_the_session_and_the_next_call_is_told(chat):
    python("x = 1", chat)
    pid = session_pids(chat)[0]
    slow = python("import time\ntime.sleep(30)", chat, timeout=1.0)
    assert slow.text.startswith("Error: timed out") and slow.text.endswith(ENDED_TEXT)
    until(lambda: not alive(pid))
    assert python("print('x' in globals())", chat).text == "False\n" + FRESH_TEXT


def test_stop_ends_the_session_and_everything_it_started(chat):
    marker = f"studio-session-child-{chat.pk}"
    python(
        "import subprocess\n"
        "child = subprocess.Popen(\n"
        f"    ['python3', '-c', 'import time; time.sleep(600)', '{marker}'],\n"
        "    start_new_session=True)",
        chat,
    )
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout
    assert found.strip(), "the call's background child runs while the session lives"
    cancel = CancelToken()
    threading.Timer(1.0, cancel.cancel).start()
    stopped = python("import time\ntime.sleep(30)", chat, cancel=cancel)
    assert stopped.text.startswith("Error: stopped by the user.")

    def gone() -> bool:
        return not subprocess.run(["pgrep", "-f", marker], capture_output=True).stdout

    until(gone)
    assert SESSIONS.held() == 0


def test_stop_or_restart_anywhere_ends_an_idle_session(chat):
    python("x = 1", chat)
    pid = session_pids(chat)[0]
    python_sessions_reset(conversation_id=chat.pk)  # this process: at once
    until(lambda: not alive(pid))
    assert python("print('x' in globals())", chat).text == "False\n" + FRESH_TEXT

    # Pressed in another process: only the row changes; this process's
    # heartbeat (end_reset) ends the session it holds.
    pid = session_pids(chat)[0]
    Conversation.objects.filter(pk=chat.pk).update(python_reset_at=timezone.now())
    assert SESSIONS.end_reset() == 1
    until(lambda: not alive(pid))
    assert SESSIONS.held() == 0


def test_an_idle_session_ends_on_its_own(chat, settings):
    settings.STUDIO_PYTHON_IDLE_SECONDS = 1
    python("x = 1", chat)
    pid = session_pids(chat)[0]
    until(lambda: not alive(pid) and SESSIONS.held() == 0)
    assert python("print('x' in globals())", chat).text == "False\n" + FRESH_TEXT


def test_a_plot_shown_in_a_session_appears_like_any_call(chat):
    python("import matplotlib\nimport matplotlib.pyplot as plt", chat)
    shown = python("plt.plot([1, 2, 3])\nplt.show()", chat)
    assert [image["name"] for image in shown.images] == ["figure-1.png"]
    # A figure left open is saved when its call ends, not at the session's end.
    left = python("plt.figure()\nplt.plot([3, 2, 1])", chat)
    assert [image["name"] for image in left.images] == ["figure-2.png"]


def test_switched_off_every_call_starts_fresh(chat, settings):
    settings.STUDIO_PYTHON_SESSIONS = False
    python("x = 1", chat)
    out = python("print('x' in globals())", chat).text
    assert out == "False\n" and SESSIONS.held() == 0
    assert "share one interpreter" not in builtin_tools()["python"].description
    settings.STUDIO_PYTHON_SESSIONS = True
    assert "share one interpreter" in builtin_tools()["python"].description


def test_stop_on_a_waiting_run_ends_its_conversations_session(chat, alice):
    from chat.runs.commands import run_stop
    from tests.factories import make_run

    python("x = 1", chat)
    pid = session_pids(chat)[0]
    make_run(chat)  # a run that waits on a card: no process steps it
    assert run_stop(conversation_id=chat.pk, user=alice)
    until(lambda: not alive(pid))
    assert SESSIONS.held() == 0
    assert Conversation.objects.get(pk=chat.pk).python_reset_at is not None


def test_past_the_cap_the_session_idle_longest_ends(alice, settings):
    settings.STUDIO_PYTHON_SESSIONS = True
    settings.STUDIO_PYTHON_MAX_SESSIONS = 2
    chats = [make_conversation(alice) for _ in range(3)]
    for chat in chats:
        shutil.rmtree(chat.workspace, ignore_errors=True)
        python("x = 1", chat)
    assert SESSIONS.held() == 2
    assert chats[0].workspace not in SESSIONS.sessions  # the oldest went
    assert python("print('x' in globals())", chats[1]).text == "True\n"


# --- issue 52: a kept session says what it is, and its output is its calls' own ---------------


def test_what_a_thread_prints_between_calls_is_no_calls_output(chat):
    """A thread left by one call printed into the next call's result."""
    first = python(
        "import os, threading, time\n"
        "def later():\n"
        "    while not os.path.exists('go'): time.sleep(0.02)\n"
        "    print('LEFT OVER'); import sys; sys.stdout.flush()\n"
        "    open('printed', 'w').close()\n"
        "threading.Thread(target=later).start()\n"
        "print('first')",
        chat,
    )
    assert first.text.strip() == "first"
    (chat.workspace / "go").touch()
    deadline = time.monotonic() + BOUND
    while not (chat.workspace / "printed").exists():
        assert time.monotonic() < deadline, "the thread never printed"
        time.sleep(0.02)
    second = python("print('second')", chat)
    assert second.text.strip() == "second"  # no "LEFT OVER": dropped (and counted in the log)


def test_the_end_of_call_signal_cannot_be_read_by_name(chat):
    """The marker was ``sys.modules['__main__']._studio_marker`` and in argv: a call
    that wrote it ended early, its remaining output shown as the next call's."""
    probe = python(
        "import sys\n"
        "main = vars(sys.modules['__main__'])\n"
        "print(sorted(k for k in main if 'studio' in k and 'marker' in k))\n"
        "print(any(b'studio-' in open('/proc/self/cmdline', 'rb').read() for _ in [0]))\n"
        "print([k for k, v in main.items() if isinstance(v, bytes) and b'\\x1e' in v])\n"
        "print(sys.argv)",
        chat,
    )
    assert probe.text.split("\n")[:4] == ["[]", "False", "[]", "['']"]
    # Forging the old marker ends nothing: the whole output is the call's.
    forged = python("print('\\x1estudio-end-0000 0'); print('still mine')", chat)
    assert "still mine" in forged.text


def test_a_fresh_interpreter_runs_exactly_the_approved_code(chat):
    """One approved call replaced builtins.compile; the next, approved as writing a
    file, ran other code and printed what it liked."""
    python(
        "import builtins\n"
        "real = builtins.compile\n"
        "builtins.compile = lambda *a, **k: real('print(\"all 42 tests passed\")', '<x>', 'exec')",
        chat,
    )
    approved = "open('APPROVED_RAN', 'w').write('yes'); print('wrote it')"
    in_session = python(approved, chat)
    assert in_session.text.strip() == "all 42 tests passed"  # what the session does to it
    assert not (chat.workspace / "APPROVED_RAN").exists()
    fresh = builtin_tools()["python"].execute(
        {"code": approved},
        cancel=CancelToken(),
        timeout=TIMEOUT,
        workspace=chat.workspace,
        fresh=True,
    )
    assert fresh.text.strip() == "wrote it" and fresh.session == ""
    assert (chat.workspace / "APPROVED_RAN").read_text() == "yes"
    # The session lives on, as it was.
    assert python("print('x')", chat).text.strip() == "all 42 tests passed"
    assert in_session.session and in_session.session == SESSIONS.sessions[chat.workspace].id


@pytest.mark.django_db(transaction=True)
def test_the_card_says_what_shaped_the_session_and_the_row_where_it_ran(chat, alice):
    from approvals.models import ToolApproval
    from approvals.notify import card as card_render
    from approvals.services.decisions import approval_decide
    from chat.events import ToolFinished, ToolStarted
    from tests.helpers.driver import AgentDriver
    from tests.helpers.scripted import call

    turns = [
        ("", [call("python", {"code": "x = 41"}, "c1")]),
        ("", [call("python", {"code": "print(x + 1)"}, "c2")]),
        ("Done.", []),
    ]
    driver = AgentDriver.scripted(chat, alice, turns)
    first = driver.wait_for(ToolStarted)
    assert "which starts afresh with it" in card_render(ToolApproval.objects.get(
        approval_id=first.approval_id))  # fmt: skip
    approval_decide(approval_id=first.approval_id, user=alice, decision="allow")
    driver.wait_for(ToolFinished)
    second = driver.wait_for(ToolStarted)
    card = card_render(ToolApproval.objects.get(approval_id=second.approval_id))
    assert "Runs in this chat&#x27;s python session: 1 earlier call since" in card
    assert "Allow in a fresh interpreter" in card
    approval_decide(approval_id=second.approval_id, user=alice, decision="allow", fresh=True)
    result = driver.wait_for(ToolFinished).result
    driver.finish()
    assert "NameError" in result  # a fresh interpreter: x was never defined there
    rows = {r.tool_call_id: r for r in ToolApproval.objects.filter(conversation=chat)}
    assert rows["c1"].interpreter_session and not rows["c1"].fresh_interpreter
    assert (rows["c2"].interpreter_session, rows["c2"].fresh_interpreter) == ("", True)
