"""The tool sandbox, attacked the way an approved call would attack it.

These need root and bubblewrap (CI has both: ``make test`` installs it).
Each test runs real programs through the real ``python`` / ``terminal``
tools or ``run_sandboxed`` and looks at the host from outside.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from chat.tools import builtin_tools, sandbox
from chat.tools.sandbox import MB, Limits, run_sandboxed
from studio.cancel import CancelToken

pytestmark = pytest.mark.usefixtures("root_sandbox")

TIMEOUT = 10.0


@pytest.fixture
def workspace(workspace_root, request):
    # A conversation-N folder, as the agent uses: its own uid.
    return workspace_root / f"conversation-{70_000 + abs(hash(request.node.name)) % 10_000}"


@pytest.fixture(params=["session", "per call"])
def python_mode(request, settings):
    """The python tool both ways: a conversation's long-lived session, a fresh one per call."""
    settings.STUDIO_PYTHON_SESSIONS = request.param == "session"
    return request.param


def python(code: str, workspace, *, timeout: float = TIMEOUT, cancel=None) -> str:
    return (
        builtin_tools()["python"]
        .execute(
            {"code": code}, cancel=cancel or CancelToken(), timeout=timeout, workspace=workspace
        )
        .text
    )


def terminal(command: str, workspace, *, timeout: float = TIMEOUT, cancel=None) -> str:
    return (
        builtin_tools()["terminal"]
        .execute(
            {"command": command},
            cancel=cancel or CancelToken(),
            timeout=timeout,
            workspace=workspace,
        )
        .text
    )


