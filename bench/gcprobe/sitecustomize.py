"""Times each garbage collection of a benchmark's server process.

On ``PYTHONPATH`` with ``STUDIO_BENCH_GC_DIR`` set (bench/production.py does
both), each process writes its collections (generation, seconds) to a JSON
file there as it exits. A collection stops its process: a full one is a
pause every request in that process waits out.
"""

import atexit
import gc
import json
import os
import time

_DIR = os.environ.get("STUDIO_BENCH_GC_DIR")
_started = [0.0]
_collections: list[tuple[int, float]] = []


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        _collections.append((info["generation"], time.perf_counter() - _started[0]))


def _write() -> None:
    with open(os.path.join(_DIR, f"{os.getpid()}.json"), "w") as f:
        json.dump(_collections, f)


if _DIR:
    gc.callbacks.append(_timed)
    atexit.register(_write)
    # A forked worker (gunicorn's) counts its own collections only.
    os.register_at_fork(after_in_child=_collections.clear)
