"""Shared set-up for the benchmarks: a fresh database, servers, users, sessions."""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
APPROVAL_ID = re.compile(r'data-approval-id="([^"]+)"')
# The production-shape benchmarks' own database and Redis database.
POSTGRES_URL = "postgres://postgres@127.0.0.1:5432/studio_bench"
REDIS_URL = "redis://127.0.0.1:6379/5"


def setup_django(database_url: str, redis_url: str = "") -> None:
    """Point this process at the benchmark database (migrated fresh) and set Django up."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "studio.settings"
    # Production mode (no query log, no debug extras), one key for all processes.
    os.environ["DJANGO_DEBUG"] = "False"
    os.environ["DJANGO_SECRET_KEY"] = "bench-secret-key-not-for-production-0123456789abcdef"
    os.environ["DATABASE_URL"] = database_url
    if redis_url:
        os.environ["REDIS_URL"] = redis_url
    else:
        os.environ.pop("REDIS_URL", None)
    if database_url.startswith("sqlite:///"):
        path = Path(database_url[len("sqlite:///") :])
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    else:
        name = database_url.rsplit("/", 1)[1]
        admin = database_url.rsplit("/", 1)[0] + "/postgres"
        for sql in (f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}"):
            subprocess.run(["psql", admin, "-qc", sql], check=True, capture_output=True)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        check=True,
        env=dict(os.environ),
    )
    import django

    django.setup()


def server_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        STUDIO_WORKSPACE_ROOT=str(ROOT / "bench" / ".bench-workspaces"),
        STUDIO_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


def make_member(username: str = "bench"):
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_user(username, password="bench-password-123")
    client = Client()
    client.force_login(user)
    return user, client.cookies["sessionid"].value


def member_headers(session: str, csrf: str) -> dict[str, str]:
    """A logged-in member's JSON call: the session and CSRF cookies as a ``Cookie``
    header, the CSRF token sent back, a JSON answer asked for.

    As a header, not in the client's cookie jar: httpx keeps cookies in
    Python's ``http.cookiejar``, which costs the client about 0.1 ms per
    request inside the timed interval, a cost the
    peers' clients (no cookies) never pay and a browser's is not.
    """
    return {
        "Cookie": f"sessionid={session}; csrftoken={csrf}",
        "X-CSRFToken": csrf,
        "Accept": "application/json",
    }


def member_post(http) -> Callable[[str], object]:
    """A function that POSTs an Allow to a path as a logged-in browser's JSON call does.

    ``http``: an httpx client holding the member's session cookie; it fetches
    a page first, for the CSRF cookie the calls then send back. The client's
    jar is then emptied: the cookies go in ``member_headers``.
    """
    http.get("/")
    headers = member_headers(http.cookies["sessionid"], http.cookies["csrftoken"])
    http.cookies.clear()
    return lambda path: http.post(path, data={"decision": "allow"}, headers=headers)


def member_allow(http) -> Callable[[str], object]:
    """``member_post`` for an approval's decision view."""
    post = member_post(http)
    return lambda approval_id: post(f"/approvals/{approval_id}/decide/")


def make_conversation(user, **fields):
    from chat.models import Conversation

    fields.setdefault("enabled_tools", ["echo"])
    return Conversation.objects.create(owner=user, title="bench", **fields)


def make_pending(user, conversation, count: int) -> list:
    """``count`` pending ``echo`` approvals in ``conversation``, as a parked run leaves them."""
    from approvals.models import ToolApproval, arguments_hash

    rows = [
        ToolApproval(
            conversation=conversation,
            tool_name="echo",
            arguments={"text": str(i)},
            arguments_sha256=arguments_hash({"text": str(i)}),
            requested_by=user,
            run_id="bench",
        )
        for i in range(count)
    ]
    ToolApproval.objects.bulk_create(rows)
    return rows


