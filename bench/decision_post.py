"""Benchmark: the decision POST alone (no run waiting), Studio beside a bare ASGI app.

Studio: sequential ``POST /approvals/<id>/decide/`` on pending rows, as a
logged-in browser sends it (session cookie, CSRF header, JSON answer): the
whole middleware stack, the conditional update, the card rendered for the
other tabs. The peer: a bare ASGI app on daphne answering the same POST.
Rounds alternate; figures are medians over rounds.

    .venv/bin/python bench/decision_post.py --posts 500 --rounds 3
"""

from __future__ import annotations

import argparse
import time

import harness
import httpx

from deploy.cluster import DaphneProcess


def studio_round(posts: int, warmup: int) -> list[float]:
    from approvals.models import ToolApproval, arguments_hash

    user, session = harness.make_member(f"post{time.monotonic_ns()}")
    conversation = harness.make_conversation(user)
    rows = [
        ToolApproval(
            conversation=conversation,
            tool_name="echo",
            arguments={"text": str(i)},
            arguments_sha256=arguments_hash({"text": str(i)}),
            requested_by=user,
            run_id="bench",
        )
        for i in range(posts + warmup)
    ]
    ToolApproval.objects.bulk_create(rows)
    server = DaphneProcess(env=harness.server_env(), app="bench.asgi:application").start()
    latencies = []
    with httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10) as http:
        http.get("/")
        headers = {"X-CSRFToken": http.cookies["csrftoken"], "Accept": "application/json"}
        for i, row in enumerate(rows):
            t0 = time.perf_counter()
            response = http.post(
                f"/approvals/{row.approval_id}/decide/", data={"decision": "allow"}, headers=headers
            )
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
    for r in range(args.rounds):
        for name in ("studio", "bare") if r % 2 == 0 else ("bare", "studio"):
            if name == "studio":
                studio.add(studio_round(args.posts, args.warmup))
            else:
                bare.add(bare_round(args.posts, args.warmup))
    print(f"decision POST alone, {args.posts} POSTs x {args.rounds} alternating rounds, medians:")
    print("  " + studio.line())
    print("  " + bare.line())
    print(f"  ratio Studio / bare ASGI: p50 {studio.median_p50 / bare.median_p50:.2f}x")


if __name__ == "__main__":
    main()
