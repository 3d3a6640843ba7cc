"""Python sessions: one long-lived interpreter per conversation, like a notebook kernel.

Each conversation's python calls run in one interpreter that keeps its
variables between calls. It runs in the same sandbox as a single call
(bubblewrap, no network, the tools' uid, seccomp), and its cgroup caps
the memory of the whole interpreter, not of each call. Every call is still
gated on its own code; the session only changes what the code can see.

A session lives in the process that started it. It ends, and the next call
starts a fresh one (the model is told), when it was idle for
``STUDIO_PYTHON_IDLE_SECONDS``, when a call of it timed out, was stopped or
passed a limit, and when the member pressed Stop or Restart. Those are
written on the conversation's row; chat installs ``is_current`` to read it
before each call, and each process's heartbeat ends the sessions it holds
that were reset elsewhere (this module reads no database itself).

The interpreter is the model's: what it writes, the end-of-call line
included, is only ever shown as the call's output and trusted for nothing.
"""

from __future__ import annotations

import logging
import secrets
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from chat.tools.base import Progress, ToolResult
from chat.tools.images import snapshot
from chat.tools.sandbox import (
    LiveOutput,
    OutputSink,
    Prepared,
    QuotaWatch,
    SandboxResult,
    SandboxUnavailable,
    clean_env,
    default_limits,
    kill_session,
    prepare,
    tool_result,
    watch,
    write_beneath,
)
from studio.cancel import CancelToken

logger = logging.getLogger(__name__)

# A session's interpreter may use this much CPU over its whole life; then it
# is killed like any call past a limit, and the next call starts afresh.
SESSION_CPU_SECONDS = 3600
REAP_SECONDS = 2.0
# Written in the workspace when a session starts: a later session finding it
# tells the model that what earlier calls defined is gone (the first one has
# nothing to say). The model may delete it; it then only misses that note.
SEEN_MARK = ".studio-python-session"
# After the output: a failure's text must start with "Error:".
FRESH_TEXT = (
    "\n[A new python session started for this call: nothing defined by earlier calls "
    "exists here; files in the workspace are kept.]"
)
ENDED_TEXT = "\n[The python session ended with this call; the next call starts a new one.]"


@dataclass
class Session:
    """One running interpreter, and where one call's output goes."""

    workspace: Path
    proc: subprocess.Popen
    prepared: Prepared
    marker: bytes  # how the interpreter frames each call's output (chat.tools.python)
    # Which session of the chat a call ran in, for the audit row.
    id: str = field(default_factory=lambda: secrets.token_hex(6))
    started_at: datetime = field(default_factory=timezone.now)
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sink: OutputSink | None = None
    calls: int = 0  # calls sent so far; the one whose output is wanted now
    in_call: bool = False
    status: int | None = None
    stray: int = 0  # bytes printed between calls (by threads of earlier calls), dropped
    ended: threading.Event = field(default_factory=threading.Event)

    def read(self) -> None:
        """(Its reader thread.) Output between the current call's start and end lines
        is that call's; anything else was printed between calls and is dropped."""
        assert self.proc.stdout is not None
        data = b""
        while block := self.proc.stdout.read1(65536):
            data = self._frame(data + block)
        self._emit(data)
        self.ended.set()

    def _frame(self, data: bytes) -> bytes:
        """Route what ``data`` holds; returns what may still be the start of a frame line."""
        while True:
            at = data.find(self.marker)
            if at < 0:
                # Keep back only what could be the start of a marker split across
                # reads (from its first byte on): the rest shows live at once.
                start = data.rfind(self.marker[:1], max(0, len(data) - len(self.marker)))
                if start < 0:
                    self._emit(data)
                    return b""
                self._emit(data[:start])
                return data[start:]
            line_end = data.find(b"\n", at)
            if line_end < 0:
                self._emit(data[:at])
                return data[at:]
            self._emit(data[:at])
            self._frame_line(data[at + len(self.marker) : line_end].split())
            data = data[line_end + 1 :]

    def _frame_line(self, words: list[bytes]) -> None:
        wanted = str(self.calls).encode()
        if words[:2] == [b"start", wanted]:
            self.in_call = True
        elif words[:2] == [b"end", wanted] and self.in_call:
            try:
                self.status = int(words[2])
            except (IndexError, ValueError):
                self.status = 1
            self.in_call = False
            self.ended.set()

    def _emit(self, data: bytes) -> None:
        if not data:
            return
        if self.in_call and self.sink is not None:
            self.sink.add(data)
        else:
            self.stray += len(data)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        kill_session(self.proc)
        self.prepared.release()