class IdleTabs:
    """``count`` open chat tabs of another member, idle, held while a benchmark runs.

    What a process serving a team also holds: sockets that take no part in
    the measured approvals but that every layer sweep and scan walks past.
    One asyncio loop in a thread of its own holds them all; each has had its
    conversation's first frame before ``__enter__`` returns.
    """

    def __init__(self, server, session: str, conversation_ids: list[int]) -> None:
        self.server, self.session, self.conversation_ids = server, session, conversation_ids
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.sockets: list = []

    def __enter__(self) -> IdleTabs:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self.loop).result(timeout=600)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(timeout=120)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    async def _open(self) -> None:
        from websockets.asyncio.client import connect

        limit = asyncio.Semaphore(20)

        async def one(conversation_id: int) -> None:
            async with limit:
                ws = await connect(
                    f"{self.server.ws_url}/ws/c/{conversation_id}/",
                    additional_headers={
                        "Cookie": f"sessionid={self.session}",
                        "Origin": self.server.url,
                    },
                )
                await asyncio.wait_for(ws.recv(), 30)
                self.sockets.append(ws)

        await asyncio.gather(*(one(c) for c in self.conversation_ids))

    async def _close(self) -> None:
        await asyncio.gather(*(ws.close() for ws in self.sockets), return_exceptions=True)


def stream_request(tokens: int, pace: float = 0) -> str:
    """The frame that asks bench/asgi.py's model for a reply of ``tokens`` tokens,
    at ``pace`` tokens a second (0: as fast as it can)."""
    return json.dumps({"message": f"stream {tokens}" + (f" {pace:g}" if pace else "")})


class Streams:
    """``count`` chats of one member asking for a streamed reply (300 tokens at
    100 tok/s) one after another, each on its own socket and thread, for as
    long as the ``with`` block lasts: the load a decision meets while others chat."""

    REQUEST = stream_request(300, 100)

    def __init__(self, server, user, session: str, count: int) -> None:
        self.server, self.user, self.session = server, user, session
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._chat, daemon=True) for _ in range(count)]

    def __enter__(self) -> Streams:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def _chat(self) -> None:
        with chat_socket(self.server, self.session, make_conversation(self.user).pk) as ws:
            recv_until(ws, 'id="transcript"')
            while not self.stop.is_set():
                ws.send(self.REQUEST)
                recv_until(ws, 'data-running="false"', timeout=60)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, all its threads (those gone too).

    Read from the kernel's CPU clock of the process (what glibc's
    ``clock_getcpuclockid`` names: ``~pid << 3 | CPUCLOCK_SCHED``), exact to
    the nanosecond. ``/proc/<pid>/stat`` gives it in 10 ms ticks: a window
    of 2 to 3 ms reads as 0 or 10 ms, and 300 approvals' mean of that read
    spread the CPU ratio by some 15 % from one round to the next.
    """
    return time.clock_gettime((~pid << 3) | 2)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary_ms(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return (
        f"n={len(ms)} p50={statistics.median(ms):.2f} ms p95={percentile(ms, 95):.2f} ms "
        f"p99={percentile(ms, 99):.2f} ms max={max(ms):.2f} ms"
    )


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def recv_until(ws, needle: str, timeout: float = 20) -> str:
    """Frames from a sync websockets client up to the one holding ``needle``."""
    deadline = time.monotonic() + timeout
    seen = []
    while True:
        frame = ws.recv(timeout=max(0.001, deadline - time.monotonic()))
        seen.append(frame)
        if needle in frame:
            return "\n".join(seen)


def chat_socket(server, session: str, conversation_id: int, *, drawn: bool = False):
    """A member's chat socket on a conversation (sync websockets client): as a page
    just drawn opens it (``drawn``: it names when, ``?since=``), else as a reconnect."""
    from websockets.sync.client import connect

    since = f"?since={int(time.time())}" if drawn else ""
    return connect(
        f"{server.ws_url}/ws/c/{conversation_id}/{since}",
        additional_headers={"Cookie": f"sessionid={session}", "Origin": server.url},
    )


def parked_chats(server, user, session: str, count: int) -> list[tuple[int, str]]:
    """``count`` new chats of the member's, each with its run parked on a pending
    ``echo`` card through the socket: (chat id, approval id) each."""
    chats = []
    for n in range(count):
        conversation_id = make_conversation(user).pk
        with chat_socket(server, session, conversation_id) as ws:
            recv_until(ws, 'id="transcript"')
            ws.send(json.dumps({"message": f"echo out-{n}"}))
            pending = recv_until(ws, 'data-status="pending"')
        chats.append((conversation_id, APPROVAL_ID.findall(pending)[-1]))
    return chats


def open_chat(server, user, session: str):
    """A new conversation of ``user``'s, its chat socket open and caught up."""
    ws = chat_socket(server, session, make_conversation(user).pk)
    recv_until(ws, 'id="transcript"')
    return ws


