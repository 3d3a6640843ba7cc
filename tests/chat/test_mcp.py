"""MCP servers' tools, with a real server built on the SDK's MCPServer, over stdio and HTTP."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import pytest
from django.utils import timezone

from approvals.models import ToolApproval
from approvals.services.decisions import approval_decide
from chat.events import ToolFinished, ToolStarted
from chat.mcp import HUB, mcp_tools
from chat.models import McpServer
from chat.toolbox import toolbox_for
from studio.cancel import CancelToken
from studio.runtime import runtime
from tests.factories import make_run
from tests.helpers.driver import AgentDriver
from tests.helpers.procs import ROOT, read_line, spawn
from tests.helpers.scripted import ScriptedModel, call

pytestmark = pytest.mark.django_db(transaction=True)

SERVER = str(ROOT / "tests" / "helpers" / "mcp_server.py")
BOUND = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fresh_hub():
    """This test's sessions are its own, and are closed after it."""
    rt = runtime()
    old = rt.part_drop(HUB)
    yield
    made = rt.part_drop(HUB)
    if made is not None:
        made.close()
    if old is not None:
        rt.part(HUB, lambda: old)


class HttpServer:
    """The test server over streamable HTTP, in a process of its own."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "http", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + BOUND
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.5).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "the MCP test server did not start"
                time.sleep(0.1)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def http_server():
    server = HttpServer()
    yield server
    server.kill()


@pytest.fixture(params=["stdio", "http"])
def server(request, fresh_hub) -> McpServer:
    if request.param == "stdio":
        return McpServer.objects.create(name="tools", command=f"{sys.executable} {SERVER} stdio")
    http = request.getfixturevalue("http_server")
    return McpServer.objects.create(name="tools", url=http.url, headers="X-Team=studio")


def run_agent(conversation, calls, *, knobs=None):
    model = ScriptedModel([("", calls), ("Done.", [])])
    return AgentDriver.start(
        conversation=conversation,
        model=model,
        user=conversation.owner,
        run=make_run(conversation),
        toolbox=toolbox_for(conversation, connect=True),
        knobs=knobs or {},
    )


def test_tools_are_listed_with_their_hints_and_remembered_on_the_row(server, conversation):
    toolbox = toolbox_for(conversation, connect=True)
    assert {"tools__echo", "tools__remove", "tools__picture"} <= set(toolbox.enabled)
    assert toolbox.tools["tools__echo"].hints == ("read-only", "idempotent")
    assert toolbox.tools["tools__remove"].hints == ("destructive", "open-world")
    assert toolbox.tools["tools__echo"].parameters["required"] == ["text"]
    deadline = time.monotonic() + BOUND
    while not McpServer.objects.get(pk=server.pk).tools:
        assert time.monotonic() < deadline, "the row never learned the tools"
        time.sleep(0.05)
    row = McpServer.objects.get(pk=server.pk)
    assert row.available is True and len(row.tools) == 10


@pytest.mark.parametrize("decision", ["allow", "deny"])
def test_an_mcp_call_waits_for_a_decision_like_any_tool(server, conversation, alice, decision):
    driver = run_agent(conversation, [call("tools__echo", {"text": "gated"})])
    started = driver.wait_for(ToolStarted)
    assert started.awaiting
    row = ToolApproval.objects.get(approval_id=started.approval_id)
    assert (row.tool_name, row.status, row.tool_hints) == (
        "tools__echo",
        "pending",
        ["read-only", "idempotent"],  # shown, and still asked: hints never skip the gate
    )
    approval_decide(approval_id=started.approval_id, user=alice, decision=decision)
    result = driver.wait_for(ToolFinished).result
    driver.finish()
    if decision == "allow":
        assert re.match(r"echo from pid \d+: gated$", result)
    else:
        assert result == "The user declined to run this tool call."


def test_a_deny_on_one_argument_is_not_walked_around_with_another(server, conversation):
    """Issue 52: ``{"a":0,"path":…}`` sorted "a" first, missed the Deny and ran."""
    from approvals.models import ToolRule

    conversation.confirm_tool_calls = False
    conversation.save()
    deny = ToolRule.objects.create(
        tool="tools__remove", pattern='{"path":"/srv*', action="deny", note="Not the data."
    )
    driver = run_agent(conversation, [call("tools__remove", {"a": 0, "path": "/srv/data"})])
    finished = driver.wait_for(ToolFinished)
    driver.finish()
    assert finished.result == "Blocked by a rule: Not the data."
    row = ToolApproval.objects.get(approval_id=finished.approval_id)
    assert (row.status, row.reason, row.rule_id) == ("denied", "rule", deny.pk)


def test_tools_whose_names_clash_are_both_refused_and_the_admin_says_why(admin_user):
    from django.test import Client

    from chat.mcp import server_tools

    tools = [
        {"name": name, "description": "", "input_schema": {"type": "object"}}
        for name in ("a.b", "a_b", "echo", "x" * 70, "x" * 69 + "y")
    ]
    server = McpServer.objects.create(
        name="clash", command="true", tools=tools, last_connected_at=timezone.now()
    )
    offered = {tool.name for tool in server_tools(server, connect=False)}
    assert offered == {"clash__echo"}
    client = Client()
    client.force_login(admin_user)
    page = client.get(f"/admin/chat/mcpserver/{server.pk}/change/").content.decode()
    assert "a.b and a_b would both be clash__a_b" in page
    assert "would both be clash__xxxx" in page


def test_disabled_mcp_tools_are_not_offered_or_run(server, conversation):
    conversation.disabled_tools = ["tools__echo"]
    conversation.save()
    driver = run_agent(conversation, [call("tools__echo", {"text": "x"})])
    driver.finish()
    assert not driver.of(ToolStarted)
    assert "is not enabled" in driver.of(ToolFinished)[0].result


def execute(
    server_row: McpServer, tool: str, arguments: dict, *, timeout=10.0, cancel=None, progress=None
):
    tools = mcp_tools(connect=True)
    return tools[f"{server_row.name}__{tool}"].execute(
        arguments,
        cancel=cancel or CancelToken(),
        timeout=timeout,
        workspace=_workspace(),
        progress=progress,
    )


def _workspace():
    from django.conf import settings

    return settings.STUDIO_WORKSPACE_ROOT / "conversation-4242"


def test_an_error_result_is_a_tool_error(server):
    result = execute(server, "fail", {"reason": "no disk"})
    assert not result.ok and result.text == "Error: Error executing tool fail: it failed: no disk"


def test_a_slow_tool_hits_the_timeout(server):
    started = time.monotonic()
    result = execute(server, "slow", {"seconds": 5}, timeout=0.5)
    assert result.text == "Error: the MCP tool did not answer within 0.5 s."
    assert time.monotonic() - started < 3


def test_a_servers_progress_shows_while_the_call_runs(server):
    """Issue 55: what an MCP server reports of its progress reaches the card
    (on the call's own thread), as the sandbox's output does."""
    import threading

    heard: list[tuple[str, str]] = []
    result = execute(
        server,
        "count",
        {"to": 5},
        progress=lambda text: heard.append((threading.current_thread().name, text)),
    )
    assert result.ok and "counted to 5" in result.text
    assert len(heard) >= 2, heard
    assert {name for name, _ in heard} == {threading.current_thread().name}
    assert heard[0][1].startswith("1 of 5: counted 1")
    assert "5 of 5: counted 5" not in heard[0][1]
    texts = [text for _, text in heard]
    assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:], strict=False))


def test_stop_cancels_a_call(server):
    import threading

    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    result = execute(server, "slow", {"seconds": 5}, cancel=cancel)
    assert result.text == "Error: stopped by the user."


def test_images_and_structured_content(server):
    picture = execute(server, "picture", {})
    (image,) = picture.images
    assert image["mime"] == "image/png" and image["shown"] and image["size"] == 70
    assert (_workspace() / image["name"]).read_bytes().startswith(b"\x89PNG")
    assert "Images returned: mcp-images/" in picture.text
    stats = execute(server, "stats", {"values": [1, 2, 3.5]})
    assert stats.ok and stats.text == '{\n  "count": 3.0,\n  "total": 6.5\n}'


def test_a_crash_mid_session_is_an_error_then_the_session_recovers(server, request):
    first = execute(server, "echo", {"text": "before"}).text
    crashed = execute(server, "crash", {})
    assert not crashed.ok and "failed during the call" in crashed.text
    # Shown as unavailable (not offered to the model) until the hub has
    # reconnected by itself, after its backoff.
    deadline = time.monotonic() + BOUND
    while McpServer.objects.get(pk=server.pk).available is not False:
        assert time.monotonic() < deadline, "the crash was never recorded"
        time.sleep(0.05)
    assert "tools__echo" not in mcp_tools()
    if server.url:
        # It died with the crash. Bring it back only after the hub's first
        # try to reconnect has failed: the hub must keep trying.
        crashed_at = McpServer.objects.get(pk=server.pk).last_error_at
        while McpServer.objects.get(pk=server.pk).last_error_at == crashed_at:
            assert time.monotonic() < deadline, "the hub never tried to reconnect"
            time.sleep(0.05)
        request.getfixturevalue("http_server").start()
    while McpServer.objects.get(pk=server.pk).available is not True:
        assert time.monotonic() < deadline, "the session never came back"
        time.sleep(0.1)
    after = execute(server, "echo", {"text": "after"})
    assert after.ok, after.text
    pid = re.compile(r"pid (\d+)")
    if server.command:  # stdio: a new server process
        assert pid.search(first).group(1) != pid.search(after.text).group(1)


def test_a_server_that_is_down_blocks_nothing(fresh_hub, conversation, alice, client):
    McpServer.objects.create(name="broken", command="/bin/false")
    started = time.monotonic()
    toolbox = toolbox_for(conversation, connect=True)
    assert not [n for n in toolbox.tools if n.startswith("broken__")]
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + BOUND
    while McpServer.objects.get(name="broken").available is not False:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # A page load reads the row only: fast, and says "unavailable".
    client.force_login(alice)
    started = time.monotonic()
    page = client.get(conversation.get_absolute_url())
    assert page.status_code == 200 and time.monotonic() - started < 2
    assert 'data-mcp-server="broken" data-available="false"' in page.content.decode()


def test_a_call_to_a_server_gone_down_is_a_clear_tool_error(fresh_hub, http_server, conversation):
    row = McpServer.objects.create(name="web", url=http_server.url)
    assert execute(row, "echo", {"text": "up"}).ok
    http_server.kill()
    result = execute(row, "echo", {"text": "down?"})
    assert not result.ok and "MCP server 'web'" in result.text


@pytest.mark.anydb
def test_two_processes_each_have_their_own_session(fresh_hub, conversation):
    McpServer.objects.create(name="tools", command=f"{sys.executable} {SERVER} stdio")
    mine = execute(McpServer.objects.get(name="tools"), "echo", {"text": "parent"}).text
    child = spawn("mcp_call_proc.py", "tools")
    theirs = read_line(child, BOUND)
    child.wait(BOUND)
    pid = re.compile(r"echo from pid (\d+)")
    assert pid.search(mine) and pid.search(theirs)
    assert pid.search(mine).group(1) != pid.search(theirs).group(1)


# --- the admin ---------------------------------------------------------------------------


def test_the_admin_never_shows_secrets_back_and_refreshes_tools(admin_user, fresh_hub):
    from django.test import Client

    client = Client()
    client.force_login(admin_user)
    add = client.post(
        "/admin/chat/mcpserver/add/",
        {
            "name": "tools",
            "command": f"{sys.executable} {SERVER} stdio",
            "url": "",
            "environment": "API_TOKEN=s3cret-value\nREGION=eu",
            "headers": "",
            "enabled": "on",
        },
    )
    assert add.status_code == 302, add.content.decode()[:2000]
    row = McpServer.objects.get(name="tools")
    assert row.environment == "API_TOKEN=s3cret-value\nREGION=eu"
    page = client.get(f"/admin/chat/mcpserver/{row.pk}/change/").content.decode()
    assert "s3cret-value" not in page and "API_TOKEN, REGION" in page
    # Saving without touching the field keeps the secret.
    client.post(
        f"/admin/chat/mcpserver/{row.pk}/change/",
        {"name": "tools", "command": row.command, "url": "", "environment": "", "headers": ""},
    )
    assert McpServer.objects.get(pk=row.pk).environment == row.environment
    both = client.post(
        "/admin/chat/mcpserver/add/",
        {"name": "both", "command": "x", "url": "https://example.com/mcp", "enabled": "on"},
    )
    assert "Give exactly one of Command" in both.content.decode()
    refreshed = client.post(
        "/admin/chat/mcpserver/",
        {"action": "refresh_tools", "_selected_action": [row.pk]},
        follow=True,
    )
    page = refreshed.content.decode()
    assert "MCP server tools: 10 tool(s) found." in page, re.findall(
        r"<li class=\"(?:success|info|error|warning)\">(.*?)</li>", page
    )
    assert len(McpServer.objects.get(pk=row.pk).tools) == 10


@pytest.mark.django_db
def test_the_admin_explains_how_a_servers_tools_are_named(admin_user):
    from django.test import Client

    client = Client()
    client.force_login(admin_user)
    page = client.get("/admin/chat/mcpserver/add/").content.decode()
    assert "Its tools are offered as NAME__TOOL: this name, two underscores, the tool." in page


# --- issue 53: stdio servers run sandboxed ---------------------------------------------------


def test_a_stdio_server_cannot_read_studios_files(fresh_hub, root_sandbox, settings, conversation):
    """Started by a server running as root, a stdio MCP server could read the
    database and the secret key. Now none of Studio's files exist for it."""
    from django.db import connection

    from chat.mcp import hub, spec_for

    server = McpServer.objects.create(name="peeker", command=f"{sys.executable} {SERVER} stdio")
    spec = spec_for(server)
    conversation.workspace.mkdir(parents=True, exist_ok=True)
    (conversation.workspace / "secret.txt").write_text("a member's file")
    secrets = {
        "the database": connection.settings_dict["NAME"],
        "the secret key": str(settings.BASE_DIR / ".secret_key"),
        "a workspace": str(conversation.workspace / "secret.txt"),
    }
    if connection.vendor != "sqlite":
        del secrets["the database"]  # (PostgreSQL: over the network it may not reach)
    for what, path in secrets.items():
        answer = hub().call(spec, "peek", {"path": path}, timeout=20, cancel=CancelToken())
        assert "cannot read" in _text(answer), what
    # The control: the server does read what is its own.
    answer = hub().call(spec, "peek", {"path": str(SERVER)}, timeout=20, cancel=CancelToken())
    assert "read: b'" in _text(answer)


@pytest.mark.parametrize("network", [False, True])
def test_a_stdio_server_reaches_the_network_only_where_its_entry_allows(
    fresh_hub, root_sandbox, network
):
    from chat.mcp import hub, spec_for

    listener = socket.create_server(("127.0.0.1", 0))
    try:
        server = McpServer.objects.create(
            name=f"net-{int(network)}", command=f"{sys.executable} {SERVER} stdio", network=network
        )
        port = listener.getsockname()[1]
        answer = hub().call(
            spec_for(server), "connect", {"port": port}, timeout=20, cancel=CancelToken()
        )
    finally:
        listener.close()
    assert ("connected" == _text(answer)) is network


def test_a_command_naming_studios_own_folder_is_refused(fresh_hub, root_sandbox, settings):
    from chat.mcp import hub, spec_for
    from chat.tools.mcp import McpUnavailable

    server = McpServer.objects.create(
        name="nosy", command=f"{sys.executable} {SERVER} stdio {settings.BASE_DIR}"
    )
    with pytest.raises(McpUnavailable, match="holds Studio's own files"):
        hub().call(spec_for(server), "echo", {"text": "x"}, timeout=20, cancel=CancelToken())


def _text(result) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


@pytest.mark.parametrize(
    ("text", "structured", "shown"),
    [
        ("5", {"result": 5}, "5"),
        ("[1, 2]", {"result": [1, 2]}, "[1, 2]"),
        ("ok", {"result": "ok"}, "ok"),
        ('{"a": 1}', {"a": 1}, '{\n  "a": 1\n}'),
    ],
)
def test_a_result_and_its_structured_copy_are_shown_once(tmp_path, text, structured, shown):
    """Issue 55: an MCP result showed twice (text 5 and {"result": 5})."""
    from mcp.types import CallToolResult, TextContent

    from chat.tools.mcp import result_of

    result = CallToolResult(
        content=[TextContent(type="text", text=text)], structuredContent=structured
    )
    assert result_of(result, workspace=tmp_path, tool="t").text == shown


def test_a_step_reads_the_servers_again_only_when_they_changed(django_assert_num_queries):
    """The claim's read carries the servers' version; this process keeps the rows
    it read at a version, and any change of a server's row moves it."""
    from chat.mcp import _save_report, enabled_servers, servers_version
    from chat.models import Conversation
    from chat.tools.mcp import Report
    from tests.factories import make_conversation, make_user

    chat = make_conversation(make_user("mcp-version"))

    def version() -> tuple:
        rows = Conversation.objects.annotate(**servers_version()).filter(pk=chat.pk)
        return tuple(rows.values_list("mcp_servers", "mcp_servers_at").get())

    McpServer.objects.create(name="one", url="http://127.0.0.1:9/mcp")
    seen = version()
    assert [s.name for s in enabled_servers(seen)] == ["one"]
    with django_assert_num_queries(0):
        assert [s.name for s in enabled_servers(seen)] == ["one"]
    assert version() == seen

    changes = [
        lambda: McpServer.objects.create(name="two", url="http://127.0.0.1:9/mcp"),
        lambda: _save_report(Report(server="two", connected=False, error="refused")),
        lambda: _save_report(Report(server="one", connected=True)),
        lambda: McpServer.objects.filter(name="two").delete(),
        lambda: McpServer.objects.get(name="one").delete(),
    ]
    expected = [["one", "two"], ["one", "two"], ["one", "two"], ["one"], []]
    for change, names in zip(changes, expected, strict=True):
        time.sleep(0.002)  # (a later updated_at)
        change()
        now = version()
        assert now != seen
        with django_assert_num_queries(1):
            rows = enabled_servers(now)
        assert [s.name for s in rows] == names
        seen = now
        if names == ["one"]:  # the report's row as read again
            assert rows[0].last_connected_at is not None
    three = McpServer.objects.create(name="three", url="http://127.0.0.1:9/mcp", enabled=False)
    assert version() == seen  # no enabled server changed
    three.enabled = True
    three.save()  # (as the admin's form saves it)
    assert version() != seen and [s.name for s in enabled_servers(version())] == ["three"]
