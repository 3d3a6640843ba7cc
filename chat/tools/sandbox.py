"""Run a tool's program in a subprocess sandbox.

What the sandbox guarantees:

* a fresh environment with none of the server's variables (no secret key,
  API keys, database or Redis URLs);
* its own process group and session, killed as a whole at the wall-clock
  timeout or on cancel;
* ``resource`` limits on CPU time, address space, file size, open files and
  processes;
* when the server runs as root, the child runs as an unprivileged uid of its
  own conversation (``SANDBOX_UID_BASE + conversation id``), so the process
  limit is enforced at all (the kernel exempts root), the working folder
  (mode 0700) is unreadable to other conversations' tools, and the server's
  private files (secret key, SQLite database: mode 0600) are out of reach;
* a per-conversation working folder as its current directory and ``HOME``;
* output capped, saying how much was cut.

It is not a full filesystem jail: the program can read what any
unprivileged user can read (world-readable system files and source code).
Without root (a developer's laptop) the uid switch is skipped.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from approvals.gate import CancelToken

OUTPUT_CAP = 64 * 1024
SANDBOX_UID_BASE = 200_000
_CONVERSATION_DIR = re.compile(r"^conversation-(\d+)$")


@dataclass(frozen=True)
class Limits:
    memory_bytes: int = 512 * 1024 * 1024
    file_bytes: int = 16 * 1024 * 1024
    processes: int = 64
    open_files: int = 256


@dataclass
class SandboxResult:
    output: str
    exit_code: int | None
    timed_out: bool = False
    cancelled: bool = False
    truncated_bytes: int = 0

    def as_text(self, *, timeout: float) -> str:
        text = self.output
        if self.truncated_bytes:
            text += f"\n[output truncated: {self.truncated_bytes} more bytes not shown]"
        if self.timed_out:
            return f"Error: timed out after {timeout:g} s and was killed.\n{text}".rstrip()
        if self.cancelled:
            return f"Error: stopped by the user.\n{text}".rstrip()
        if self.exit_code:
            reason = _describe_exit(self.exit_code)
            return f"Error: exited with {reason}.\n{text}".rstrip()
        return text if text.strip() else "(no output)"


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"status {code}"


def can_drop_privileges() -> bool:
    return os.geteuid() == 0


def sandbox_ids(workspace: Path) -> tuple[int, int] | None:
    """The uid/gid a tool of this workspace runs as, or None without root."""
    if not can_drop_privileges():
        return None
    match = _CONVERSATION_DIR.match(workspace.name)
    if match:
        offset = int(match.group(1)) % 1_000_000_000
    else:
        offset = 1_000_000_000 + zlib.crc32(str(workspace).encode()) % 100_000_000
    uid = SANDBOX_UID_BASE + offset
    return uid, uid


def prepare_workspace(path: Path) -> Path:
    """Create the working folder, private to the uid its tools run as."""
    path.mkdir(parents=True, exist_ok=True)
    ids = sandbox_ids(path)
    if ids is not None:
        os.chown(path, *ids)
        path.chmod(0o700)
        # The root of all workspaces must be traversable (not listable).
        path.parent.chmod((path.parent.stat().st_mode | 0o111) & ~0o066)
    return path


def clean_env(workspace: Path) -> dict[str, str]:
    """Built from nothing, never copied from the server's environment."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workspace),
        "TMPDIR": str(workspace),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
    }


def _preexec(limits: Limits, cpu_seconds: int, ids: tuple[int, int] | None):
    def setup() -> None:  # runs in the child between fork and exec
        os.setsid()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        if ids is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])

    return setup


def run_sandboxed(
    argv: list[str],
    *,
    workspace: Path,
    timeout: float,
    cancel: CancelToken | None = None,
    stdin: str | None = None,
    limits: Limits | None = None,
) -> SandboxResult:
    limits = limits or Limits()
    prepare_workspace(workspace)
    ids = sandbox_ids(workspace)
    proc = subprocess.Popen(  # noqa: S603 - argv is built by the tool, never a shell string
        argv,
        cwd=workspace,
        env=clean_env(workspace),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_preexec(limits, max(1, int(timeout) + 1), ids),  # noqa: PLW1509
        close_fds=True,
    )
    chunks: list[bytes] = []
    kept = [0]
    dropped = [0]

    def drain() -> None:
        assert proc.stdout is not None
        while True:
            block = proc.stdout.read1(65536) if hasattr(proc.stdout, "read1") else b""
            if not block:
                break
            room = OUTPUT_CAP - kept[0]
            if room > 0:
                chunks.append(block[:room])
                kept[0] += min(room, len(block))
            dropped[0] += max(0, len(block) - max(room, 0))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    if stdin is not None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    deadline = time.monotonic() + timeout
    timed_out = cancelled = False
    while True:
        try:
            proc.wait(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            pass
        if cancel is not None and cancel.is_set():
            cancelled = True
        elif time.monotonic() >= deadline:
            timed_out = True
        if timed_out or cancelled:
            _kill_group(proc)
            break
    _kill_group(proc)  # stray children of a finished program go too
    reader.join(5)
    output = b"".join(chunks).decode("utf-8", errors="replace")
    return SandboxResult(
        output=output,
        exit_code=proc.returncode,
        timed_out=timed_out,
        cancelled=cancelled,
        truncated_bytes=dropped[0],
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
