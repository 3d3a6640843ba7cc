"""Tools in their real subprocess sandbox, and web_fetch's address guard."""

from __future__ import annotations

import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from approvals.gate import CancelToken
from chat.tools import REGISTRY
from chat.tools.sandbox import OUTPUT_CAP

TIMEOUT = 3.0


@pytest.fixture
def workspace(workspace_root, request):
    path = workspace_root / f"tooltest-{request.node.name[:40]}"
    return path


def python(code: str, workspace, timeout: float = TIMEOUT, cancel=None) -> str:
    return REGISTRY["python"].execute(
        {"code": code}, cancel=cancel or CancelToken(), timeout=timeout, workspace=workspace
    )


def terminal(command: str, workspace, timeout: float = TIMEOUT) -> str:
    return REGISTRY["terminal"].execute(
        {"command": command}, cancel=CancelToken(), timeout=timeout, workspace=workspace
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


def test_children_of_a_timed_out_program_die_too(workspace):
    out = terminal("sleep 61.25 & sleep 61.25 & echo started; wait", workspace, timeout=1.0)
    assert out.startswith("Error: timed out")
    # No sleeper of ours survives the process-group kill.
    found = subprocess.run(["pgrep", "-f", "^sleep 61.25"], capture_output=True, text=True)
    survivors = found.stdout.split()
    assert survivors == []


def test_memory_bomb_is_stopped(workspace):
    out = python("x = bytearray(2 * 1024 ** 3); print('allocated')", workspace)
    assert "allocated" not in out
    assert "MemoryError" in out


def test_fork_bomb_is_stopped(workspace):
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    for _ in range(10000):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('fork refused after', n, type(e).__name__)\n"
    )
    out = python(code, workspace, timeout=5)
    if os.geteuid() == 0:
        # As root the sandbox drops to an unprivileged uid: RLIMIT_NPROC applies.
        assert "fork refused after" in out
        assert int(out.split("after")[1].split()[0]) < 200
    else:
        assert "fork refused after" in out or out.startswith("Error: timed out")


def test_secrets_are_not_in_the_childs_environment(workspace, monkeypatch):
    secrets = {
        "DJANGO_SECRET_KEY": "s3cret-key",
        "LLM_API_KEY": "sk-live-123",
        "DATABASE_URL": "postgres://u:pw@db/x",
        "REDIS_URL": "redis://:pw@r:6379/0",
        "AWS_SECRET_ACCESS_KEY": "aws",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    out = terminal("env; cat /proc/self/environ | tr '\\0' '\\n'", workspace)
    for name, value in secrets.items():
        assert name not in out and value not in out
    assert "HOME=" + str(workspace) in out


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
    return REGISTRY["web_fetch"].execute(
        {"url": url}, cancel=CancelToken(), timeout=5, workspace=None
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
        body = (
            b"<html><head><title>Hi</title><style>p{}</style></head>"
            b"<body><p>Hello <b>there</b></p><script>evil()</script></body></html>"
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def site(settings):
    # 127.0.0.1 stands in for a public site: allowed by name, so a redirect
    # from it to any other internal address must still be refused.
    settings.STUDIO_WEB_FETCH_ALLOW_HOSTS = ["127.0.0.1"]
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
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


@pytest.mark.parametrize(
    "target",
    ["http://10.0.0.1/", "http://169.254.169.254/", "http://[::1]:1/", "http://localhost:1/"],
)
def test_web_fetch_refuses_a_redirect_to_an_internal_address(site, target):
    out = fetch(f"{site}/redirect?to={target}")
    assert out.startswith("Error: refusing to fetch"), out


def test_web_fetch_allow_private_setting(settings, site):
    settings.STUDIO_WEB_FETCH_ALLOW_HOSTS = []
    assert fetch(site + "/page").startswith("Error: refusing")
    settings.STUDIO_WEB_FETCH_ALLOW_PRIVATE = True
    assert fetch(site + "/page").startswith("HTTP 200")


# --- escaping the workspace ------------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="uid separation needs root (CI runs as root)"
)


@pytest.mark.django_db
@needs_root
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


@needs_root
def test_one_conversations_tool_cannot_read_anothers_workspace(workspace_root):
    mine = workspace_root / "conversation-9001"
    theirs = workspace_root / "conversation-9002"
    python("open('secret.txt', 'w').write('for 9002 only')", theirs)
    assert (theirs / "secret.txt").exists()
    for path in (theirs / "secret.txt", "../conversation-9002/secret.txt"):
        out = python(f"print(open({str(path)!r}).read())", mine)
        assert "for 9002 only" not in out
        assert "PermissionError" in out
