"""The house's import rules, checked on the source (every import, also inside functions).

* ``approvals`` imports nothing from ``chat``;
* ``studio`` imports no app, not even for type hints (its wiring aside:
  settings, URLs and the ASGI application);
* no import cycle between Studio's modules;
* ``chat.llm`` and ``chat.tools`` are pure clients and executors: they import
  neither ``approvals`` nor the ORM (``django.db``), and what they count with
  (``studio.metrics``) imports no runtime and no view.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("approvals", "chat", "studio")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, *, type_checking: bool = False) -> set[str]:
    """Modules ``path`` imports anywhere, and under ``if TYPE_CHECKING:`` only
    when ``type_checking``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if type_checking:
            break
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {
        module_name(p): p
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if "migrations" not in p.parts
    }
    edges = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports_of(path):
            # "from chat import render" names a module too: keep what exists.
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def test_approvals_imports_nothing_from_chat():
    offenders = {
        (m, t) for m, ts in graph().items() if m.startswith("approvals") for t in ts
        if t.startswith("chat")
    }  # fmt: skip
    assert offenders == set()


def test_studio_imports_no_app_even_for_type_hints():
    """Issue 54: studio.runtime held chat's run table and, for its type, chat's MCP hub."""
    wiring = {"studio/settings.py", "studio/urls.py", "studio/asgi.py"}
    offenders = set()
    for path in (ROOT / "studio").rglob("*.py"):
        if str(path.relative_to(ROOT)) in wiring:
            continue
        for imported in imports_of(path, type_checking=True):
            if imported.split(".")[0] in ("chat", "approvals"):
                offenders.add((module_name(path), imported))
    assert offenders == set()


def test_llm_clients_and_tools_import_neither_approvals_nor_the_orm():
    offenders = set()
    for package in ("chat/llm", "chat/tools"):
        for path in (ROOT / package).rglob("*.py"):
            for imported in imports_of(path):
                if imported.startswith(("approvals", "django.db")):
                    offenders.add((module_name(path), imported))
    assert offenders == set()


def test_the_metrics_module_is_definitions_only():
    """Issue 54: the /metrics view lived in studio.metrics, so every module that
    counts (the sandbox, the agent) imported the process runtime through it."""
    imported = imports_of(ROOT / "studio" / "metrics.py")
    assert not {m for m in imported if m.startswith(("studio.runtime", "django.http"))}, imported


def test_no_import_cycles():
    edges = graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert cycles == []


def test_the_rules_would_catch_a_violation(tmp_path, monkeypatch):
    """The walker itself works: a planted import is seen, a TYPE_CHECKING one is not."""
    planted = tmp_path / "m.py"
    planted.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from chat.models import Run\n"
        "def f():\n    from chat.services import run_create\n"
    )
    found = imports_of(planted)
    assert "chat.services" in found and "chat.models" not in found
