"""Benchmark 1: approval round trip on one daphne (SQLite + in-memory layer).

From sending the decision POST to receiving the tool_end fragment on the
WebSocket, for N sequential approvals, with the audit row and everything a
real decision does. Also the server's CPU per approval.

    .venv/bin/python bench/roundtrip.py --approvals 500
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import harness
import httpx
from websockets.sync.client import connect

from deploy.cluster import DaphneProcess


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--approvals", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--per-conversation", type=int, default=50)
    args = parser.parse_args()

    db = f"sqlite:///{harness.ROOT / 'bench' / '.bench-roundtrip.sqlite3'}"
    harness.setup_django(db)
    user, session = harness.make_member()
    server = DaphneProcess(
        env=harness.server_env(),
        app="bench.asgi:application",
        log_path=harness.ROOT / "bench" / ".bench-roundtrip.log",
    ).start()
    http = httpx.Client(base_url=server.url, cookies={"sessionid": session}, timeout=10)
    http.get("/")
    csrf = http.cookies["csrftoken"]
    latencies, cpu, post_only = [], [], []
    ws = None
    try:
        total = args.warmup + args.approvals
        for i in range(total):
            if i % args.per_conversation == 0:
                if ws is not None:
                    ws.close()
                conversation = harness.make_conversation(user)
                ws = connect(
                    f"{server.ws_url}/ws/c/{conversation.pk}/",
                    additional_headers={"Cookie": f"sessionid={session}", "Origin": server.url},
                )
                harness.recv_until(ws, 'id="transcript"')
            ws.send(json.dumps({"message": f"echo {i}"}))
            frames = harness.recv_until(ws, 'data-status="pending"')
            approval_id = harness.APPROVAL_ID.findall(frames)[-1]
            cpu0 = harness.cpu_seconds(server.pid)
            t0 = time.perf_counter()
            response = http.post(
                f"/approvals/{approval_id}/decide/",
                data={"decision": "allow"},
                headers={"X-CSRFToken": csrf, "Accept": "application/json"},
            )
            tp = time.perf_counter()
            harness.recv_until(ws, "data-tool-result=")
            t1 = time.perf_counter()
            cpu1 = harness.cpu_seconds(server.pid)
            assert response.status_code == 200, response.text
            harness.recv_until(ws, 'data-running="false"')
            if i >= args.warmup:
                latencies.append(t1 - t0)
                post_only.append(tp - t0)
                cpu.append(cpu1 - cpu0)
    finally:
        if ws is not None:
            ws.close()
        server.stop()
    print(
        "approval round trip (decision POST -> tool_end fragment):", harness.summary_ms(latencies)
    )
    print("  of which the decision POST's own response:", harness.summary_ms(post_only))
    print(
        f"server CPU per approval (POST -> tool_end window): mean {statistics.fmean(cpu) * 1000:.2f} ms "
        f"(clock tick {1000 / harness.CLK_TCK:.0f} ms, averaged over {len(cpu)})"
    )


if __name__ == "__main__":
    main()
