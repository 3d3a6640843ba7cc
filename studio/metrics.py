"""Prometheus metrics, named ``studio_…``, served on ``/metrics`` to operators
(the view is ``studio.health.metrics``: this module is definitions only, so
the code that counts imports no runtime).

Events (decisions, tool calls, model requests, failures, rule hits) are
counted where they happen, in the process they happen in. With
PROMETHEUS_MULTIPROC_DIR set (the deploy units set it; one directory per
host, emptied at start) each process writes its figures there and a scrape
reaching any process adds them all up. The state of things (calls waiting,
runs by state) is read from the database at scrape time by the collectors
the apps add (``collectors``): the same answer from every process.
"""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, multiprocess

# Seconds to a person's decision reach from moments to days.
DECISION_BUCKETS = (1, 5, 15, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 3 * 24 * 3600)
TOOL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

DECISION_SECONDS = Histogram(
    "studio_decision_seconds",
    "Time from a call's request to a person's decision.",
    ["tool", "outcome"],
    buckets=DECISION_BUCKETS,
)
TOOL_CALL_SECONDS = Histogram(
    "studio_tool_call_seconds",
    "Time a tool call ran.",
    ["tool", "result"],
    buckets=TOOL_BUCKETS,
)
MODEL_REQUEST_SECONDS = Histogram(
    "studio_model_request_seconds",
    "Time a model request took, to its last streamed piece.",
    ["outcome"],
    buckets=MODEL_BUCKETS,
)
MODEL_TOKENS = Counter(
    "studio_model_tokens",
    "Tokens the model server reported, by kind (prompt, completion).",
    ["kind"],
)
SANDBOX_FAILURES = Counter(
    "studio_sandbox_failures",
    "Tool calls the sandbox failed to run or stopped (by why).",
    ["reason"],
)
WEBHOOK_FAILURES = Counter(
    "studio_webhook_failures", "Approval webhook POSTs that failed (after each attempt)."
)
RULE_HITS = Counter("studio_rule_hits", "Calls a rule decided, by its action.", ["action"])

# Collectors of the state of things, read from the database at scrape time.
_collectors: list = []


def collector_add(collector) -> None:
    """(An app's ``ready``.) Report ``collector`` with every scrape."""
    _collectors.append(collector)
    if not _multiprocess():
        REGISTRY.register(collector)


def _multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def registry() -> CollectorRegistry:
    """What one scrape reports: every process's events, and the database's state."""
    if not _multiprocess():
        return REGISTRY
    scrape = CollectorRegistry()
    multiprocess.MultiProcessCollector(scrape)
    for collector in _collectors:
        scrape.register(collector)
    return scrape
