"""Benchmark: the client-side CPU of one model call, as a run step makes it.

A step builds its model (``chat.llm.get_model``'s ``OpenAICompatModel``) and
streams one reply from a real OpenAI-compatible server on loopback (the
tests' ``FakeOpenAI``, speaking the real SSE wire format, on its own
threads). Timed: the calling thread's CPU (``time.thread_time``), so the
server's own work is not counted; a short reply of 20 chunks.

    .venv/bin/python bench/model_client.py --calls 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")


def main() -> None:
    import django

    django.setup()
    from chat.llm.openai_compat import OpenAICompatModel
    from studio.cancel import CancelToken
    from tests.helpers.fake_openai import FakeOpenAI, Reply, content_chunks

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with FakeOpenAI() as fake:
        cpu = []
        for _ in range(args.calls + 5):
            fake.replies.append(Reply(chunks=content_chunks(*["word "] * 20)))
            started = time.thread_time()
            model = OpenAICompatModel(
                base_url=fake.base_url, model="fake-small", api_key="k", timeout=30
            )
            chunks = list(
                model.stream([{"role": "user", "content": "hi"}], [], cancel=CancelToken())
            )
            cpu.append((time.thread_time() - started) * 1000)
            assert chunks, "no reply"
    cpu = sorted(cpu[5:])
    print(
        f"client CPU per model call: median {statistics.median(cpu):.2f} ms, "
        f"p95 {cpu[int(0.95 * (len(cpu) - 1))]:.2f} ms ({len(cpu)} calls)"
    )


if __name__ == "__main__":
    main()
