"""Benchmark: what the benchmarks' own client costs per decision POST, by how it sends cookies.

Every latency figure here includes the client's own Python (httpx): building
the request, reading the answer. Studio's requests carry a session and a CSRF
cookie; the peers' carry none. This POSTs to the bare ASGI peer (whose
answer costs next to nothing), in alternating rounds, three ways: no cookies
(as the peers' clients), the two cookies in httpx's cookie jar (Python's
``http.cookiejar``), and the same two cookies as a plain ``Cookie`` header
(as ``harness.member_headers`` puts them).

    .venv/bin/python bench/client_cost.py --posts 1000 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import time

import harness
import httpx

from deploy.cluster import DaphneProcess

SESSION, CSRF = "s" * 32, "c" * 32


def clients(url: str) -> dict[str, tuple[httpx.Client, dict]]:
    headers = harness.member_headers(SESSION, CSRF)
    jar = httpx.Client(base_url=url, cookies={"sessionid": SESSION, "csrftoken": CSRF})
    without_cookie = {name: value for name, value in headers.items() if name != "Cookie"}
    return {
        "no cookies (the peers)": (httpx.Client(base_url=url), {}),
        "cookie jar": (jar, without_cookie),
        "Cookie header (member_post)": (httpx.Client(base_url=url), headers),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--posts", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    server = DaphneProcess(env=harness.peer_env(), app="bench.peers.bare_asgi:application")
    server.start()
    medians: dict[str, list[float]] = {}
    try:
        ways = clients(server.url)
        for r in range(args.rounds):
            order = list(ways.items())
            for name, (client, headers) in order[r % 3 :] + order[: r % 3]:
                latencies = []
                for i in range(args.posts):
                    t0 = time.perf_counter()
                    response = client.post(
                        f"/approvals/a{i}/decide/", data={"decision": "allow"}, headers=headers
                    )
                    latencies.append(time.perf_counter() - t0)
                    assert response.status_code == 200
                medians.setdefault(name, []).append(statistics.median(latencies[50:]))
    finally:
        server.stop()
    print(f"a POST to the bare ASGI app, {args.posts} x {args.rounds} alternating rounds, medians:")
    base = statistics.median(medians["no cookies (the peers)"])
    for name, values in medians.items():
        median = statistics.median(values)
        print(f"  {name:30s} p50 {median * 1000:6.3f} ms  ({(median - base) * 1e6:+5.0f} us)")


if __name__ == "__main__":
    main()
