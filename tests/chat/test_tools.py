"""Tools in their real subprocess sandbox, and web_fetch's address guard."""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chat.tools import builtin_tools
from chat.tools.sandbox import OUTPUT_CAP
from studio.cancel import CancelToken

TIMEOUT = 3.0


@pytest.fixture
def workspace(workspace_root, request):
    path = workspace_root / f"tooltest-{request.node.name[:40]}"
    return path


def python(code: str, workspace, timeout: float = TIMEOUT, cancel=None) -> str:
    return (
        builtin_tools()["python"]
        .execute(
            {"code": code}, cancel=cancel or CancelToken(), timeout=timeout, workspace=workspace
        )
        .text
    )


def terminal(command: str, workspace, timeout: float = TIMEOUT) -> str:
    return (
        builtin_tools()["terminal"]
        .execute({"command": command}, cancel=CancelToken(), timeout=timeout, workspace=workspace)
        .text
    )


def test_python_runs_code_in_the_workspace(workspace):
    out = python("import os; open('f.txt','w').write('x'); print(os.getcwd())", workspace)
    assert out.strip() == str(workspace)
    assert (workspace / "f.txt").read_text() == "x"


def test_python_reports_errors_as_error_text(workspace):
    out = python("raise ValueError('boom')", workspace)
    assert out.startswith("Error: exited with status 1.")
    assert "ValueError: boom" in out


def test_infinite_loop_is_killed_at_the_timeout(workspace):
    out = python("while True: pass", workspace, timeout=1.0)
    assert out.startswith("Error: timed out after 1 s and was killed.")


def test_output_is_capped(workspace):
    out = python("print('y' * 500_000)", workspace)
    assert len(out) < OUTPUT_CAP + 200
    assert "[output truncated:" in out


def test_cancel_kills_the_program(workspace):
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    out = python("import time; time.sleep(30)", workspace, timeout=20, cancel=cancel)
    assert out.startswith("Error: stopped by the user.")


def test_terminal_runs_a_command(workspace):
    assert terminal("echo hello && echo err >&2", workspace).split() == ["hello", "err"]


def test_file_size_limit(workspace):
    out = python("open('big','wb').write(b'0' * (64 * 1024 * 1024))", workspace)
    assert out.startswith("Error:")


# --- web_fetch -------------------------------------------------------------------


def fetch(url: str) -> str:
    return (
        builtin_tools()["web_fetch"]
        .execute({"url": url}, cancel=CancelToken(), timeout=5, workspace=None)
        .text
    )


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1/", "loopback"),
        ("http://10.0.0.1/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[::1]/", "loopback"),
        ("http://localhost/", "loopback"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::127.0.0.1]/", "loopback"),
        ("http://[2002:7f00:1::1]/", "loopback"),  # 6to4 wrapping 127.0.0.1
        ("http://[64:ff9b::a9fe:a9fe]/", "link-local"),  # NAT64 wrapping 169.254.169.254
        ("http://100.64.0.1/", "non-public"),  # carrier-grade NAT
        ("http://[fe80::1]/", "link-local"),
    ],
)
def test_web_fetch_refuses_internal_addresses(url, why):
    out = fetch(url)
    assert out.startswith("Error: refusing to fetch"), out
    assert why in out


def test_web_fetch_refuses_other_schemes():
    assert fetch("file:///etc/passwd").startswith("Error:")
    assert fetch("ftp://example.com/").startswith("Error:")


