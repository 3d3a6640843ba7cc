"""Benchmark 4: streaming to one browser socket.

The scripted model emits T tokens, as fast as it can or at a set pace; we
measure tokens per second delivered to the WebSocket (first content frame to
the finished reply, whose tokens are counted) and channel messages
(WebSocket frames) per token. A reply that is done before the first batch of
deltas goes out arrives whole, in one fragment.

    .venv/bin/python bench/streaming.py --tokens 20000 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import harness
from websockets.sync.client import connect

from deploy.cluster import DaphneProcess


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=[0, 2000, 10000],
        help="model pace in tokens/s; 0 = as fast as the model loop can",
    )
    args = parser.parse_args()
    harness.setup_django(f"sqlite:///{harness.ROOT / 'bench' / '.bench-streaming.sqlite3'}")
    user, session = harness.make_member()
    server = DaphneProcess(
        env=harness.server_env(),
        app="bench.asgi:application",
        log_path=harness.ROOT / "bench" / ".bench-streaming.log",
    ).start()
    results = {}
    try:
        for pace in args.rates:
            results[pace] = run(server, user, session, args.tokens, args.repeats, pace)
    finally:
        server.stop()
    for pace, (rates, per_token, e2e) in results.items():
        label = f"model paced at {pace:,.0f} tok/s" if pace else "model unpaced"
        rate = statistics.median(rates)
        delivered = "in one fragment" if rate == float("inf") else f"{rate:,.0f} tok/s"
        print(
            f"{label}: delivered {delivered} to one socket "
            f"(first->last content frame; end-to-end send->last token {statistics.median(e2e):,.0f} tok/s), "
            f"{statistics.median(per_token):.4f} channel messages per token, "
            f"median of {args.repeats} x {args.tokens} tokens"
        )


def run(server, user, session, tokens, repeats, pace):
    rates, per_token, e2e = [], [], []
    if True:
        for _ in range(repeats):
            conversation = harness.make_conversation(user, enabled_tools=[])
            with connect(
                f"{server.ws_url}/ws/c/{conversation.pk}/",
                additional_headers={"Cookie": f"sessionid={session}", "Origin": server.url},
                max_size=None,
            ) as ws:
                ws.recv(timeout=10)
                sent = time.perf_counter()
                ws.send(harness.stream_request(tokens, pace))
                first = last = None
                frames = received = 0
                while True:
                    frame = ws.recv(timeout=60)
                    now = time.perf_counter()
                    if "beforeend:#stream-" in frame and '-body">' in frame:
                        first = first or now
                        frames += 1
                    elif 'class="msg msg-assistant' in frame:
                        # The finished reply replaces the streaming bubble (or
                        # comes alone when the model answered at once): the
                        # tokens the member ends up seeing.
                        first = first or now
                        last = now
                        frames += 1
                        received = frame.count("tok")
                    if 'data-running="false"' in frame:
                        break
            assert received == tokens, (received, tokens)
            rates.append(tokens / (last - first) if last > first else float("inf"))
            e2e.append(tokens / (last - sent))
            per_token.append(frames / tokens)
    return rates, per_token, e2e


if __name__ == "__main__":
    main()