def host_processes(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def host_address() -> str:
    """One of this machine's non-loopback addresses."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # no packet is sent: it only picks a route
        return s.getsockname()[0]


class Listener:
    """A TCP server on the host, standing in for Studio or any local service."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
            self.accepted.set()
            conn.close()
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


CONNECT = (
    "import socket\n"
    "for host, port in {targets!r}:\n"
    "    try:\n"
    "        socket.create_connection((host, port), 2).close(); print('CONNECTED', host, port)\n"
    "    except OSError as e:\n"
    "        print('REFUSED', host, port, e.errno)\n"
)


def test_no_network_to_loopback_services_or_the_hosts_other_addresses(workspace, python_mode):
    # Redis and PostgreSQL run on this machine; a listener stands in for Studio.
    app = Listener("127.0.0.1")
    other = Listener("0.0.0.0")  # noqa: S104 - on every address, the way a careless service binds
    try:
        targets = [
            ("127.0.0.1", 6379),
            ("127.0.0.1", 5432),
            ("127.0.0.1", app.port),
            ("localhost", app.port),
            (host_address(), other.port),
            ("1.1.1.1", 443),
        ]
        out = python(CONNECT.format(targets=targets), workspace)
    finally:
        app.close()
        other.close()
    assert "CONNECTED" not in out, out
    assert out.count("REFUSED") == len(targets), out
    assert not app.accepted.is_set() and not other.accepted.is_set()


def test_the_call_sees_only_its_own_processes(workspace):
    out = terminal("sleep 0.2 & ls /proc | grep -E '^[0-9]+$' | wc -l; ps -e -o comm=", workspace)
    lines = out.split()
    count = int(lines[0])
    # bwrap's init, bash, sleep, ls, grep, wc: a handful, never the host's.
    assert count < 10, out
    for host_only in ("daphne", "postgres", "redis-server", "pytest"):
        assert host_only not in out


@pytest.mark.parametrize("how", ["end", "timeout", "stop"])
def test_nothing_the_call_starts_survives_it(workspace, how):
    marker = f"studio-escape-{uuid.uuid4().hex[:8]}"
    # Three ways out of a process group: setsid, nohup + disown, a double fork.
    # (A sleeper that takes the marker as an argument: GNU sleep would refuse it.)
    sleeper = "python3 -c 'import time; time.sleep(600)'"
    command = (
        f"setsid {sleeper} {marker}-a >/dev/null 2>&1 < /dev/null & "
        f"nohup {sleeper} {marker}-b >/dev/null 2>&1 & disown; "
        f"( ( {sleeper} {marker}-c >/dev/null 2>&1 & ) & ); "
        f"sleep 0.5; pgrep -c -f '{marker}-[abc]$'; echo started"
    )
    cancel = CancelToken()
    if how == "timeout":
        command += "; sleep 600"
    elif how == "stop":
        command += "; sleep 600"
        threading.Timer(1.5, cancel.cancel).start()
    out = terminal(command, workspace, timeout=2.0 if how == "timeout" else TIMEOUT, cancel=cancel)
    assert "3\nstarted" in out, out  # all three escapes ran inside the call
    if how == "timeout":
        assert out.startswith("Error: timed out")
    if how == "stop":
        assert out.startswith("Error: stopped by the user.")
    deadline = time.monotonic() + 5
    while host_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes(marker) == []


MEMORY_HOGS = (
    "import os, sys, time\n"
    "children = []\n"
    "for i in range(4):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        block = bytearray(100 * 1024 * 1024)\n"
    "        for j in range(0, len(block), 4096): block[j] = 1\n"
    "        print('held', i, flush=True)\n"
    "        time.sleep(3)\n"
    "        print('survived', i, flush=True)\n"
    "        os._exit(0)\n"
    "    children.append(pid)\n"
    "for pid in children: os.waitpid(pid, 0)\n"
)


def test_memory_is_capped_per_call_not_per_process(workspace):
    """Four processes of 100 MB each do not fit in a 256 MB call."""
    assert sandbox.cgroup_root() is not None, "this machine offers memory cgroups (CI does)"
    result = run_sandboxed(
        ["/usr/bin/python3", "-I", "-c", MEMORY_HOGS],
        workspace=workspace,
        timeout=TIMEOUT,
        limits=Limits(memory_bytes=256 * MB),
    )
    # (The kernel may kill a child that already said "held": count survivors.)
    assert result.output.count("survived") < 4, result.output
    assert result.out_of_memory
    assert "used more than its memory limit" in result.as_text(timeout=TIMEOUT)


def test_one_process_past_the_limit_is_killed(workspace, python_mode):
    out = python("x = bytearray(2 * 1024 ** 3); print('allocated')", workspace)
    assert "allocated" not in out
    assert "memory limit" in out or "MemoryError" in out


@pytest.mark.parametrize("path", ["/tmp", "/var/tmp", "/dev/shm"])
def test_tmp_dirs_are_private_to_the_call_and_capped(workspace, path):
    name = f"studio-private-{uuid.uuid4().hex[:8]}"
    out = terminal(f"echo secret > {path}/{name} && ls {path}", workspace)
    assert out.split() == [name], out
    # Not on the host, and not in the next call.
    assert not (Path(path) / name).exists()
    assert terminal(f"ls -A {path}", workspace) == "(no output)"
    # Size-capped: 64 MB by default, so ten files of 10 MB do not fit.
    out = terminal(
        f"for i in $(seq 1 10); do head -c 10000000 /dev/zero > {path}/big$i || break; done",
        workspace,
    )
    assert "No space left on device" in out, out


def test_secrets_are_not_in_the_calls_environment(workspace, monkeypatch):
    secrets = {
        "DJANGO_SECRET_KEY": "s3cret-key",
        "LLM_API_KEY": "sk-live-123",
        "DATABASE_URL": "postgres://u:pw@db/x",
        "REDIS_URL": "redis://:pw@r:6379/0",
        "AWS_SECRET_ACCESS_KEY": "aws",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    out = terminal("env; cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'", workspace)
    for name, value in secrets.items():
        assert name not in out and value not in out
    assert "HOME=" + str(workspace) in out


def test_the_host_disk_is_out_of_sight_and_the_system_read_only(workspace):
    out = terminal(
        "ls /root /home /work /var/lib 2>&1; touch /usr/x /etc/x 2>&1; id -u; "
        "cat /proc/self/status | grep CapEff",
        workspace,
    )
    assert "No such file or directory" in out
    assert out.count("Read-only file system") == 2, out
    assert "CapEff:\t0000000000000000" in out
    assert "\n0\n" not in f"\n{out}\n"  # not root


def test_workspace_quota_caps_files_and_kills_a_call_that_passes_it(workspace):
    limits = Limits(workspace_bytes=8 * MB, file_bytes=16 * MB)

    def run(command: str):
        return run_sandboxed(
            ["/bin/bash", "-c", command], workspace=workspace, timeout=TIMEOUT, limits=limits
        )

    # One file larger than the quota: cut by the kernel (RLIMIT_FSIZE).
    one = run("head -c 20000000 /dev/zero > one.bin; echo rc=$?")
    assert "File size limit exceeded" in one.output and "rc=153" in one.output, one.output
    assert sandbox.workspace_usage(workspace) <= 8 * MB
    # At the quota, nothing grows, but a call can still clean up.
    grow = run("python3 -c \"f = open('one.bin', 'ab'); f.write(b'more'); f.close()\"")
    assert "File too large" in grow.output, grow.output
    assert run("rm one.bin; echo cleaned").output == "cleaned\n"
    # Many files each under the per-file cap: the quota check kills the call.
    many = run("for i in $(seq 1 60); do head -c 1000000 /dev/zero > f$i; sleep 0.05; done; echo x")
    assert many.over_quota and not many.output.endswith("x\n"), many
    assert "passed its quota of 8 MB" in many.as_text(timeout=TIMEOUT)
    assert run("rm -f f*; echo cleaned").output.strip() == "cleaned"
    assert sandbox.workspace_usage(workspace) < MB


@pytest.mark.parametrize(
    "writer",
    [
        # Four writers at once, each file under the per-file cap.
        "for j in 1 2 3 4; do (for i in $(seq 400); do head -c 8000000 /dev/zero > w$j.$i;"
        " done) & done; wait",
        # Space taken without writing: refused, so glibc writes it out at the disk's pace.
        'python3 -c "import os\nfor i in range(4000):\n'
        " fd = os.open(f'a{i}', os.O_CREAT | os.O_WRONLY); os.posix_fallocate(fd, 0, 8 << 20)\"",
    ],
    ids=["parallel-writes", "fallocate"],
)
def test_a_call_passing_its_quota_is_stopped_within_64_mb(workspace, writer):
    quota = 128 * MB
    result = run_sandboxed(
        ["/bin/bash", "-c", writer],
        workspace=workspace,
        timeout=60,
        limits=Limits(workspace_bytes=quota, file_bytes=16 * MB),
    )
    used = sandbox.workspace_usage(workspace)
    assert result.over_quota, result
    assert quota < used <= quota + sandbox.QUOTA_SLACK, used / MB
    run_sandboxed(["/bin/bash", "-c", "rm -f w* a*"], workspace=workspace, timeout=TIMEOUT)


def test_fallocate_and_io_uring_are_refused(workspace, python_mode):
    code = (
        "import ctypes, os\n"
        "fd = os.open('f', os.O_CREAT | os.O_WRONLY)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('fallocate', libc.fallocate(fd, 0, 0, 1 << 20), ctypes.get_errno())\n"
        "print('io_uring_setup', libc.syscall(425, 8, 0), ctypes.get_errno())\n"
        "os.posix_fallocate(fd, 0, 1 << 20)\n"  # glibc's fallback writes instead
        "print('size', os.fstat(fd).st_size)\n"
    )
    out = python(code, workspace)
    assert "fallocate -1 95" in out and "io_uring_setup -1 38" in out, out
    assert f"size {1 << 20}" in out, out


def test_forks_are_capped_per_call(workspace, python_mode):
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
    assert "fork refused after" in out
    assert int(out.split("after")[1].split()[0]) < 100


def test_without_bubblewrap_tools_refuse_with_what_to_install(workspace, monkeypatch):
    monkeypatch.setattr(sandbox.host, "bwrap_path", lambda: None)
    out = python("print('ran')", workspace)
    assert out == sandbox.INSTALL_HINT
    assert "apt-get install bubblewrap" in out and "STUDIO_SANDBOX=none" in out
    assert terminal("echo ran", workspace) == sandbox.INSTALL_HINT


def test_sandbox_none_is_an_explicit_opt_out(workspace, settings):
    settings.STUDIO_SANDBOX = "none"
    out = terminal("ls /proc | grep -cE '^[0-9]+$'", workspace)
    # No PID namespace: the host's processes are visible. That is what
    # opting out means; the default never does this.
    assert int(out.strip()) > 10


def test_a_call_that_needed_the_network_is_told_there_is_none(workspace, python_mode):
    code = "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=5)"
    out = python(code, workspace)
    assert out.startswith("Error: exited with status 1. Tools run without a network"), out
    assert "use web_fetch" in out
    # A failure that has nothing to do with the network says nothing of it.
    assert "network" not in python("raise SystemExit(3)", workspace)


@pytest.mark.django_db
def test_an_output_cut_in_the_chat_is_kept_whole_in_the_workspace(workspace, settings):
    """Issue 38: the chat shows the first 64 KB; the whole downloads (and the model can read it)."""
    code = "import sys\nfor n in range(20000): sys.stdout.write(f'line {n:05d}\\n')"
    result = builtin_tools()["python"].execute(
        {"code": code}, cancel=CancelToken(), timeout=TIMEOUT, workspace=workspace
    )
    whole = "".join(f"line {n:05d}\n" for n in range(20000))
    assert result.ok and len(result.text) < len(whole)
    [kept] = [f for f in result.images if f.get("output")]
    assert result.text.endswith(f"[The whole output is in the workspace as {kept['name']}.]")
    saved = workspace / kept["name"]
    assert saved.read_text() == whole and kept["size"] == len(whole)
    if sandbox.sandbox_ids(workspace) is not None:
        assert saved.stat().st_uid == sandbox.sandbox_ids(workspace)[0]
    # The model's next call reads it like any file of its workspace.
    assert python(f"print(len(open('{kept['name']}').read()))", workspace).strip() == str(
        len(whole)
    )

    # A workspace without room for it keeps only what the chat shows.
    settings.STUDIO_WORKSPACE_QUOTA_MB = 1
    result = builtin_tools()["python"].execute(
        {"code": code.replace("20000", "100000")},  # 1.1 MB of output
        cancel=CancelToken(),
        timeout=TIMEOUT,
        workspace=workspace,
    )
    assert not [f for f in result.images if f.get("output")]
    assert "output truncated" in result.text and "whole output" not in result.text


def test_a_workspace_git_config_cannot_turn_git_status_into_a_program(workspace):
    """Issue 52: ``git status`` ran ``core.fsmonitor`` from a config an earlier call wrote."""
    terminal(
        "git init -q . && printf '#!/bin/sh\\ntouch MONITORED\\n' > monitor.sh"
        ' && chmod +x monitor.sh && git config core.fsmonitor "$PWD/monitor.sh"'
        ' && git config core.hooksPath "$PWD" && git config core.pager "$PWD/monitor.sh"',
        workspace,
    )
    # The control: with the pinned settings taken away, git status runs it.
    control = terminal("env -u GIT_CONFIG_COUNT git status > /dev/null 2>&1; ls", workspace)
    assert "MONITORED" in control
    pinned = terminal("rm MONITORED; git status; git log; ls", workspace)
    assert "MONITORED" not in pinned
    assert "No commits yet" in pinned or "does not have any commits" in pinned


@pytest.mark.parametrize("tool", ["python", "terminal"])
def test_a_running_call_hands_over_its_latest_output_a_few_times_a_second(
    workspace, python_mode, tool
):
    """Issue 55's live output: while the call runs, its last screenful goes to
    ``progress`` when it grew, never more often than LIVE_SECONDS."""
    heard: list[tuple[float, str]] = []
    started = time.monotonic()
    code = {
        "python": "import time\nfor i in range(8):\n    print('line', i)\n    time.sleep(0.2)\n",
        "terminal": "for i in $(seq 0 7); do echo line $i; sleep 0.2; done",
    }[tool]
    argument = "code" if tool == "python" else "command"
    result = builtin_tools()[tool].execute(
        {argument: code},
        cancel=CancelToken(),
        timeout=TIMEOUT,
        workspace=workspace,
        progress=lambda text: heard.append((time.monotonic(), text)),
    )
    assert result.ok and "line 7" in result.text, result.text
    assert len(heard) >= 3, heard  # about 1.6 s of output, at most every 0.25 s
    assert heard[0][1].startswith("line 0") and "line 7" not in heard[0][1]
    texts = [text for _, text in heard]
    assert texts == sorted(texts, key=len) and len(set(texts)) == len(texts)  # grew each time
    gaps = [b - a for (a, _), (b, _) in zip([(started, "")] + heard, heard, strict=False)]
    assert min(gaps) >= sandbox.LIVE_SECONDS - 0.01, gaps


def test_live_output_is_the_latest_past_the_cap(workspace):
    """A call printing more than the chat keeps still shows its newest lines live."""
    heard: list[str] = []
    command = "head -c 200000 /dev/zero | tr '\\0' x; echo; sleep 0.5; echo the-end; sleep 0.5"
    builtin_tools()["terminal"].execute(
        {"command": command},
        cancel=CancelToken(),
        timeout=TIMEOUT,
        workspace=workspace,
        progress=heard.append,
    )
    assert any(text.rstrip().endswith("the-end") for text in heard), [t[-40:] for t in heard]
    assert all(len(text.encode()) <= sandbox.LIVE_BYTES + 3 for text in heard)
