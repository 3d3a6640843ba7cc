"""Benchmark: N runs waiting on pending approvals, started through one daphne process.

While they wait (as rows only): threads, RSS per waiting run, idle CPU, and
the first answer fragment of a brand-new conversation. Then all N are
decided by N POSTs (16 at a time): every run must resolve with its own
result; time to drain, from the first POST to the last run done.

    .venv/bin/python bench/parked.py --sizes 1000 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import harness
import httpx
from websockets.asyncio.client import connect

from deploy.cluster import DaphneProcess


def park(server, session: str, csrf: str, conversation_ids: list[int]) -> None:
    def send(conversation_id: int) -> None:
        with httpx.Client(
            base_url=server.url, cookies={"sessionid": session, "csrftoken": csrf}
        ) as c:
            r = c.post(
                f"/c/{conversation_id}/send/",
                data={"message": f"echo parked-{conversation_id}"},
                headers={"X-CSRFToken": csrf},
                timeout=60,
            )
            assert r.status_code == 302, r.status_code

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(send, conversation_ids))


def wait_for(predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


async def first_fragment_latency(server, session: str, conversation_ids: list[int]) -> list[float]:
    latencies = []
    for conversation_id in conversation_ids:
        async with connect(
            f"{server.ws_url}/ws/c/{conversation_id}/",
            additional_headers={"Cookie": f"sessionid={session}", "Origin": server.url},
        ) as ws:
            await asyncio.wait_for(ws.recv(), 10)  # catch-up
            t0 = time.perf_counter()
            await ws.send(json.dumps({"message": "stream 5"}))
            while True:
                frame = await asyncio.wait_for(ws.recv(), 10)
                # The answer's first fragment: streamed, or whole when it was quick.
                if "beforeend:#stream-" in frame or 'class="msg msg-assistant' in frame:
                    latencies.append(time.perf_counter() - t0)
                    break
            while 'data-running="false"' not in frame:
                frame = await asyncio.wait_for(ws.recv(), 10)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--clients", type=int, default=16, help="decision POSTs in flight")
    parser.add_argument("--probes", type=int, default=40)
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=60.0,
        help="how long idle CPU is measured: a whole cycle of the process's periodic work "
        "(the poller's full re-read every 60 s, the runs' heartbeat every 30 s)",
    )
    args = parser.parse_args()

    harness.setup_django(f"sqlite:///{harness.ROOT / 'bench' / '.bench-parked.sqlite3'}")
    from approvals.models import ToolApproval
    from chat.models import Message, Run

    user, session = harness.make_member()
    server = DaphneProcess(
        env=harness.server_env(STUDIO_AGENT_WORKERS=str(args.workers)),
        app="bench.asgi:application",
        log_path=harness.ROOT / "bench" / ".bench-parked.log",
    ).start()
    http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=60)
    http.get("/")
    csrf = http.cookies["csrftoken"]
    try:
        for n in args.sizes:
            ToolApproval.objects.all().delete()
            Run.objects.all().delete()
            time.sleep(1)
            rss0, cpu_idle0 = harness.rss_kb(server.pid), None
            conversations = [harness.make_conversation(user).pk for _ in range(n)]
            t_park = time.monotonic()
            park(server, session, csrf, conversations)
            wait_for(lambda: ToolApproval.objects.pending().count() == n, 900, f"{n} pending")
            park_s = time.monotonic() - t_park
            time.sleep(2)
            rss1, threads = harness.rss_kb(server.pid), harness.threads(server.pid)
            cpu_idle0 = harness.cpu_seconds(server.pid)
            time.sleep(args.idle_seconds)
            idle_cpu = (harness.cpu_seconds(server.pid) - cpu_idle0) / args.idle_seconds
            probes = [
                harness.make_conversation(user, enabled_tools=[]).pk for _ in range(args.probes)
            ]
            latencies = asyncio.run(first_fragment_latency(server, session, probes))

            pending = list(ToolApproval.objects.pending().values_list("approval_id", flat=True))
            print(f"  deciding {len(pending)} ...", flush=True)
            t0 = time.monotonic()

            def decide(approval_id: str) -> int:
                return (
                    http_pool_client()
                    .post(
                        f"/approvals/{approval_id}/decide/",
                        data={"decision": "allow"},
                        headers=decision_headers,
                    )
                    .status_code
                )

            decision_headers = harness.member_headers(session, csrf)
            clients = {}

            def http_pool_client():
                import threading

                key = threading.get_ident()
                if key not in clients:
                    clients[key] = httpx.Client(base_url=server.url, timeout=60)
                return clients[key]

            with ThreadPoolExecutor(args.clients) as pool:
                codes = list(pool.map(decide, pending))
            posted = time.monotonic() - t0
            drain = posted + wait_for(
                lambda: (
                    Run.objects.filter(status="done", conversation_id__in=conversations).count()
                    == n
                ),
                300,
                "runs to finish",
            )
            for c in clients.values():
                c.close()
            results = dict(
                Message.objects.filter(role="tool", conversation_id__in=conversations).values_list(
                    "conversation_id", "content"
                )
            )
            correct = sum(results.get(cid) == f"parked-{cid}" for cid in conversations)
            print(f"--- N = {n} waiting runs")
            print(
                f"  starting them took {park_s:.1f} s; threads {threads} "
                f"(STUDIO_AGENT_WORKERS={args.workers}); RSS {rss1 / 1024:.0f} MB"
            )
            print(f"  RSS per waiting run: {(rss1 - rss0) / n:.1f} KB")
            print(
                f"  idle CPU while they wait: {idle_cpu * 100:.1f} % of one core "
                f"(over {args.idle_seconds:.0f} s)"
            )
            print(f"  new conversation, first streamed fragment: {harness.summary_ms(latencies)}")
            print(
                f"  decision POSTs: {codes.count(200)} x 200 of {n}, all posted in {posted:.2f} s"
            )
            print(
                f"  drain (first POST -> all {n} runs done): {drain:.2f} s; correct results {correct}/{n}"
            )
            print(f"  mean first-fragment latency {statistics.fmean(latencies) * 1000:.1f} ms")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
