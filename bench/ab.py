"""Benchmark: one change, A/B. The same measure served from two checkouts, in one invocation.

On these shared machines a peer's median moves by a third between runs, so a
change is measured against its parent in alternating rounds of one
invocation: each round starts daphne from checkout A or B (a git worktree),
both on the same fresh SQLite database. The schema must be the same in both.

* ``post``: sequential decision POSTs, no run waiting (as ``decision_post.py``);
* ``rt``: the approval round trip, POST sent -> tool result (as ``roundtrip.py``),
  and the launch before it, message sent -> pending card; ``--tabs N`` holds N
  idle chat tabs of another member open meanwhile, ``--streams N`` (with
  ``--interleave``) N chats of the member streaming replies on each server;
* ``open``: a member's tab opening on one of their 20 chats that wait on a
  card, from the handshake to the catch-up, then closed (what each decision
  in ``production.py`` costs besides itself); always interleaved;
* ``first``: what a member meets on a process that has just started (a
  deploy's): its first chat page, then that tab's socket caught up, on a
  chat that waits on a card; both checkouts' servers started fresh each
  round, ``--n`` rounds' worth of starts per round;
* ``stream``: 10 chats of one member streaming a reply at once (300 tokens
  at 100 tok/s each), ``--n`` bursts per round on each checkout in turn:
  printed as p50 when the median reply ended, p99 when the last one did,
  CPU the server's per fragment delivered; always interleaved.

Prints each side's medians over rounds (p50, p99, server CPU per POST or
approval from its CPU clock) and B/A. ``--interleave``: each round starts both
checkouts' servers at once and takes one POST or approval on each in turn
(the order swapped every time), so A and B meet the same moments of the
machine; it also prints the median of the rounds' own B/A.

    git worktree add ../before HEAD~1
    .venv/bin/python bench/ab.py post --a ../before --b . --rounds 6 --n 400
    .venv/bin/python bench/ab.py rt --a ../before --b . --rounds 4 --n 200 --tabs 1000
    .venv/bin/python bench/ab.py rt --a ../before --b . --rounds 4 --n 250 --interleave
    .venv/bin/python bench/ab.py rt --a ../before --b . --rounds 3 --n 200 --interleave --streams 10
    .venv/bin/python bench/ab.py post --a ../before --b . --rounds 4 --n 400 --interleave
    .venv/bin/python bench/ab.py open --a ../before --b . --rounds 4 --n 300
    .venv/bin/python bench/ab.py stream --a ../before --b . --rounds 3 --n 6
    .venv/bin/python bench/ab.py first --a ../before --b . --rounds 3 --n 10
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time
from pathlib import Path

import harness
import httpx

import deploy.cluster
from deploy.cluster import DaphneProcess


def start(root: Path) -> DaphneProcess:
    # daphne imports the application from its working directory.
    deploy.cluster.ROOT = root
    # Two servers share one SQLite database but not a channel layer: one's
    # sweep could resume a run the other just woke, and its result would
    # never reach the other's socket.
    env = harness.server_env(PYTHONPATH=str(root), STUDIO_APPROVAL_POLL_SECONDS="3600")
    return DaphneProcess(env=env, app="bench.asgi:application").start()


def member(root: Path) -> tuple[object, str]:
    """A user and a session that ``root``'s settings accept (its own login backend)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_user(f"ab{time.monotonic_ns()}", password="ab-pw-123")
    settings_text = (root / "studio" / "settings.py").read_text()
    backend = None  # this checkout's first backend that loads users
    if "studio.auth.MemberBackend" not in settings_text:
        backend = "django.contrib.auth.backends.ModelBackend"
    client = Client()
    client.force_login(user, backend=backend)
    return user, client.cookies["sessionid"].value


def served(root: Path, servers: list[DaphneProcess]) -> tuple[DaphneProcess, object, str]:
    """A new member of ``root``'s and its server, started (``servers``: to stop it later)."""
    user, session = member(root)
    server = start(root)
    servers.append(server)
    return server, user, session


