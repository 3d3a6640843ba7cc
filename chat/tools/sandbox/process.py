"""A call's process while it runs: its output, its live tail, its quota, its end."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from chat.tools.base import LIVE_SECONDS, Progress
from chat.tools.sandbox.cgroups import CallCgroup
from chat.tools.sandbox.command import clean_env
from chat.tools.sandbox.files import workspace_usage
from chat.tools.sandbox.limits import Limits
from chat.tools.sandbox.result import SandboxResult
from studio.cancel import CancelToken
from studio.text import strip_nul

logger = logging.getLogger(__name__)

OUTPUT_CAP = 64 * 1024


# An output cut at OUTPUT_CAP is kept whole, up to this, as a workspace file.
WHOLE_OUTPUT_CAP = 16 * 1024 * 1024


# A running call's live output is its last LIVE_BYTES: enough for the last screenful.
LIVE_BYTES = 8 * 1024


# The workspace quota is soft: a call is stopped once it has passed it, by at
# most QUOTA_SLACK. Usage is checked sooner the nearer it is to that bound,
# at the fastest rate the call has written so far (QUOTA_RATE at least).
QUOTA_SLACK = 64 * 1024 * 1024


QUOTA_RATE = 1024 * 1024 * 1024


_QUOTA_CHECK_SECONDS = (0.01, 1.0)


def run_process(
    command: list[str],
    *,
    workspace: Path,
    timeout: float,
    cancel: CancelToken | None,
    stdin: str | None,
    limits: Limits,
    cgroup: CallCgroup | None,
    used: int,
    pass_fds: tuple[int, ...] = (),
    progress: Progress | None = None,
) -> SandboxResult:
    proc = subprocess.Popen(  # noqa: S603 - argv is built here, never a shell string
        command,
        cwd=workspace,
        env=clean_env(workspace),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        close_fds=True,
        pass_fds=pass_fds,
        start_new_session=True,
    )
    sink = OutputSink()

    def drain() -> None:
        assert proc.stdout is not None
        while block := proc.stdout.read1(65536):
            sink.add(block)

    reader = threading.Thread(target=drain, daemon=True, name="studio-tool-output")
    reader.start()
    if stdin is not None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    quota = QuotaWatch(workspace, limits.workspace_bytes, used=used)
    live = LiveOutput(sink, progress) if progress is not None else None
    timed_out, cancelled, over_quota = watch(
        proc, timeout=timeout, cancel=cancel, quota=quota, tick=live
    )
    # bubblewrap's PID namespace dies with its init: killing the session
    # takes every process the program started, whatever it did to detach.
    kill_session(proc)
    if cgroup is not None:
        cgroup.kill_all()
    reader.join(5)
    return SandboxResult(
        output=sink.text(),
        exit_code=proc.returncode,
        timed_out=timed_out,
        cancelled=cancelled,
        truncated_bytes=sink.dropped,
        whole=sink.whole,
        out_of_memory=cgroup is not None and cgroup.out_of_memory(),
        over_quota=over_quota,
        quota_bytes=limits.workspace_bytes,
    )


def watch(
    proc: subprocess.Popen,
    *,
    timeout: float,
    cancel: CancelToken | None,
    quota: QuotaWatch,
    ended: threading.Event | None = None,
    tick: Callable[[float], None] | None = None,
) -> tuple[bool, bool, bool]:
    """Until the process exits (or ``ended`` is set): (timed out, cancelled, over its
    quota). ``tick`` is called with the time between its looks (the live output)."""
    deadline = time.monotonic() + timeout
    while True:
        step = max(0.005, min(0.05, quota.next_check - time.monotonic()))
        if ended is None:
            try:
                proc.wait(timeout=step)
                break
            except subprocess.TimeoutExpired:
                pass
        elif ended.wait(step) or proc.poll() is not None:
            break
        now = time.monotonic()
        if tick is not None:
            tick(now)
        if cancel is not None and cancel.is_set():
            return False, True, False
        if now >= deadline:
            return True, False, False
        if now >= quota.next_check and quota.check(now):
            return False, False, True
    return False, False, False


class OutputSink:
    """A call's output: its first OUTPUT_CAP bytes for the chat and the model,
    and, once it passes that, the whole (up to WHOLE_OUTPUT_CAP) in a file."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.kept = 0
        self.dropped = 0
        self.whole: IO[bytes] | None = None
        self.latest = bytearray()  # its last LIVE_BYTES, past the cap too

    def add(self, block: bytes) -> None:
        self.latest += block[-LIVE_BYTES:]
        del self.latest[:-LIVE_BYTES]
        room = OUTPUT_CAP - self.kept
        if room > 0:
            self.chunks.append(block[:room])
            self.kept += min(room, len(block))
        self.dropped += max(0, len(block) - max(room, 0))
        if self.dropped:
            if self.whole is None:
                self.whole = tempfile.TemporaryFile()
                self.whole.write(b"".join(self.chunks))
                block = block[max(room, 0) :]
            if self.whole.tell() < WHOLE_OUTPUT_CAP:
                self.whole.write(block[: WHOLE_OUTPUT_CAP - self.whole.tell()])

    def text(self) -> str:
        return strip_nul(b"".join(self.chunks).decode("utf-8", errors="replace"))


class LiveOutput:
    """Hands a running call's latest output to ``progress`` when it grew, at most
    every LIVE_SECONDS (the first after LIVE_SECONDS: a quick call shows only
    its result). Called from the thread that watches the call."""

    def __init__(self, sink: OutputSink, progress: Progress) -> None:
        self.sink, self.progress = sink, progress
        self.shown = 0
        self.at = time.monotonic()

    def __call__(self, now: float) -> None:
        seen = self.sink.kept + self.sink.dropped
        if seen == self.shown or now - self.at < LIVE_SECONDS:
            return
        self.shown, self.at = seen, now
        latest = bytes(self.sink.latest)  # one copy: the reader thread appends meanwhile
        text = strip_nul(latest.decode("utf-8", errors="replace"))
        if seen > len(latest):
            text = "…" + text.lstrip("\ufffd")  # the start of a character may be cut
        try:
            self.progress(text)
        except Exception:  # the card missing a frame must not stop the call
            logger.warning("live output of a call was not sent", exc_info=True)


class QuotaWatch:
    """When to look at a running call's workspace, and whether it passed its quota."""

    def __init__(self, workspace: Path, quota: int, *, used: int) -> None:
        self.workspace = workspace
        self.used = used
        # A workspace already over it (by the last call's slack) may shrink, not grow.
        self.quota = max(quota, self.used)
        self.rate = QUOTA_RATE
        self.checked_at = time.monotonic()
        self.next_check = self.checked_at + self._interval()

    def check(self, now: float) -> bool:
        used = workspace_usage(self.workspace, stop_above=self.quota)
        if now > self.checked_at:
            self.rate = max(self.rate, (used - self.used) / (now - self.checked_at))
        self.used, self.checked_at = used, now
        self.next_check = now + self._interval()
        return used > self.quota

    def _interval(self) -> float:
        # A third of the time the fastest writer needs to pass the quota by the slack.
        headroom = max(0, self.quota + QUOTA_SLACK - self.used)
        low, high = _QUOTA_CHECK_SECONDS
        return min(high, max(low, headroom / self.rate / 3))


def kill_session(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
