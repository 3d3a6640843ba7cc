"""Peer (d): Studio's own Django stack answering the decision POST with no decision.

The floor for "a POST through Django with Studio's security": the same
settings, ASGI handler and middleware (sessions, CSRF, authentication,
login required, axes, htmx), and a view that checks nothing and writes
nothing. What Studio's decision POST costs above this is the decision
itself: the row's read, the conditional update and its commit, the card,
the wake and the broadcasts.

    daphne bench.peers.django_floor:application
"""

from __future__ import annotations

from studio.asgi import application  # noqa: F401 - sets Django up first  # isort: skip

from django.contrib.auth.decorators import login_required  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import clear_url_caches, path  # noqa: E402
from django.views.decorators.http import require_POST  # noqa: E402

import studio.urls  # noqa: E402


@require_POST
@login_required
def decide(request, approval_id: str) -> JsonResponse:
    return JsonResponse({"resolved": True, "status": "allowed", "reason": "user"})


# Ahead of Studio's own routes, at a path of its own.
studio.urls.urlpatterns.insert(0, path("floor/<str:approval_id>/decide/", decide))
clear_url_caches()
