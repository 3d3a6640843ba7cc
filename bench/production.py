"""Benchmark: the production shape (issue 36).

Debian's nginx running ``deploy/nginx-site.conf`` (plain HTTP here, for
both systems alike: TLS is nginx's cost, not theirs) in front of two
daphne processes (``--processes``) on PostgreSQL and Redis. 100 members
each have a socket open; 2,000 calls wait; then decisions arrive at a
steady rate (20/s for 60 s by default) while 10 chats stream, and the
processes are restarted, one after the other, in the middle. Each decision
is timed from its POST to its tool's result on its member's socket.
Reported: p50 and p99, errors, lost calls (decided but never finished with
their own output), server and PostgreSQL CPU per decision, and the
streams' rate. Then the minimal Channels peer behind the same nginx takes
the same rate of approvals (a card, then its decision: it keeps nothing
that could wait long or outlive a restart).

    .venv/bin/python bench/production.py --waiting 2000 --rate 20 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import httpx

from deploy.cluster import DaphneProcess, free_port
from deploy.proxy import LocalNginx

RESULT = "data-tool-result="
STREAM_TOKENS = 500  # each streamed reply: 5 s at 100 tok/s
# A restart as deploy/systemd does it: SIGKILL only after the unit's
# TimeoutStopSec, and the next process only once this one has answered for a
# few seconds (a request its restart refused has been retried on the other by then).
STOP_TIMEOUT = 40
SETTLE_SECONDS = 5


class Fleet:
    """The daphne processes behind nginx, restartable on their ports; their CPU."""

    def __init__(self, env: dict, ports: list[int], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.servers = [self._start(port, n) for n, port in enumerate(ports)]
        self.cpu_spent = 0.0  # by the processes stopped so far
        self.restart_started, self.restart_ended = float("inf"), float("-inf")
        self.events: list[tuple[str, float]] = []  # the restart's steps (monotonic), for --dump
        self.marks = {s.pid: harness.cpu_seconds(s.pid) for s in self.servers}

    def _start(self, port: int, n: int) -> DaphneProcess:
        log = self.logs / f".bench-production-{n}.log"
        return DaphneProcess(
            env=self.env, app="bench.asgi:application", port=port, log_path=log
        ).start(timeout=60)

    def mark(self) -> None:
        self.cpu_spent = 0.0
        self.marks = {s.pid: harness.cpu_seconds(s.pid) for s in self.servers}

    def cpu(self) -> float:
        return self.cpu_spent + sum(
            harness.cpu_seconds(s.pid) - self.marks.get(s.pid, 0.0) for s in self.servers
        )

    def rolling_restart(self) -> float:
        started = self.restart_started = time.monotonic()
        for n, server in enumerate(list(self.servers)):
            if n:
                time.sleep(SETTLE_SECONDS)
            self.cpu_spent += harness.cpu_seconds(server.pid) - self.marks.get(server.pid, 0.0)
            self.events.append((f"stop {n}", time.monotonic()))
            server.stop(timeout=STOP_TIMEOUT)
            self.events.append((f"stopped {n}", time.monotonic()))
            successor = self._start(server.port, n)
            self.events.append((f"answering {n}", time.monotonic()))
            self.marks[successor.pid] = harness.cpu_seconds(successor.pid)
            self.servers[n] = successor
        self.restart_ended = time.monotonic()
        return time.monotonic() - started

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


async def open_socket(proxy, session: str, conversation_id: int, deadline: float):
    """A member's socket on a conversation through nginx (retried while a process restarts)."""
    from websockets.asyncio.client import connect

    while True:
        try:
            ws = await connect(
                f"{proxy.ws_url}/ws/c/{conversation_id}/",
                additional_headers={"Cookie": f"sessionid={session}", "Origin": proxy.url},
                ssl=proxy.ssl,
                max_size=None,
            )
            first = await asyncio.wait_for(ws.recv(), 10)
            return ws, first
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def until(ws, needle: str, timeout: float) -> str:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        frame = await asyncio.wait_for(ws.recv(), max(0.001, end - loop.time()))
        if needle in frame:
            return frame


class Load:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.sent: list[float] = []  # when each timed decision was sent (monotonic)
        self.answered: list[float] = []  # each timed decision's POST response time
        self.caught_up: list[float] = []  # POST -> result, seen only after a reconnect
        self.errors: list[str] = []
        self.decided: list[int] = []  # conversation ids whose decision got a 200
        self.tokens = 0
        self.stream_seconds = 0.0


