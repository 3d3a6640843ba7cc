"""Benchmark: the approval round trip, Studio beside its peers (one process each).

From sending the decision POST to receiving the tool's result on the
client's stream, for N sequential approvals, and the server's CPU in that
window. Studio (SQLite + in-memory layer, DEBUG off) does everything a
decision does: login, CSRF, the audit row written before the tool runs,
first decision wins, every tab updated. The peers:

* Django Channels + daphne, minimal (bench/peers/channels_peer.py);
* the origin's architecture, FastAPI + SSE + to_thread (bench/peers/origin_peer.py).

Rounds alternate between the systems; each figure is the median over rounds.

    .venv/bin/python bench/roundtrip.py --approvals 300 --rounds 3
"""

from __future__ import annotations

import argparse

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--approvals", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--per-conversation", type=int, default=50)
    parser.add_argument(
        "--redis", default="", help="a Redis URL: Studio on the Redis layer instead of in-memory"
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
    for r in range(args.rounds):
        order = runs[r % len(runs) :] + runs[: r % len(runs)]  # alternate who goes first
        for name, run in order:
            trips = run()
            {"studio": studio, "channels": channels, "origin": origin}[name].add(
                trips.total, trips.cpu
            )
            if name == "studio":
                studio_post.add(trips.post)
    print(
        f"approval round trip (decision POST sent -> tool result received), "
        f"{args.approvals} approvals x {args.rounds} alternating rounds, medians:"
    )
    for figures in (studio, studio_post, channels, origin):
        print("  " + figures.line())
    print(
        f"  ratio Studio / Channels peer: p50 {studio.median_p50 / channels.median_p50:.2f}x, "
        f"CPU {studio.median_cpu / channels.median_cpu:.2f}x;  "
        f"Studio / origin: p50 {studio.median_p50 / origin.median_p50:.2f}x"
    )
    print(f"  (CPU from /proc at {1000 / harness.CLK_TCK:.0f} ms ticks, averaged per approval)")


if __name__ == "__main__":
    main()
