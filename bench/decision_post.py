"""Benchmark: the decision POST alone (no run waiting), Studio beside two floors.

Studio: sequential ``POST /approvals/<id>/decide/`` on pending rows, as a
logged-in browser sends it (session cookie, CSRF header, JSON answer): the
whole middleware stack, the conditional update, the card rendered for the
other tabs. The peers: a bare ASGI app on daphne answering the same POST,
and Studio's own Django stack (same settings and middleware, same session
and CSRF header) with a view that decides nothing: what Django's security
costs before any decision. Rounds alternate; figures are medians over rounds.

    .venv/bin/python bench/decision_post.py --posts 500 --rounds 3
"""

from __future__ import annotations

import argparse
import time

import harness
import httpx

from deploy.cluster import DaphneProcess


def studio_round(posts: int, warmup: int) -> list[float]:
    user, session = harness.make_member(f"post{time.monotonic_ns()}")
    rows = harness.make_pending(user, harness.make_conversation(user), posts + warmup)
    paths = [f"/approvals/{row.approval_id}/decide/" for row in rows]
    return member_posts("bench.asgi:application", session, paths, warmup)


def floor_round(posts: int, warmup: int) -> list[float]:
    _, session = harness.make_member(f"floor{time.monotonic_ns()}")
    paths = [f"/floor/a{i}/decide/" for i in range(posts + warmup)]
    return member_posts("bench.peers.django_floor:application", session, paths, warmup)


def member_posts(app: str, session: str, paths: list[str], warmup: int) -> list[float]:
    """POST an Allow to each path as a logged-in browser would; the latencies after warm-up."""
    server = DaphneProcess(env=harness.server_env(), app=app).start()
    latencies = []
    with httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10) as http:
        post = harness.member_post(http)
        for i, path in enumerate(paths):
            t0 = time.perf_counter()
            response = post(path)
            elapsed = time.perf_counter() - t0
            assert response.status_code == 200, response.text
            if i >= warmup:
                latencies.append(elapsed)
    server.stop()
    return latencies


def bare_round(posts: int, warmup: int) -> list[float]:
    server = DaphneProcess(env=harness.peer_env(), app="bench.peers.bare_asgi:application").start()
    latencies = []
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for i in range(posts + warmup):
            t0 = time.perf_counter()
            response = http.post("/approvals/x/decide/", data={"decision": "allow"})
            elapsed = time.perf_counter() - t0
            assert response.status_code == 200
            if i >= warmup:
                latencies.append(elapsed)
    server.stop()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--posts", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    harness.setup_django(f"sqlite:///{harness.ROOT / 'bench' / '.bench-post.sqlite3'}")
    studio = harness.Figures("Studio decision POST")
    bare = harness.Figures("peer: bare ASGI app on daphne")
    floor = harness.Figures("peer: Studio's Django, no decision")
    rounds = {"studio": (studio, studio_round), "bare": (bare, bare_round)}
    rounds["floor"] = (floor, floor_round)
    order = ["studio", "bare", "floor"]
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            figures, run = rounds[name]
            figures.add(run(args.posts, args.warmup))
    print(f"decision POST alone, {args.posts} POSTs x {args.rounds} alternating rounds, medians:")
    for figures in (studio, bare, floor):
        print("  " + figures.line())
    print(
        f"  ratio Studio / bare ASGI: p50 {studio.median_p50 / bare.median_p50:.2f}x;"
        f"  Studio's Django with no decision / bare ASGI: {floor.median_p50 / bare.median_p50:.2f}x"
    )


if __name__ == "__main__":
    main()
