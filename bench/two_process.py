"""Benchmark 3: two daphne processes on PostgreSQL + Redis.

The WebSocket on process A, the decision POST on process B: cross-process
round trip (decision POST -> tool_end fragment on A), Redis client
connections per process (must stay constant). Then the restart: 1000 runs
waiting, half started on each process; both processes restarted, one after
the other (SIGTERM, then a successor on a new port); all 1000 decided through
either new process. Reported: each call's own output, no tool run twice, the
drain, and the processes' memory with the runs waiting.

    .venv/bin/python bench/two_process.py --approvals 300 --parked 1000
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import harness
import httpx

from deploy.cluster import DaphneProcess


def redis_connections(pid: int) -> int:
    out = subprocess.run(
        ["ss", "-Htnp", "state", "established", "dst", "127.0.0.1:6379"],
        capture_output=True,
        text=True,
    ).stdout
    return sum(1 for line in out.splitlines() if f"pid={pid}," in line)


class Http:
    """One httpx client per thread and server."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.local = threading.local()
        self.csrf = ""

    def client(self, server) -> httpx.Client:
        clients = getattr(self.local, "clients", None)
        if clients is None:
            clients = self.local.clients = {}
        if server.url not in clients:
            c = httpx.Client(base_url=server.url, cookies={"sessionid": self.session}, timeout=60)
            if not self.csrf:
                c.get("/")
                self.csrf = c.cookies["csrftoken"]
            c.cookies.set("csrftoken", self.csrf)
            clients[server.url] = c
        return clients[server.url]

    def post(self, server, path: str, data: dict, json_reply: bool = True) -> httpx.Response:
        client = self.client(server)
        headers = {"X-CSRFToken": self.csrf}
        if json_reply:
            headers["Accept"] = "application/json"
        return client.post(path, data=data, headers=headers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--approvals", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--parked", type=int, default=1000)
    parser.add_argument(
        "--database",
        default=harness.POSTGRES_URL,
        help="the shared database (a SQLite file works too: it tells the database's share)",
    )
    args = parser.parse_args()

    subprocess.run(["redis-cli", "-n", "5", "flushdb"], check=True, capture_output=True)
    harness.setup_django(args.database, harness.REDIS_URL)
    from approvals.models import ToolApproval
    from chat.models import Message, Run

    user, session = harness.make_member()
    env = harness.server_env()
    logs = [harness.ROOT / "bench" / f".bench-two-{name}.log" for name in "ab"]
    for log in logs:
        log.unlink(missing_ok=True)
    a, b = (
        DaphneProcess(env=env, app="bench.asgi:application", log_path=log).start() for log in logs
    )
    http = Http(session)
    try:
        conns = {"start": (redis_connections(a.pid), redis_connections(b.pid))}
        # -- cross-process round trip ---------------------------------------------
        latencies = harness.round_trips(
            ws_server=a,
            user=user,
            session=session,
            decide=lambda approval_id: http.post(
                b, f"/approvals/{approval_id}/decide/", {"decision": "allow"}
            ),
            count=args.approvals,
            warmup=args.warmup,
        ).total
        conns["after round trips"] = (redis_connections(a.pid), redis_connections(b.pid))
        print(
            "cross-process round trip (POST on B -> tool_end on A's socket):",
            harness.summary_ms(latencies),
        )

        # -- the restart: waiting runs across both processes ----------------------
        ToolApproval.objects.all().delete()
        Run.objects.all().delete()
        half = args.parked // 2
        rss_idle = (harness.rss_kb(a.pid), harness.rss_kb(b.pid))
        plan = [
            (a if i < half else b, harness.make_conversation(user).pk) for i in range(args.parked)
        ]

        def send(item) -> int:
            server, cid = item
            return http.post(
                server, f"/c/{cid}/send/", {"message": f"echo parked-{cid}"}, json_reply=False
            ).status_code

        t_park = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(send, plan)) == {302}
        deadline = time.monotonic() + 600
        while (
            Run.objects.filter(status="running").exclude(waiting_on="").filter(owner="").count()
            < args.parked
        ):
            assert time.monotonic() < deadline, "runs did not come to wait"
            time.sleep(0.1)
        park_s = time.monotonic() - t_park
        rss = (harness.rss_kb(a.pid), harness.rss_kb(b.pid))
        thr = (harness.threads(a.pid), harness.threads(b.pid))

        t_restart = time.monotonic()
        a.stop()
        a = DaphneProcess(env=env, app="bench.asgi:application", log_path=logs[0]).start()
        b.stop()
        b = DaphneProcess(env=env, app="bench.asgi:application", log_path=logs[1]).start()
        restart_s = time.monotonic() - t_restart
        still = ToolApproval.objects.pending().count()
        pending = list(ToolApproval.objects.pending().values_list("approval_id", flat=True))

        def decide(item) -> int:
            n, approval_id = item
            return http.post(
                (a, b)[n % 2], f"/approvals/{approval_id}/decide/", {"decision": "allow"}
            ).status_code

        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(decide, enumerate(pending)))
        posted = time.monotonic() - t0
        cids = [cid for _, cid in plan]
        while Run.objects.filter(status="done", conversation_id__in=cids).count() < args.parked:
            assert time.monotonic() < deadline + 600, "runs did not finish"
            time.sleep(0.05)
        drain = time.monotonic() - t0
        conns["after drain"] = (redis_connections(a.pid), redis_connections(b.pid))
        outputs = list(
            Message.objects.filter(role="tool", conversation_id__in=cids).values_list(
                "conversation_id", "content"
            )
        )
        results = dict(outputs)
        correct = sum(results.get(cid) == f"parked-{cid}" for cid in cids)
        twice = len(outputs) - len(results)
        print(
            f"{args.parked} waiting runs ({half} started per process) in {park_s:.1f} s; "
            f"threads A/B {thr[0]}/{thr[1]}; RSS A/B {rss[0] // 1024}/{rss[1] // 1024} MB, "
            f"{(sum(rss) - sum(rss_idle)) / args.parked:.1f} KB per waiting run over idle"
        )
        print(
            f"  rolling restart of both processes in {restart_s:.1f} s; still pending after it: "
            f"{still}/{args.parked}"
        )
        print(
            f"  decisions through either new process: {codes.count(200)} x 200 of {len(codes)} "
            f"in {posted:.1f} s; drain {drain:.1f} s; own output {correct}/{args.parked}; "
            f"tools run twice: {twice}"
        )
        print(
            "Redis client connections per process (A, B):",
            "; ".join(f"{k} {v}" for k, v in conns.items()),
        )
    finally:
        a.stop()
        b.stop()


if __name__ == "__main__":
    main()
