"""Health for load balancers and operators, and the metrics for Prometheus.

``/healthz`` says the process answers: no database, no login, nothing to
wait on. ``/readyz`` says it can serve: the database answers, every
migration is applied, the channel layer carries a message, and the sandbox
tool is there. Anyone gets the overall status (200 or 503); staff and a
bearer of STUDIO_HEALTH_TOKEN also get each check's detail.
"""

from __future__ import annotations

import asyncio
import shutil
import time

from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpResponse, HttpResponseForbidden, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from studio.metrics import registry
from studio.operators import is_operator
from studio.runtime import runtime

# Each check's answer is awaited this long at most.
CHECK_SECONDS = 3.0


@login_not_required
@never_cache
@require_GET
def healthz(request) -> HttpResponse:
    return HttpResponse("ok\n", content_type="text/plain")


@login_not_required
@never_cache
@require_GET
async def readyz(request) -> JsonResponse:
    names = ("database", "migrations", "channel_layer", "sandbox")
    results = await asyncio.gather(
        _timed(_database()), _timed(_migrations()), _timed(_channel_layer()), _timed(_sandbox())
    )
    checks = dict(zip(names, results, strict=True))
    ready = all(check["ok"] for check in checks.values())
    body: dict = {"status": "ok" if ready else "unavailable"}
    if await is_operator(request):
        body["checks"] = checks
    return JsonResponse(body, status=200 if ready else 503)


async def _timed(check) -> dict:
    started = time.monotonic()
    try:
        ok, detail = await asyncio.wait_for(check, CHECK_SECONDS)
    except TimeoutError:
        ok, detail = False, f"no answer in {CHECK_SECONDS:g} s"
    except Exception as exc:
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return {"ok": ok, "detail": detail, "ms": round((time.monotonic() - started) * 1000, 1)}


async def _database() -> tuple[bool, str]:
    def ask() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return connection.vendor

    return True, await runtime().off_loop(ask)


_migrated = False


async def _migrations() -> tuple[bool, str]:
    global _migrated
    if _migrated:  # migrations are not unapplied under a running server
        return True, "all applied"

    def plan() -> list:
        executor = MigrationExecutor(connection)
        return executor.migration_plan(executor.loader.graph.leaf_nodes())

    waiting = await runtime().off_loop(plan)
    if waiting:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in waiting[:5])
        return False, f"{len(waiting)} not applied (manage.py migrate): {names}"
    _migrated = True
    return True, "all applied"


async def _channel_layer() -> tuple[bool, str]:
    layer = get_channel_layer()
    if layer is None:
        return False, "no channel layer configured"
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "health.ping"})
    message = await layer.receive(channel)
    return message.get("type") == "health.ping", type(layer).__name__


async def _sandbox() -> tuple[bool, str]:
    if settings.STUDIO_SANDBOX == "none":
        return True, "off (STUDIO_SANDBOX=none)"
    path = shutil.which("bwrap")
    return (True, path) if path else (False, "bubblewrap (bwrap) is not installed")


@login_not_required
@never_cache
@require_GET
async def metrics(request) -> HttpResponse:
    """The metrics (``studio.metrics``), in Prometheus' format, for operators."""
    if not await is_operator(request):
        return HttpResponseForbidden("Metrics are for staff, or a bearer of STUDIO_HEALTH_TOKEN.\n")
    body = await runtime().off_loop(lambda: generate_latest(registry()))
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