class Sessions:
    """This process's python sessions, by conversation."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict[Path, Session] = {}
        self.reaper: threading.Thread | None = None
        # (workspace, started at) -> whether no Stop or Restart ended it since.
        self.is_current: Callable[[Path, datetime], bool] = lambda workspace, started: True

    def run(
        self,
        code: str,
        *,
        workspace: Path,
        timeout: float,
        cancel: CancelToken,
        argv: list[str],
        progress: Progress | None = None,
    ) -> ToolResult:
        """Run ``code`` in the workspace's session (started if need be)."""
        fresh = False
        with self.lock:
            session = self.sessions.get(workspace)
        if session is not None and not (
            session.alive and self.is_current(workspace, session.started_at)
        ):
            self.end(workspace, session)
            session = None
        if session is None:
            try:
                session = self._start(workspace, argv)
            except SandboxUnavailable as exc:
                return ToolResult(str(exc), ok=False)
            fresh = (workspace / SEEN_MARK).exists()
            if not fresh:
                write_beneath(workspace, SEEN_MARK, [b""])
            with self.lock:
                self.sessions[workspace] = session
            self._make_room()
            self._reap_later()
        with session.lock:
            result, ended = self._call(
                session, code, timeout=timeout, cancel=cancel, progress=progress
            )
        if ended:
            self.end(workspace, session)
        text = result.text + (FRESH_TEXT if fresh else "") + (ENDED_TEXT if ended else "")
        return ToolResult(
            text, ok=result.ok, images=result.images, session=session.id, stopped=result.stopped
        )

    def _start(self, workspace: Path, argv: list[str]) -> Session:
        limits = default_limits()
        # Given on stdin, never in argv (the command line is readable in /proc).
        marker = b"\x1estudio-" + secrets.token_hex(16).encode() + b" "
        prepared = prepare(
            argv, workspace=workspace, limits=limits, cpu_seconds=SESSION_CPU_SECONDS
        )
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv is built here, never a shell string
                prepared.command,
                cwd=workspace,
                env=clean_env(workspace),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                close_fds=True,
                pass_fds=prepared.pass_fds,
                start_new_session=True,
            )
        except OSError:
            prepared.release()
            raise
        try:
            assert proc.stdin is not None
            proc.stdin.write(marker + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died at once: its first call sees it exit
        session = Session(
            workspace=workspace,
            proc=proc,
            prepared=prepared,
            marker=marker,
        )
        threading.Thread(target=session.read, daemon=True, name="studio-python-session").start()
        return session

    def _call(
        self,
        session: Session,
        code: str,
        *,
        timeout: float,
        cancel: CancelToken,
        progress: Progress | None = None,
    ) -> tuple[ToolResult, bool]:
        """(The call's result, whether the session ended with it.)"""
        limits = default_limits()
        before = snapshot(session.workspace)
        if session.stray:
            logger.info(
                "python session %s: %d bytes printed between calls were dropped",
                session.id,
                session.stray,
            )
            session.stray = 0
        sink = session.sink = OutputSink()
        session.status = None
        session.calls += 1
        session.ended.clear()
        payload = code.encode("utf-8", errors="replace")
        try:
            assert session.proc.stdin is not None
            session.proc.stdin.write(b"%d\n" % len(payload) + payload)
            session.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died meanwhile: the watch sees it exit
        quota = QuotaWatch(session.workspace, limits.workspace_bytes, used=session.prepared.used)
        live = LiveOutput(sink, progress) if progress is not None else None
        timed_out, cancelled, over_quota = watch(
            session.proc,
            timeout=timeout,
            cancel=cancel,
            quota=quota,
            ended=session.ended,
            tick=live,
        )
        # Stop also ends the session (from another thread): it may have killed the
        # interpreter before the watch saw the cancel, and that is still a stop.
        cancelled = cancelled or (cancel.is_set() and session.status is None)
        # No end-of-call line: the interpreter died (a limit, a crash, os._exit).
        ended = timed_out or cancelled or over_quota or session.status is None
        cgroup = session.prepared.cgroup
        if ended:
            kill_session(session.proc)
            session.ended.wait(5)  # the reader drains what was written before the kill
        # Read before the cgroup goes (with the session, in ``end``).
        out_of_memory = cgroup is not None and cgroup.out_of_memory()
        sink, session.sink = session.sink, None
        exit_code = session.status if session.status is not None else session.proc.returncode
        ran = SandboxResult(
            output=sink.text(),
            exit_code=exit_code,
            timed_out=timed_out,
            cancelled=cancelled,
            truncated_bytes=sink.dropped,
            whole=sink.whole,
            out_of_memory=out_of_memory,
            over_quota=over_quota,
            quota_bytes=limits.workspace_bytes,
        )
        session.last_used = time.monotonic()
        result = tool_result(ran, workspace=session.workspace, before=before, timeout=timeout)
        return result, ended

    def end(self, workspace: Path, session: Session | None = None) -> bool:
        """End the workspace's session here (``session``: only if it is that one)."""
        with self.lock:
            current = self.sessions.get(workspace)
            if current is None or (session is not None and current is not session):
                return False
            self.sessions.pop(workspace)
        current.close()
        return True

    def end_all(self) -> None:
        with self.lock:
            sessions, self.sessions = list(self.sessions.values()), {}
        for session in sessions:
            session.close()

    def _make_room(self) -> None:
        """Past STUDIO_PYTHON_MAX_SESSIONS, end the sessions idle the longest."""
        with self.lock:
            idle = sorted(
                (s for s in self.sessions.values() if not s.lock.locked()),
                key=lambda s: s.last_used,
            )
            over = len(self.sessions) - settings.STUDIO_PYTHON_MAX_SESSIONS
        for session in idle[: max(0, over)]:
            self.end(session.workspace, session)

    def end_reset(self) -> int:
        """End the sessions held here whose conversation was reset (from a thread
        that may read the database); how many."""
        with self.lock:
            sessions = list(self.sessions.values())
        ended = 0
        for session in sessions:
            if not session.lock.locked() and not self.is_current(
                session.workspace, session.started_at
            ):
                ended += self.end(session.workspace, session)
        return ended

    def held(self) -> int:
        with self.lock:
            return len(self.sessions)

    def _reap_later(self) -> None:
        with self.lock:
            if self.reaper is not None and self.reaper.is_alive():
                return
            self.reaper = threading.Thread(target=self._reap, daemon=True, name="studio-reaper")
            self.reaper.start()

    def _reap(self) -> None:
        """(The reaper thread.) End idle and dead sessions; stop when none is left."""
        while True:
            time.sleep(REAP_SECONDS)
            with self.lock:
                sessions = list(self.sessions.values())
            if not sessions:
                return
            idle = settings.STUDIO_PYTHON_IDLE_SECONDS
            for session in sessions:
                if session.lock.locked():
                    continue  # a call runs: its own watch ends it if need be
                if time.monotonic() - session.last_used > idle or not session.alive:
                    self.end(session.workspace, session)


SESSIONS = Sessions()