async def decisions(
    proxy, members, first_sockets, approvals, args, load: Load, stop_at: float
) -> None:
    """Decisions at ``args.rate`` per second, each on a conversation whose member
    has its socket open on it (``first_sockets``: each member's first, open already)."""
    tickets: asyncio.Queue = asyncio.Queue()

    async def pace() -> None:
        start = time.monotonic()
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            await asyncio.sleep(max(0.0, start + n / args.rate - time.monotonic()))
            tickets.put_nowait(n)
        for _ in members:
            tickets.put_nowait(None)

    async def member(session: str, csrf: str, conversations: list[int], ws) -> None:
        headers = {**harness.member_headers(session, csrf), "Origin": proxy.url}
        async with httpx.AsyncClient(base_url=proxy.url, verify=proxy.ssl, timeout=30) as http:
            for n, cid in enumerate(conversations):
                if n:
                    ws, _ = await open_socket(proxy, session, cid, stop_at + 60)
                try:
                    if await tickets.get() is None:
                        return
                    t0 = time.perf_counter()
                    try:
                        reply = await http.post(
                            f"/approvals/{approvals[cid]}/decide/",
                            data={"decision": "allow"},
                            headers=headers,
                        )
                    except httpx.HTTPError as exc:
                        load.errors.append(f"POST {type(exc).__name__}")
                        continue
                    if reply.status_code != 200:
                        load.errors.append(f"POST {reply.status_code}")
                        continue
                    load.decided.append(cid)
                    answered = time.perf_counter() - t0
                    try:
                        await until(ws, RESULT, 20)
                        load.latencies.append(time.perf_counter() - t0)
                        load.sent.append(time.monotonic())
                        load.answered.append(answered)
                    except Exception:
                        # The socket's process stopped. As the page does
                        # (studio.js), come back once, at a random moment
                        # within 0.5 to 3 s, and stay: the catch-up, or a
                        # fragment after it, shows the result.
                        await ws.close()
                        await asyncio.sleep(0.5 + random.random() * 2.5)
                        ws, first = await open_socket(proxy, session, cid, stop_at + 60)
                        try:
                            if RESULT not in first:
                                await until(ws, RESULT, 30)
                            load.caught_up.append(time.perf_counter() - t0)
                        except Exception:
                            load.errors.append("no result after a reconnect")
                finally:
                    await ws.close()

    tasks = [asyncio.create_task(pace())]
    tasks += [
        asyncio.create_task(member(*m, ws)) for m, ws in zip(members, first_sockets, strict=True)
    ]
    await asyncio.gather(*tasks)


async def streams(proxy, chats, load: Load, stop_at: float, pace: float) -> None:
    """Each chat keeps its socket open and asks for the next reply as one ends, as
    a member does. Their first replies start spread over one reply's length:
    chats that began together would end together, a burst no real site sees."""
    reply_seconds = STREAM_TOKENS / pace

    async def chat(n: int, session: str, cid: int) -> None:
        await asyncio.sleep(reply_seconds * n / len(chats))
        ws = None
        while time.monotonic() < stop_at:
            try:
                if ws is None:
                    ws, _ = await open_socket(proxy, session, cid, stop_at)
                await ws.send(harness.stream_request(STREAM_TOKENS, pace))
                t0, tokens = time.monotonic(), 0
                while True:
                    frame = await asyncio.wait_for(ws.recv(), 30)
                    if 'data-running="false"' in frame:
                        break
                    if '-body">' in frame:
                        tokens += frame.count("tok")
                load.tokens += tokens
                load.stream_seconds += time.monotonic() - t0
            except Exception:
                ws = None
                await asyncio.sleep(0.2)  # a restart cut it: the next reply, on a new socket
        if ws is not None:
            await ws.close()

    await asyncio.gather(*(chat(n, s, c) for n, (s, c) in enumerate(chats)))