class _Site(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.path.split("to=", 1)[1])
            self.end_headers()
            return
        if self.path.startswith("/drip"):
            # One byte every 0.5 s, forever: each read succeeds, the page never ends.
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.5)
            except OSError:
                pass
            return
        body = (
            b"<html><head><title>Hi</title><style>p{}</style></head>"
            b"<body><p>Hello <b>there</b>\x00</p><script>evil()</script></body></html>"
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def site(settings):
    # 127.0.0.1 stands in for an intranet site: allowed by name on its own
    # port, so any other port on it, and a redirect to any other internal
    # address, must still be refused.
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    httpd.daemon_threads = True
    settings.STUDIO_WEB_FETCH_ALLOW_HOSTS = [f"127.0.0.1:{httpd.server_address[1]}"]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_web_fetch_returns_readable_text(site):
    out = fetch(site + "/page")
    assert out.startswith("HTTP 200")
    assert "# Hi" in out and "Hello there" in out
    assert "evil" not in out and "p{}" not in out
    assert "\x00" not in out  # PostgreSQL could not store it


@pytest.mark.parametrize(
    "target",
    ["http://10.0.0.1/", "http://169.254.169.254/", "http://[::1]:1/", "http://localhost:1/"],
)
def test_web_fetch_refuses_a_redirect_to_an_internal_address(site, target):
    out = fetch(f"{site}/redirect?to={target}")
    assert out.startswith("Error: refusing to fetch"), out


def test_an_allowed_host_is_allowed_on_its_own_port_only(settings, site):
    # The same host on another port (Redis, PostgreSQL, Studio itself).
    for port in (6379, 5432, 1):
        assert fetch(f"http://127.0.0.1:{port}/").startswith("Error: refusing to fetch")
    settings.STUDIO_WEB_FETCH_ALLOW_HOSTS = ["127.0.0.1"]  # a bare host: port 80 only
    assert fetch(site + "/page").startswith("Error: refusing to fetch")


def test_a_dripping_server_cannot_hold_the_call_past_its_deadline(site):
    started = time.monotonic()
    out = (
        builtin_tools()["web_fetch"]
        .execute({"url": site + "/drip"}, cancel=CancelToken(), timeout=1.5, workspace=None)
        .text
    )
    assert out == f"Error: {site}/drip did not finish within 1.5 s."
    assert time.monotonic() - started < 4


def test_stop_ends_a_download_at_once(site):
    cancel = CancelToken()
    threading.Timer(0.5, cancel.cancel).start()
    started = time.monotonic()
    out = (
        builtin_tools()["web_fetch"]
        .execute({"url": site + "/drip"}, cancel=cancel, timeout=20, workspace=None)
        .text
    )
    assert out == "Error: stopped by the user."
    assert time.monotonic() - started < 3


def test_web_fetch_allow_private_setting(settings, site):
    settings.STUDIO_WEB_FETCH_ALLOW_HOSTS = []
    assert fetch(site + "/page").startswith("Error: refusing")
    settings.STUDIO_WEB_FETCH_ALLOW_PRIVATE = True
    assert fetch(site + "/page").startswith("HTTP 200")


# --- escaping the workspace ------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("root_sandbox")
def test_tools_cannot_read_the_servers_private_files(workspace):
    from django.conf import settings as django_settings
    from django.db import connection

    connection.ensure_connection()  # the permission guard runs on connect
    database = str(connection.settings_dict["NAME"])
    targets = [
        str(django_settings.BASE_DIR / ".secret_key"),
        database,
        "/proc/1/environ",
        f"/proc/{os.getpid()}/environ",
    ]
    # In WAL mode the latest writes sit in these files, not in the database.
    targets += [p for p in (f"{database}-wal", f"{database}-shm") if os.path.exists(p)]
    assert len(targets) == 6, "the test database should be in WAL mode"
    code = (
        "import sys\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        open(path, 'rb').read(16); print('READ', path)\n"
        "    except OSError as e:\n"
        "        print('DENIED', path, type(e).__name__)\n"
    )
    out = python(code, workspace)
    assert "READ" not in out, out
    assert out.count("DENIED") == len(targets)


@pytest.mark.usefixtures("root_sandbox")
@pytest.mark.django_db
def test_one_conversations_tool_cannot_read_anothers_workspace(workspace_root):
    mine = workspace_root / "conversation-9001"
    theirs = workspace_root / "conversation-9002"
    python("open('secret.txt', 'w').write('for 9002 only')", theirs)
    assert (theirs / "secret.txt").exists()
    for path in (theirs / "secret.txt", "../conversation-9002/secret.txt"):
        out = python(f"print(open({str(path)!r}).read())", mine)
        assert "for 9002 only" not in out
        # The sandbox holds only the way to its own workspace.
        assert "FileNotFoundError" in out
