"""Benchmark: what each piece of a production.py decision costs the server, one at a time.

One daphne process on PostgreSQL and Redis, nothing else running, each piece
sequential with a pause between them: server CPU (its CPU clock, every
thread) and wall time per piece. The pieces are what production.py's load
is made of: a member's tab opening on a chat that waits on a card (handshake,
catch-up, close; as a page just drawn opens it, and as a reconnect), the decision POST with no tab open (the POST, the run's
step, its fragments to nobody), the same with the chat's tab open (its card,
result and end fragments, and the tab's count refreshed after them), and
``/healthz`` (Django's request path alone, the floor under every POST).

    .venv/bin/python bench/costs.py --n 100 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import harness
import httpx

from deploy.cluster import DaphneProcess

PAUSE = 0.05  # between pieces: each one meets an idle process, as at a low rate
SETTLED = 0.3  # after a decision: its run's end and the tab's count (sent 0.1 s later)


class Piece:
    """Times one piece on ``server``: wall seconds and server CPU seconds, each time."""

    def __init__(self, server) -> None:
        self.pid = server.pid
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def time(self, piece, *, settle: float = PAUSE) -> None:
        cpu0, t0 = harness.cpu_seconds(self.pid), time.perf_counter()
        piece()
        self.wall.append(time.perf_counter() - t0)
        time.sleep(settle)
        self.cpu.append(harness.cpu_seconds(self.pid) - cpu0)


def one_round(n: int) -> dict[str, Piece]:
    user, session = harness.make_member(f"costs{time.monotonic_ns()}")
    env = harness.server_env(STUDIO_APPROVAL_POLL_SECONDS="3600")
    server = DaphneProcess(env=env, app="bench.asgi:application").start(timeout=60)
    names = ("/healthz", "page opening", "tab opening", "decision", "with tab")
    pieces = {name: Piece(server) for name in names}
    try:
        calls = harness.parked_chats(server, user, session, 2 * n)
        with httpx.Client(base_url=server.url, cookies={"sessionid": session}) as http:
            allow = harness.member_allow(http)
            for _ in range(n):
                pieces["/healthz"].time(lambda: http.get("/healthz"))
            for name, drawn in (("page opening", True), ("tab opening", False)):
                for conversation_id, _ in calls[:n]:

                    def opening(conversation_id=conversation_id, drawn=drawn) -> None:
                        with harness.chat_socket(
                            server, session, conversation_id, drawn=drawn
                        ) as ws:
                            harness.recv_until(ws, 'id="transcript"')

                    pieces[name].time(opening)
            for _, approval_id in calls[:n]:
                pieces["decision"].time(lambda a=approval_id: allow(a), settle=SETTLED)
            for conversation_id, approval_id in calls[n:]:
                with harness.chat_socket(server, session, conversation_id) as ws:
                    harness.recv_until(ws, 'id="transcript"')
                    time.sleep(PAUSE)

                    def decided(ws=ws, approval_id=approval_id) -> None:
                        allow(approval_id)
                        harness.recv_until(ws, 'data-running="false"')

                    pieces["with tab"].time(decided, settle=SETTLED)
    finally:
        server.stop()
    return pieces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100, help="pieces of each kind per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    harness.setup_django(harness.POSTGRES_URL, harness.REDIS_URL)
    rounds = [one_round(args.n) for _ in range(args.rounds)]
    print(f"one daphne, PostgreSQL + Redis; {args.n} of each piece, {args.rounds} rounds")
    for name in rounds[0]:
        cpu = [statistics.median(r[name].cpu) * 1000 for r in rounds]
        wall = [statistics.median(r[name].wall) * 1000 for r in rounds]
        print(
            f"  {name:12s} server CPU {statistics.median(cpu):6.2f} ms "
            f"(rounds {', '.join(f'{c:.2f}' for c in cpu)}), wall p50 {statistics.median(wall):.2f} ms"
        )


if __name__ == "__main__":
    main()
