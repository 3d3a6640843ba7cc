"""What a server process does once its application is built."""

from __future__ import annotations

import gc


def settle() -> None:
    """Keep what the process built as it started out of full collections.

    Django, every module and the URL maps live as long as the process, yet
    each full collection walked them all, with the process stopped
    (bench/RESULTS.md). Frozen, they are never walked again; their garbage
    is collected first, since frozen objects are never freed.
    """
    gc.collect()
    gc.freeze()