def post_round(root: Path, n: int, warmup: int = 30) -> tuple[float, float, float]:
    user, session = member(root)
    rows = harness.make_pending(user, harness.make_conversation(user), n + warmup)
    server = start(root)
    latencies, cpu0 = [], 0.0
    with httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10) as http:
        allow = harness.member_allow(http)
        for i, row in enumerate(rows):
            if i == warmup:
                cpu0 = harness.cpu_seconds(server.pid)
            t0 = time.perf_counter()
            response = allow(row.approval_id)
            if i >= warmup:
                latencies.append(time.perf_counter() - t0)
            assert response.status_code == 200, response.text
        cpu = (harness.cpu_seconds(server.pid) - cpu0) / n
    server.stop()
    return statistics.median(latencies), harness.percentile(latencies, 99), cpu


def post_round_interleaved(
    roots: tuple[Path, Path], n: int, warmup: int = 30
) -> dict[Path, tuple[float, float, float]]:
    """Both checkouts' servers up at once, one POST on each in turn."""
    servers, clients, allows = [], [], {}
    try:
        for root in roots:
            user, session = member(root)
            rows = harness.make_pending(user, harness.make_conversation(user), n + warmup)
            server = start(root)
            servers.append(server)
            http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10)
            clients.append(http)
            allows[root] = (harness.member_allow(http), rows, server.pid)
        latencies = {root: [] for root in roots}
        cpu = dict.fromkeys(roots, 0.0)
        for i in range(n + warmup):
            for root in roots if i % 2 == 0 else roots[::-1]:
                allow, rows, pid = allows[root]
                cpu0 = harness.cpu_seconds(pid)
                t0 = time.perf_counter()
                response = allow(rows[i].approval_id)
                elapsed = time.perf_counter() - t0
                assert response.status_code == 200, response.text
                if i >= warmup:
                    latencies[root].append(elapsed)
                    cpu[root] += harness.cpu_seconds(pid) - cpu0
    finally:
        for http in clients:
            http.close()
        for server in servers:
            server.stop()
    return {
        root: (statistics.median(v), harness.percentile(v, 99), cpu[root] / n)
        for root, v in latencies.items()
    }


def rt_round(root: Path, n: int, tabs: int = 0) -> tuple[float, ...]:
    user, session = member(root)
    idle_user, idle_session = member(root)
    idle = [harness.make_conversation(idle_user, enabled_tools=[]).pk for _ in range(tabs)]
    server = start(root)
    http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10)
    try:
        with harness.IdleTabs(server, idle_session, idle):
            trips = harness.round_trips(
                ws_server=server,
                user=user,
                session=session,
                decide=harness.member_allow(http),
                count=n,
                warmup=20,
                cpu_pid=server.pid,
            )
    finally:
        http.close()
        server.stop()
    return _figures(trips)


def _figures(trips: harness.RoundTrips) -> tuple[float, ...]:
    total = trips.total
    return (
        statistics.median(total),
        harness.percentile(total, 99),
        statistics.fmean(trips.cpu),
        statistics.median(trips.launch),
        statistics.fmean(trips.launch_cpu),
    )


def rt_round_interleaved(
    roots: tuple[Path, Path], n: int, streams: int = 0
) -> dict[Path, tuple[float, ...]]:
    """Both checkouts' servers up at once, one approval on each in turn
    (``streams``: while that many chats stream on each)."""
    servers, clients, cycles = [], [], {}
    try:
        with contextlib.ExitStack() as chatting:
            for root in roots:
                server, user, session = served(root, servers)
                if streams:
                    chatting.enter_context(harness.Streams(server, user, session, streams))
                http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10)
                clients.append(http)
                cycles[root] = harness.SocketCycles(
                    ws_server=server,
                    user=user,
                    session=session,
                    decide=harness.member_allow(http),
                    cpu_pid=server.pid,
                )
            results = harness.interleaved(cycles, count=n, warmup=20)
    finally:
        for c in [*cycles.values(), *clients]:
            c.close()
        for server in servers:
            server.stop()
    return {root: _figures(trips) for root, trips in results.items()}


