"""Benchmark 1: approval round trip on one daphne (SQLite + in-memory layer).

From sending the decision POST to receiving the tool_end fragment on the
WebSocket, for N sequential approvals, with the audit row and everything a
real decision does. Also the server's CPU per approval.

    .venv/bin/python bench/roundtrip.py --approvals 500
"""

from __future__ import annotations

import argparse
import statistics

import harness
import httpx

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
    try:
        trips = harness.round_trips(
            ws_server=server,
            user=user,
            session=session,
            decide=lambda approval_id: http.post(
                f"/approvals/{approval_id}/decide/",
                data={"decision": "allow"},
                headers={"X-CSRFToken": csrf, "Accept": "application/json"},
            ),
            count=args.approvals,
            warmup=args.warmup,
            per_conversation=args.per_conversation,
            cpu_pid=server.pid,
        )
    finally:
        server.stop()
    latencies, post_only, cpu = trips.total, trips.post, trips.cpu
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
