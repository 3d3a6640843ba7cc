"""Benchmark: how soon an API agent's long poll hears a decision (issue 57's target).

One Studio process on the embedded shape (SQLite, in-memory channel layer,
DEBUG off; with ``--redis`` the Pub/Sub layer). For each of N calls: the
agent asks (``POST /api/v1/approvals``) and starts a long poll
(``GET …?wait=60``) on a thread; once the poll is waiting in the server, a
member's decision POST is sent. Measured per call, from sending the
decision to:

* ``post``: the decision's own answer (what the member waits for);
* ``poll``: the long poll's answer with the decision (what the agent waits for).

Beside it, the chat's approval round trip runs in the same invocation
(``roundtrip.py``'s cycles: decision POST → the tool's result on the tab's
socket), so the two can be compared on one machine at one time.

    .venv/bin/python bench/api_longpoll.py --approvals 300 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import harness
import httpx

from deploy.cluster import DaphneProcess

# The poll is in the server and listening by then (measured: under 5 ms).
SETTLE = 0.05


def api_cycles(server, decide, secret: str, count: int) -> tuple[list[float], list[float]]:
    agent = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {secret}"}, timeout=70
    )
    posts, polls = [], []
    try:
        for i in range(count):
            asked = agent.post(
                "/api/v1/approvals", json={"tool": "deploy", "arguments": {"n": i}}
            ).json()
            answer: dict = {}

            def poll(approval_id=asked["id"], answer=answer) -> None:
                response = agent.get(f"/api/v1/approvals/{approval_id}", params={"wait": "60"})
                answer["at"] = time.perf_counter()
                answer["status"] = response.json()["status"]

            waiter = threading.Thread(target=poll)
            waiter.start()
            time.sleep(SETTLE)
            sent = time.perf_counter()
            response = decide(asked["id"])
            posted = time.perf_counter()
            waiter.join(30)
            assert response.status_code == 200 and answer.get("status") == "allowed", answer
            posts.append(posted - sent)
            polls.append(answer["at"] - sent)
    finally:
        agent.close()
    return posts, polls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--approvals", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--redis", default="", help="a Redis URL: the Pub/Sub layer")
    args = parser.parse_args()
    harness.setup_django(f"sqlite:///{harness.ROOT / 'bench' / '.bench-api.sqlite3'}", args.redis)
    from approvals.services.api import token_create

    server = DaphneProcess(
        env=harness.server_env(),
        app="bench.asgi:application",
        log_path=harness.ROOT / "bench" / ".bench-api.log",
    ).start()
    rounds = []
    try:
        for n in range(args.rounds):
            user, session = harness.make_member(f"api{n}{time.monotonic_ns()}")
            _, secret = token_create(user=user, name="bench")
            http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10)
            decide = harness.member_allow(http)
            api_cycles(server, decide, secret, args.warmup)
            posts, polls = api_cycles(server, decide, secret, args.approvals)
            http.close()
            chat_http = httpx.Client(
                base_url=server.url, cookies={"sessionid": session}, timeout=10
            )
            trips = harness.round_trips(
                ws_server=server,
                user=user,
                session=session,
                decide=harness.member_allow(chat_http),
                count=args.approvals,
                warmup=args.warmup,
            )
            chat_http.close()
            rounds.append((posts, polls, trips.total))
            print(
                f"round {n + 1}: decision POST {harness.summary_ms(posts)}; "
                f"long poll {harness.summary_ms(polls)}; "
                f"chat round trip {harness.summary_ms(rounds[-1][2])}",
                flush=True,
            )
    finally:
        server.stop()

    def median_of(index: int, p: float) -> float:
        return 1000 * statistics.median(harness.percentile(r[index], p) for r in rounds)

    poll99, post99 = median_of(1, 99), median_of(0, 99)
    print(
        f"\nmedian over {args.rounds} rounds: long poll p50 {median_of(1, 50):.2f} ms, "
        f"p99 {poll99:.2f} ms (target 50); decision POST p50 {median_of(0, 50):.2f} ms, "
        f"p99 {post99:.2f} ms; chat round trip p50 {median_of(2, 50):.2f} ms, "
        f"p99 {median_of(2, 99):.2f} ms; long poll / chat p50 "
        f"{median_of(1, 50) / median_of(2, 50):.2f}x"
    )


if __name__ == "__main__":
    main()