WAITING_CHATS = 20


def waiting_chats(server, user, session: str) -> list[int]:
    """The member's chats, each parked on a pending ``echo`` card through the socket."""
    return [chat for chat, _ in harness.parked_chats(server, user, session, WAITING_CHATS)]


def open_round_interleaved(roots: tuple[Path, Path], n: int, warmup: int = 20) -> dict:
    """Both checkouts' servers up at once, one tab opened on each in turn."""
    servers, tabs = [], {}
    try:
        for root in roots:
            server, user, session = served(root, servers)
            tabs[root] = (server, session, waiting_chats(server, user, session))
        figures = {root: ([], []) for root in roots}
        for i in range(n + warmup):
            for root in roots if i % 2 == 0 else roots[::-1]:
                server, session, chats = tabs[root]
                cpu0 = harness.cpu_seconds(server.pid)
                t0 = time.perf_counter()
                with harness.chat_socket(server, session, chats[i % len(chats)]) as ws:
                    harness.recv_until(ws, 'data-status="pending"')
                    elapsed = time.perf_counter() - t0
                if i >= warmup:
                    figures[root][0].append(elapsed)
                    figures[root][1].append(harness.cpu_seconds(server.pid) - cpu0)
    finally:
        for server in servers:
            server.stop()
    return _tab_figures(figures)


def _tab_figures(figures: dict) -> dict:
    """Each checkout's (p50, p99, mean CPU) from its (times, CPU) lists."""
    return {
        root: (statistics.median(t), harness.percentile(t, 99), statistics.fmean(cpu))
        for root, (t, cpu) in figures.items()
    }


def first_round_interleaved(roots: tuple[Path, Path], n: int) -> dict:
    """``n`` times: both checkouts' servers started fresh at once, then on each
    in turn (the order swapped every time) a chat page and its socket's catch-up.
    CPU: the server's from its start to the tab's catch-up."""
    parking = start(roots[0])
    try:
        user, session = member(roots[0])
        chats = waiting_chats(parking, user, session)
    finally:
        parking.stop()
    figures = {root: ([], []) for root in roots}
    for i in range(n):
        servers = [start(root) for root in roots]
        try:
            order = list(zip(roots, servers, strict=True))
            for root, server in order if i % 2 == 0 else order[::-1]:
                cid = chats[i % len(chats)]
                t0 = time.perf_counter()
                with httpx.Client(base_url=server.url, cookies={"sessionid": session}) as http:
                    assert http.get(f"/c/{cid}/").status_code == 200
                with harness.chat_socket(server, session, cid) as ws:
                    harness.recv_until(ws, 'data-status="pending"')
                figures[root][0].append(time.perf_counter() - t0)
                figures[root][1].append(harness.cpu_seconds(server.pid))
        finally:
            for server in servers:
                server.stop()
    return _tab_figures(figures)


STREAM_CHATS = 10