def park(proxy, sessions_and_cids: list[tuple[str, int]]) -> None:
    """Each conversation's member sends its message over its socket, 8 at a time,
    until its card is out."""

    async def all_of_them() -> None:
        limit = asyncio.Semaphore(8)

        async def one(session: str, cid: int) -> None:
            async with limit:
                ws, _ = await open_socket(proxy, session, cid, time.monotonic() + 60)
                await ws.send(f'{{"message": "echo out-{cid}"}}')
                await until(ws, 'data-status="pending"', 30)
                await ws.close()

        await asyncio.gather(*(one(session, cid) for session, cid in sessions_and_cids))

    asyncio.run(all_of_them())


def csrf_for(proxy, session: str) -> str:
    with httpx.Client(base_url=proxy.url, verify=proxy.ssl, cookies={"sessionid": session}) as h:
        h.get("/")
        return h.cookies["csrftoken"]


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (gunicorn's workers)."""
    total = harness.cpu_seconds(pid)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            total += harness.cpu_seconds(int(stat.parent.name))
    return total


class PostgresCpu:
    """CPU seconds of the PostgreSQL processes from ``start`` to ``stop``, read
    every half second: a backend that exits (its server process restarted)
    keeps what it had spent by its last reading; one that starts counts whole."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _read(self) -> None:
        for comm in Path("/proc").glob("[0-9]*/comm"):
            try:
                if comm.read_text().strip() == "postgres":
                    self.last[int(comm.parent.name)] = harness.cpu_seconds(int(comm.parent.name))
            except (OSError, ValueError):
                continue  # exited meanwhile

    def _watch(self) -> None:
        while not self.done.wait(0.5):
            self._read()

    def start(self) -> None:
        self._read()
        self.first = dict(self.last)
        self.thread.start()

    def stop(self) -> float:
        self.done.set()
        self.thread.join()
        self._read()
        return sum(seconds - self.first.get(pid, 0.0) for pid, seconds in self.last.items())


def studio(args, work: Path, layout: str) -> dict:
    from django.db import connection

    from approvals.models import ToolApproval
    from chat.models import Message, Run

    ToolApproval.objects.all().delete()
    Run.objects.all().delete()
    static = work / "static"
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=harness.ROOT, env=harness.server_env(STUDIO_STATIC_ROOT=str(static)), check=True,
    )  # fmt: skip
    collections = work / f"gc-{layout}"
    collections.mkdir()
    env = harness.server_env(
        STUDIO_HTTPS="True", STUDIO_APPROVAL_POLL_SECONDS="1", STUDIO_SHUTDOWN_GRACE_SECONDS="10",
        # bench/gcprobe times each process's garbage collections.
        PYTHONPATH=f"{harness.ROOT}:{harness.ROOT / 'bench' / 'gcprobe'}",
        STUDIO_BENCH_GC_DIR=str(collections),
    )  # fmt: skip
    fleet = Fleet(env, [free_port() for _ in range(args.processes)], harness.ROOT / "bench")
    wsgi = None
    if layout == "wsgi":
        wsgi = DaphneProcess(
            env=env, app="bench.wsgi:application", server="gunicorn",
            log_path=harness.ROOT / "bench" / ".bench-production-wsgi.log",
        ).start(timeout=60)  # fmt: skip
    prefix = work / f"nginx-{layout}"
    prefix.mkdir()
    proxy = LocalNginx(
        prefix,
        [s.port for s in fleet.servers],
        static,
        tls=False,
        http_upstreams=[wsgi.port] if wsgi else None,
    ).start()
    try:
        people = [
            harness.make_member(f"{layout}-member{n}") for n in range(args.members + args.streams)
        ]
        csrfs = [csrf_for(proxy, session) for _, session in people]
        deciders = people[: args.members]
        per = args.waiting // args.members
        plan = [
            (n, harness.make_conversation(u).pk)
            for n, (u, _) in enumerate(deciders)
            for _ in range(per)
        ]
        t0 = time.monotonic()
        park(proxy, [(deciders[n][1], cid) for n, cid in plan])
        waiting = Run.objects.filter(status="running", owner="").exclude(waiting_on="")
        while waiting.count() < len(plan):
            time.sleep(0.2)
        park_s = time.monotonic() - t0
        # What autovacuum does within a minute of the rows arriving. This
        # machine's PostgreSQL runs without it, and plans made from the empty
        # tables' statistics walked every waiting call for each member's count.
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
        approvals = dict(
            ToolApproval.objects.pending().values_list("conversation_id", "approval_id")
        )
        members = [
            (deciders[n][1], csrfs[n], [cid for m, cid in plan if m == n])
            for n in range(len(deciders))
        ]
        chats = [(s, harness.make_conversation(u).pk) for u, s in people[args.members :]]
        load = Load()
        restart = {}

        def restart_later() -> None:
            time.sleep(args.seconds / 2)
            if not args.no_restart:
                restart["seconds"] = fleet.rolling_restart()

        timing: dict[str, float] = {}
        database = PostgresCpu()
        restarter = threading.Thread(target=restart_later)

        async def run() -> None:
            # The members' sockets are open before the first decision: the
            # timed window does not start with 100 handshakes at once.
            first = await asyncio.gather(
                *(open_socket(proxy, s, cids[0], time.monotonic() + 60) for s, _, cids in members)
            )
            fleet.mark()
            timing["wsgi_cpu0"] = tree_cpu(wsgi.pid) if wsgi else 0.0
            database.start()
            timing["started"] = time.monotonic()
            stop_at = timing["started"] + args.seconds
            restarter.start()
            await asyncio.gather(
                decisions(proxy, members, [ws for ws, _ in first], approvals, args, load, stop_at),
                streams(proxy, chats, load, stop_at, args.stream_pace),
            )

        asyncio.run(run())
        restarter.join()
        started = timing["started"]
        wsgi_cpu0 = timing["wsgi_cpu0"]
        cpu = fleet.cpu() + (tree_cpu(wsgi.pid) - wsgi_cpu0 if wsgi else 0.0)
        database_cpu = database.stop()
        window = time.monotonic() - started
        # Lost: decided, and never finished with its own output.
        deadline = time.monotonic() + 60
        done = Run.objects.filter(status="done", conversation_id__in=load.decided)
        while done.count() < len(load.decided) and time.monotonic() < deadline:
            time.sleep(0.5)
        outputs = dict(
            Message.objects.filter(role="tool", conversation_id__in=load.decided).values_list(
                "conversation_id", "content"
            )
        )
        lost = sum(outputs.get(cid) != f"out-{cid}" for cid in load.decided)
        twice = Message.objects.filter(role="tool", conversation_id__in=load.decided).count() - len(
            outputs
        )
        # The steady part: decisions sent before the restart began, or once it
        # had ended and the sockets had come back (5 s).
        steady = [
            n
            for n, (latency, sent) in enumerate(zip(load.latencies, load.sent, strict=True))
            if sent - latency < fleet.restart_started or sent - latency > fleet.restart_ended + 5
        ]
        result = {
            "quiet": [load.latencies[n] for n in steady],
            "quiet_answers": [load.answered[n] for n in steady],
            "park_s": park_s,
            "load": load,
            "cpu": cpu,
            "database_cpu": database_cpu,
            "window": window,
            "lost": lost,
            "twice": twice,
            "restart": restart.get("seconds"),
            "restart_events": fleet.events,
        }
    finally:
        proxy.stop()
        fleet.stop()
        if wsgi is not None:
            wsgi.stop()
    # Each process wrote its collections as it exited.
    result["collections"] = collections_in(collections, started, started + window)
    return result


def collections_in(directory: Path, start: float, end: float) -> dict[int, list[float]]:
    """The seconds of each collection that ended between ``start`` and ``end``
    (monotonic), every server process's, by generation."""
    found: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for path in directory.glob("*.json"):
        for generation, seconds, ended in json.loads(path.read_text()):
            if start <= ended <= end:
                found[generation].append(seconds)
    return found


def peer(args, work: Path) -> dict:
    server = DaphneProcess(
        env=harness.peer_env(), app="bench.peers.channels_peer:application"
    ).start()
    prefix = work / "nginx-peer"
    prefix.mkdir()
    proxy = LocalNginx(prefix, [server.port], work / "static", tls=False).start()
    user, session = harness.make_member("peer-member")
    http = httpx.Client(base_url=proxy.url, verify=proxy.ssl, timeout=30)
    cycles = harness.SocketCycles(
        ws_server=PeerAddress(proxy),
        user=user,
        session=session,
        decide=lambda approval_id: http.post(f"/approvals/{approval_id}/decide/"),
        cpu_pid=server.pid,
    )
    latencies, cpu = [], []
    try:
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < args.seconds:
            n += 1
            time.sleep(max(0.0, start + n / args.rate - time.monotonic()))
            trip = cycles.one()
            latencies.append(trip.total)
            cpu.append(trip.cpu)
    finally:
        cycles.close()
        http.close()
        proxy.stop()
        server.stop()
    return {"latencies": latencies, "cpu": statistics.median(cpu)}


class PeerAddress:
    """The proxy as SocketCycles reaches a server (sync websockets: TLS context too)."""

    def __init__(self, proxy) -> None:
        self.url, self.ws_url = proxy.url, proxy.ws_url


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiting", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=2, help="daphne processes")
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--stream-pace", type=float, default=100, help="each stream's tokens/s")
    parser.add_argument("--rate", type=float, default=20, help="decisions per second")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--no-restart", action="store_true", help="the steady state alone")
    parser.add_argument("--dump", type=Path, help="write each decision's timings here (JSON)")
    parser.add_argument(
        "--layouts", nargs="+", default=["daphne", "wsgi"], choices=["daphne", "wsgi"]
    )
    args = parser.parse_args()
    subprocess.run(["redis-cli", "-n", "5", "flushdb"], check=True, capture_output=True)
    harness.setup_django(harness.POSTGRES_URL, harness.REDIS_URL)
    with tempfile.TemporaryDirectory(prefix="studio-production-") as tmp:
        work = Path(tmp)
        runs = {layout: studio(args, work, layout) for layout in args.layouts}
        p = None if args.no_peer else peer(args, work)
    for layout, s in runs.items():
        report(args, layout, s)
    if args.dump:
        args.dump.write_text(
            json.dumps(
                {
                    layout: {
                        "sent": s["load"].sent,
                        "latency": s["load"].latencies,
                        "answered": s["load"].answered,
                        "restart": s["restart_events"],
                    }
                    for layout, s in runs.items()
                }
            )
        )
    if p is not None:
        print(
            f"Channels peer behind the same nginx, one process, {args.rate:g} approvals/s: "
            f"{harness.summary_ms(p['latencies'])}, CPU {p['cpu'] * 1000:.2f} ms per approval"
        )


def report(args, layout: str, s: dict) -> None:
    load: Load = s["load"]
    total = len(load.latencies)
    shape = (
        f"{args.processes} daphne"
        if layout == "daphne"
        else f"gunicorn (4 workers) for HTTP + {args.processes} daphne for sockets"
    )
    print(
        f"Studio, {shape}, behind nginx, PostgreSQL + Redis; {args.waiting} calls waiting "
        f"(started in {s['park_s']:.0f} s), {args.members} members' sockets, {args.streams} "
        f"chats streaming at {args.stream_pace:g} tok/s each; rolling restart of each "
        f"process in the middle ({s['restart'] or 0:.1f} s)"
    )
    print(
        f"  decisions: {len(load.decided)} in {s['window']:.0f} s; POST -> result on the socket "
        f"{harness.summary_ms(load.latencies)} ({total} on the socket it was decided on); "
        f"errors {len(load.errors)} {sorted(set(load.errors))}; lost {s['lost']}; "
        f"run twice {s['twice']}"
    )
    if load.caught_up:
        print(
            "  seen only after the tab's reconnect (its process stopped; the page comes back "
            f"within 0.5 to 3 s): {harness.summary_ms(load.caught_up)}"
        )
    print(f"  outside the restart (and 5 s after it): {harness.summary_ms(s['quiet'])}")
    print(f"    of which the POST's own response: {harness.summary_ms(s['quiet_answers'])}")
    young = s["collections"][0] + s["collections"][1]
    full = s["collections"][2]
    print(
        f"  garbage collections in the timed window (every server process): "
        f"{len(young)} young ({sum(young) * 1000:.0f} ms in all, the longest "
        f"{max(young, default=0) * 1000:.1f} ms); {len(full)} full ({sum(full) * 1000:.0f} ms "
        f"in all, the longest {max(full, default=0) * 1000:.0f} ms)"
    )
    print(
        f"  server CPU per decision (every process, streams included): "
        f"{s['cpu'] / max(1, len(load.decided)) * 1000:.1f} ms, PostgreSQL's "
        f"{s['database_cpu'] / max(1, len(load.decided)) * 1000:.1f} ms; streams delivered "
        f"{load.tokens / max(load.stream_seconds, 1e-9):.0f} tok/s per chat"
    )


if __name__ == "__main__":
    main()
