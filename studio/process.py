"""What a server process does once its application is built."""

from __future__ import annotations

import gc

# Container objects allocated (net of those freed) between two young
# collections. Each request leaves cycles (Django's connection wrapper per
# request context, daphne's protocol objects): at Python's 700 those of the
# requests in flight were promoted and collected in full, with the process
# stopped; ten times later most are garbage by then (bench/RESULTS.md).
YOUNG_THRESHOLD = 7000


def settle() -> None:
    """Keep what the process built as it started out of full collections.

    Django, every module and the URL maps live as long as the process, yet
    each full collection walked them all, with the process stopped
    (bench/RESULTS.md). Frozen, they are never walked again; their garbage
    is collected first, since frozen objects are never freed.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