def stream_round_interleaved(
    roots: tuple[Path, Path], n: int, tokens: int = 300, pace: float = 100
) -> dict:
    """Both checkouts' servers up at once; ``n`` bursts on each in turn, each
    burst ``STREAM_CHATS`` chats streaming ``tokens`` tokens at ``pace`` tok/s."""
    servers, chats = [], {}
    try:
        for root in roots:
            server, user, session = served(root, servers)
            chats[root] = (
                server,
                [harness.open_chat(server, user, session) for _ in range(STREAM_CHATS)],
            )
        figures = {root: ([], [], []) for root in roots}
        for i in range(n + 1):
            for root in roots if i % 2 == 0 else roots[::-1]:
                server, sockets = chats[root]
                cpu0 = harness.cpu_seconds(server.pid)
                t0 = time.perf_counter()
                for ws in sockets:
                    ws.send(harness.stream_request(tokens, pace))
                ends, frames = [], 0
                for ws in sockets:
                    while 'data-running="false"' not in ws.recv(timeout=60):
                        frames += 1
                    ends.append(time.perf_counter() - t0)
                cpu = harness.cpu_seconds(server.pid) - cpu0
                if i:  # the first burst warms up
                    figures[root][0].append(statistics.median(ends))
                    figures[root][1].append(max(ends))
                    figures[root][2].append(cpu / frames)
    finally:
        for _, sockets in chats.values():
            for ws in sockets:
                ws.close()
        for server in servers:
            server.stop()
    return {
        root: (statistics.median(a), statistics.median(b), statistics.median(c))
        for root, (a, b, c) in figures.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("post", "rt", "open", "stream", "first"))
    parser.add_argument("--a", required=True, type=Path, help="checkout A (before)")
    parser.add_argument("--b", required=True, type=Path, help="checkout B (after)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--n", type=int, default=400, help="POSTs, approvals or tabs per round")
    parser.add_argument("--tabs", type=int, default=0, help="rt: idle tabs of another member")
    parser.add_argument(
        "--streams", type=int, default=0, help="rt --interleave: chats streaming on each server"
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="A and B at once, one POST or approval each in turn",
    )
    args = parser.parse_args()
    if args.interleave and args.tabs:
        parser.error("--interleave is for runs without --tabs")
    if args.streams and not (args.kind == "rt" and args.interleave):
        parser.error("--streams is for rt --interleave")
    roots = (args.a.resolve(), args.b.resolve())
    harness.setup_django(f"sqlite:///{harness.ROOT / 'bench' / '.bench-ab.sqlite3'}")
    if args.kind == "post":
        measure = post_round
    else:
        measure = functools.partial(rt_round, tabs=args.tabs)
    results: dict[Path, list[tuple[float, float, float]]] = {root: [] for root in roots}
    both_at_once = {
        "post": post_round_interleaved,
        "rt": functools.partial(rt_round_interleaved, streams=args.streams),
        "open": open_round_interleaved,
        "stream": stream_round_interleaved,
        "first": first_round_interleaved,
    }
    for r in range(args.rounds):
        if args.interleave or args.kind in ("open", "stream", "first"):
            both = both_at_once[args.kind]
            for root, figures in both(roots, args.n).items():
                results[root].append(figures)
            continue
        for root in roots if r % 2 == 0 else roots[::-1]:
            results[root].append(measure(root, args.n))
    medians = {}
    for label, root in zip("AB", roots, strict=True):
        rounds = results[root]
        medians[label] = [statistics.median(x[i] for x in rounds) for i in range(len(rounds[0]))]
        p50, p99, cpu = medians[label][:3]
        per_round = " ".join(f"{x[0] * 1000:.1f}" for x in rounds)
        print(
            f"{label} {root}: p50 {p50 * 1000:.2f} ms  p99 {p99 * 1000:.2f} ms  "
            f"CPU {cpu * 1000:.2f} ms   (p50 per round: {per_round})"
        )
        if len(medians[label]) > 3:  # rt: the launch too
            launch, launch_cpu = medians[label][3:]
            print(f"  launch (message -> pending card): p50 {launch * 1000:.2f} ms  "
                  f"CPU {launch_cpu * 1000:.2f} ms")  # fmt: skip
    a, b = medians["A"], medians["B"]
    print(f"B/A: p50 {b[0] / a[0]:.2f}x  CPU {b[2] / a[2]:.2f}x")
    ra, rb = results[roots[0]], results[roots[1]]
    p50s = [y[0] / x[0] for x, y in zip(ra, rb, strict=True)]
    cpus = [y[2] / x[2] for x, y in zip(ra, rb, strict=True)]
    print(
        f"the rounds' own B/A: p50 {' '.join(f'{v:.2f}' for v in p50s)} "
        f"(median {statistics.median(p50s):.2f}x); CPU {' '.join(f'{v:.2f}' for v in cpus)} "
        f"(median {statistics.median(cpus):.2f}x)"
    )
    if len(a) > 3:
        print(f"B/A launch: p50 {b[3] / a[3]:.2f}x  CPU {b[4] / a[4]:.2f}x")


if __name__ == "__main__":
    main()