@dataclass(frozen=True)
class Trip:
    """One approval's figures (seconds)."""

    total: float  # decision POST -> tool_end on the socket
    post: float  # the POST's own response
    cpu: float  # server CPU in the total window
    launch: float | None = None  # message sent -> its pending card
    launch_cpu: float | None = None  # server CPU in that window
    sent: float = 0.0  # when the decision POST was sent (perf_counter)
    # SocketCycles' ``read`` at the total window's start and end, if it has one.
    read: tuple[object, object] | None = None


@dataclass
class RoundTrips:
    total: list[float] = field(default_factory=list)  # decision POST -> tool_end on the socket
    post: list[float] = field(default_factory=list)  # the POST's own response
    cpu: list[float] = field(default_factory=list)  # server CPU in the total window
    launch: list[float] = field(default_factory=list)  # message sent -> its pending card
    launch_cpu: list[float] = field(default_factory=list)  # server CPU in that window

    def add(self, trip: Trip) -> None:
        self.total.append(trip.total)
        self.post.append(trip.post)
        self.cpu.append(trip.cpu)
        if trip.launch is not None:
            self.launch.append(trip.launch)
            self.launch_cpu.append(trip.launch_cpu)


class SocketCycles:
    """Approvals one at a time on a server that speaks Studio's socket protocol
    (Studio, the Channels peer): a message on the socket parks a run on a
    pending card, ``decide(approval_id)`` POSTs the decision (to any
    process), and ``one()`` times until the ``tool_end`` fragment arrives on
    the socket. A new conversation every ``per_conversation`` approvals.
    ``read``, if given, is called just outside the server's CPU reads at both
    ends of that window (``Trip.read``)."""

    def __init__(
        self,
        *,
        ws_server,
        user,
        session: str,
        decide: Callable[[str], object],
        per_conversation: int = 50,
        cpu_pid: int | None = None,
        read: Callable[[], object] | None = None,
    ) -> None:
        self.ws_server, self.user, self.session = ws_server, user, session
        self.decide, self.per_conversation, self.cpu_pid = decide, per_conversation, cpu_pid
        self.read = read
        self.done, self.ws = 0, None

    def _cpu(self) -> float:
        return cpu_seconds(self.cpu_pid) if self.cpu_pid else 0.0

    def one(self) -> Trip:
        if self.done % self.per_conversation == 0:
            self.close()
            self.ws = open_chat(self.ws_server, self.user, self.session)
        ws = self.ws
        launch_cpu0 = self._cpu()
        launch0 = time.perf_counter()
        ws.send(json.dumps({"message": f"echo {self.done}"}))
        approval_id = APPROVAL_ID.findall(recv_until(ws, 'data-status="pending"'))[-1]
        read0 = self.read() if self.read else None
        cpu0 = self._cpu()
        t0 = time.perf_counter()
        response = self.decide(approval_id)
        tp = time.perf_counter()
        recv_until(ws, "data-tool-result=")
        t1 = time.perf_counter()
        cpu1 = self._cpu()
        read = (read0, self.read()) if self.read else None
        assert response.status_code == 200, response.text
        recv_until(ws, 'data-running="false"')
        self.done += 1
        return Trip(
            t1 - t0, tp - t0, cpu1 - cpu0, t0 - launch0, cpu0 - launch_cpu0, sent=t0, read=read
        )

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
            self.ws = None


