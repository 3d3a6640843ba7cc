"""Benchmark: the approval round trip, Studio beside its peers (one process each).

From sending the decision POST to receiving the tool's result on the
client's stream, for N sequential approvals, and the server's CPU in that
window. Studio (SQLite + in-memory layer, DEBUG off) does everything a
decision does: login, CSRF, the audit row written before the tool runs,
first decision wins, every tab updated. The peers:

* Django Channels + daphne, minimal (bench/peers/channels_peer.py);
* the origin's architecture, FastAPI + SSE + to_thread (bench/peers/origin_peer.py).

Rounds alternate between the systems; each figure is the median over rounds.
With ``--interleave`` every round starts the three servers at once and
takes one approval on each in turn (the order rotated every approval), so
the systems meet the same moments of a shared machine; it also prints the
median of the rounds' own ratios.

    .venv/bin/python bench/roundtrip.py --approvals 300 --rounds 3
    .venv/bin/python bench/roundtrip.py --approvals 300 --rounds 3 --interleave
"""

from __future__ import annotations

import argparse
import statistics

import harness
import httpx

from deploy.cluster import DaphneProcess


def studio_round(args) -> harness.RoundTrips:
    user, session = harness.make_member(f"bench{harness.time.monotonic_ns()}")
    server = DaphneProcess(
        env=harness.server_env(),
        app="bench.asgi:application",
        log_path=harness.ROOT / "bench" / ".bench-roundtrip.log",
    ).start()
    http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10)
    try:
        return harness.round_trips(
            ws_server=server,
            user=user,
            session=session,
            decide=harness.member_allow(http),
            count=args.approvals,
            warmup=args.warmup,
            per_conversation=args.per_conversation,
            cpu_pid=server.pid,
        )
    finally:
        http.close()
        server.stop()


def channels_round(args, user) -> harness.RoundTrips:
    server = DaphneProcess(env=harness.peer_env(), app="bench.peers.channels_peer:application")
    server.start()
    http = httpx.Client(base_url=server.url, timeout=10)
    try:
        return harness.round_trips(
            ws_server=server,
            user=user,
            session="",
            decide=lambda approval_id: http.post(
                f"/approvals/{approval_id}/decide/", data={"decision": "allow"}
            ),
            count=args.approvals,
            warmup=args.warmup,
            per_conversation=args.per_conversation,
            cpu_pid=server.pid,
        )
    finally:
        http.close()
        server.stop()


def origin_round(args) -> harness.RoundTrips:
    server = DaphneProcess(
        env=harness.peer_env(), app="bench.peers.origin_peer:app", server="uvicorn"
    ).start()
    try:
        return harness.origin_round_trips(
            server=server, count=args.approvals, warmup=args.warmup, cpu_pid=server.pid
        )
    finally:
        server.stop()


def interleaved_round(args, peer_user) -> dict[str, harness.RoundTrips]:
    """The three systems up at once, one approval on each in turn."""
    user, session = harness.make_member(f"bench{harness.time.monotonic_ns()}")
    studio = DaphneProcess(
        env=harness.server_env(),
        app="bench.asgi:application",
        log_path=harness.ROOT / "bench" / ".bench-roundtrip.log",
    )
    channels = DaphneProcess(env=harness.peer_env(), app="bench.peers.channels_peer:application")
    origin = DaphneProcess(
        env=harness.peer_env(), app="bench.peers.origin_peer:app", server="uvicorn"
    )
    servers = [studio, channels, origin]
    clients: list[httpx.Client] = []
    cycles: dict = {}
    try:
        for server in servers:
            server.start()
        studio_http = httpx.Client(base_url=studio.url, cookies={"sessionid": session}, timeout=10)
        channels_http = httpx.Client(base_url=channels.url, timeout=10)
        clients += [studio_http, channels_http]
        cycles["studio"] = harness.SocketCycles(
            ws_server=studio,
            user=user,
            session=session,
            decide=harness.member_allow(studio_http),
            per_conversation=args.per_conversation,
            cpu_pid=studio.pid,
        )
        cycles["channels"] = harness.SocketCycles(
            ws_server=channels,
            user=peer_user,
            session="",
            decide=lambda approval_id: channels_http.post(
                f"/approvals/{approval_id}/decide/", data={"decision": "allow"}
            ),
            per_conversation=args.per_conversation,
            cpu_pid=channels.pid,
        )
        cycles["origin"] = harness.OriginCycles(server=origin, cpu_pid=origin.pid)
        return harness.interleaved(cycles, count=args.approvals, warmup=args.warmup)
    finally:
        for c in [*cycles.values(), *clients]:
            c.close()
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--approvals", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--per-conversation", type=int, default=50)
    parser.add_argument(
        "--redis", default="", help="a Redis URL: Studio on the Redis layer instead of in-memory"
    )
    parser.add_argument(
        "--interleave", action="store_true", help="all systems at once, one approval each in turn"
    )
    args = parser.parse_args()

    database = f"sqlite:///{harness.ROOT / 'bench' / '.bench-roundtrip.sqlite3'}"
    harness.setup_django(database, args.redis)
    peer_user, _ = harness.make_member("peer")
    studio = harness.Figures("Studio")
    channels = harness.Figures("peer: Django Channels, minimal")
    origin = harness.Figures("peer: origin (FastAPI+SSE+to_thread)")
    studio_post = harness.Figures("Studio, the POST's own response")
    runs = [
        ("studio", lambda: studio_round(args)),
        ("channels", lambda: channels_round(args, peer_user)),
        ("origin", lambda: origin_round(args)),
    ]
    figures = {"studio": studio, "channels": channels, "origin": origin}
    for r in range(args.rounds):
        if args.interleave:
            results = interleaved_round(args, peer_user)
        else:
            order = runs[r % len(runs) :] + runs[: r % len(runs)]  # alternate who goes first
            results = {name: run() for name, run in order}
        for name, trips in results.items():
            figures[name].add(trips.total, trips.cpu)
        studio_post.add(results["studio"].post)
    how = "interleaved" if args.interleave else "alternating"
    print(
        f"approval round trip (decision POST sent -> tool result received), "
        f"{args.approvals} approvals x {args.rounds} {how} rounds, medians:"
    )
    for figures in (studio, studio_post, channels, origin):
        print("  " + figures.line())
    print(
        f"  ratio Studio / Channels peer: p50 {studio.median_p50 / channels.median_p50:.2f}x, "
        f"CPU {studio.median_cpu / channels.median_cpu:.2f}x;  "
        f"Studio / origin: p50 {studio.median_p50 / origin.median_p50:.2f}x"
    )
    p50s = [a / b for a, b in zip(studio.p50, channels.p50, strict=True)]
    cpus = [a / b for a, b in zip(studio.cpu, channels.cpu, strict=True)]
    print(
        f"  the rounds' own ratios Studio / Channels peer: p50 "
        f"{', '.join(f'{x:.2f}' for x in p50s)} (median {statistics.median(p50s):.2f}x); CPU "
        f"{', '.join(f'{x:.2f}' for x in cpus)} (median {statistics.median(cpus):.2f}x)"
    )
    print(f"  (CPU from /proc at {1000 / harness.CLK_TCK:.0f} ms ticks, averaged per approval)")


if __name__ == "__main__":
    main()
