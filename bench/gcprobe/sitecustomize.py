"""Times each garbage collection of a benchmark's server process, and counts its objects.

On ``PYTHONPATH`` with ``STUDIO_BENCH_GC_DIR`` set (bench/production.py and
bench/soak.py do both), each process writes its collections (generation,
seconds, when it ended on the system's monotonic clock) to a JSON file there
as it exits. A collection stops its process: it is a pause every request in
that process waits out.

With ``STUDIO_BENCH_CENSUS_SECONDS`` set too, the process also appends, that
often, a census of its live objects by type to ``<pid>-census.jsonl``
(bench/soak.py reads what grows).
"""

import atexit
import collections
import gc
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("STUDIO_BENCH_GC_DIR")
_CENSUS_SECONDS = float(os.environ.get("STUDIO_BENCH_CENSUS_SECONDS") or 0)
_started = [0.0]
_settled = [False]
_collections: list[tuple[int, float, float]] = []


def _timed(phase: str, info: dict) -> None:
    # Before the process froze what it built at start (studio.process.settle),
    # a collection is the import's, not a pause that a request waits out.
    # Asked until it is true, never after: get_freeze_count() walks every
    # frozen object, a pause longer than the collection it would time.
    if not _settled[0]:
        if not gc.get_freeze_count():
            return
        _settled[0] = True
    if phase == "start":
        _started[0] = time.perf_counter()
    else:
        ended = time.perf_counter()
        _collections.append((info["generation"], ended - _started[0], time.monotonic()))


def _write() -> None:
    with open(os.path.join(_DIR, f"{os.getpid()}.json"), "w") as f:
        json.dump(_collections, f)


def _census() -> None:
    path = os.path.join(_DIR, f"{os.getpid()}-census.jsonl")
    while True:
        time.sleep(_CENSUS_SECONDS)
        counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        with open(path, "a") as f:
            # Blocks held by Python's allocator: what the census does not see
            # (strings, bytes, the insides of one growing dict) shows here.
            blocks = sys.getallocatedblocks()
            f.write(json.dumps({"at": time.time(), "types": counts, "blocks": blocks}) + "\n")


if _DIR:
    gc.callbacks.append(_timed)
    atexit.register(_write)
    # A forked worker (gunicorn's) counts its own collections only.
    os.register_at_fork(after_in_child=_collections.clear)
    if _CENSUS_SECONDS:
        threading.Thread(target=_census, name="bench-census", daemon=True).start()