class OriginCycles:
    """The same round trip against the origin's architecture: SSE out, POST in."""

    def __init__(self, *, server, cpu_pid: int | None = None) -> None:
        import httpx

        self.cpu_pid, self.done = cpu_pid, 0
        self.stream_client = httpx.Client(base_url=server.url, timeout=20)
        self.post_client = httpx.Client(base_url=server.url, timeout=20)

    def one(self) -> Trip:
        i, cpu_pid = self.done, self.cpu_pid
        with self.stream_client.stream("POST", "/chat", json={"message": f"echo {i}"}) as response:
            events = (
                json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")
            )
            start = next(events)
            assert start["type"] == "tool_start", start
            cpu0 = cpu_seconds(cpu_pid) if cpu_pid else 0.0
            t0 = time.perf_counter()
            decided = self.post_client.post(f"/approvals/{start['approval_id']}/decide/")
            tp = time.perf_counter()
            end = next(events)
            t1 = time.perf_counter()
            cpu1 = cpu_seconds(cpu_pid) if cpu_pid else 0.0
            assert decided.status_code == 200 and end == {"type": "tool_end", "result": f"echo {i}"}
            assert next(events)["type"] == "done"
        self.done += 1
        return Trip(t1 - t0, tp - t0, cpu1 - cpu0)

    def close(self) -> None:
        self.stream_client.close()
        self.post_client.close()


def interleaved(cycles: dict, *, count: int, warmup: int) -> dict[str, RoundTrips]:
    """One approval on each system in turn, the order rotated every approval.

    Each system meets the machine's moment as the others do: on these shared
    machines a system's median drifts by a third between runs minutes apart,
    and approvals a few milliseconds apart drift together.
    """
    names = list(cycles)
    results = {name: RoundTrips() for name in names}
    for i in range(warmup + count):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            trip = cycles[name].one()
            if i >= warmup:
                results[name].add(trip)
    return results


def round_trips(
    *,
    ws_server,
    user,
    session: str,
    decide: Callable[[str], object],
    count: int,
    warmup: int,
    per_conversation: int = 50,
    cpu_pid: int | None = None,
) -> RoundTrips:
    """``count`` sequential approvals on one server (see ``SocketCycles``)."""
    cycles = SocketCycles(
        ws_server=ws_server,
        user=user,
        session=session,
        decide=decide,
        per_conversation=per_conversation,
        cpu_pid=cpu_pid,
    )
    try:
        return interleaved({"one": cycles}, count=count, warmup=warmup)["one"]
    finally:
        cycles.close()


@dataclass
class Figures:
    """One system's figures over several alternating rounds."""

    name: str
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def add(self, latencies: list[float], cpu: list[float] | None = None) -> None:
        self.p50.append(statistics.median(latencies))
        self.p99.append(percentile(latencies, 99))
        if cpu:
            self.cpu.append(statistics.fmean(cpu))

    @property
    def median_p50(self) -> float:
        return statistics.median(self.p50)

    @property
    def median_p99(self) -> float:
        return statistics.median(self.p99)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu) if self.cpu else float("nan")

    def line(self) -> str:
        cpu = f"  CPU/approval {self.median_cpu * 1000:6.2f} ms" if self.cpu else ""
        rounds = ", ".join(f"{v * 1000:.2f}" for v in self.p50)
        return (
            f"{self.name:<34} p50 {self.median_p50 * 1000:6.2f} ms  "
            f"p99 {self.median_p99 * 1000:6.2f} ms{cpu}   (p50 per round: {rounds})"
        )


def peer_env() -> dict[str, str]:
    """The environment of a peer server: ours, minus Studio's settings module."""
    env = server_env()
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env
