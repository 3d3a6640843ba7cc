"""Django, Channels, daphne and asgiref as shipped: app code uses their public APIs only.

Checked on the source of every app module (migrations aside):

* no name starting with ``_`` imported from any package not Studio's
  (third-party or the standard library), nor from a private module of one,
  and no private attribute read off one (``signal.Signals._value2member_map_``);
* nothing imported from ``django.db.models.sql``, ``daphne.http_protocol``
  or Twisted;
* no assignment to an attribute of a module or class imported from outside
  Studio (``setattr`` included): no monkeypatches.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("approvals", "chat", "studio", "deploy")
# Underscored by an old convention, documented and public.
PUBLIC_UNDERSCORED = {"os._exit", "sys._getframe"}
FORBIDDEN_MODULES = ("django.db.models.sql", "daphne.http_protocol", "twisted")


def app_modules() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(source: str) -> list[str]:
    """What in ``source`` reaches into a framework or patches someone else's code."""
    tree = ast.parse(source)
    found: list[str] = []
    outside: set[str] = set()  # names bound to modules or classes not of Studio
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = alias.name
                if _within(module, FORBIDDEN_MODULES):
                    found.append(f"imports {module}")
                if _top(module) not in PACKAGES and any(map(_private, module.split("."))):
                    found.append(f"imports private {module}")
                if _top(module) not in PACKAGES:
                    outside.add(alias.asname or _top(module))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            module = node.module
            if _within(module, FORBIDDEN_MODULES):
                found.append(f"imports from {module}")
            if _top(module) not in PACKAGES:
                if any(map(_private, module.split("."))):
                    found.append(f"imports from private {module}")
                for alias in node.names:
                    if _private(alias.name) and f"{module}.{alias.name}" not in PUBLIC_UNDERSCORED:
                        found.append(f"imports {alias.name} from {module}")
            if _top(module) not in PACKAGES and module != "__future__":
                outside.update(alias.asname or alias.name for alias in node.names)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and _root_name(node) in outside
            and ast.unparse(node) not in PUBLIC_UNDERSCORED
        ):
            found.append(f"reads {ast.unparse(node)}")
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and _root_name(target) in outside:
                found.append(f"assigns {ast.unparse(target)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and _root_name(node.args[0]) in outside
        ):
            found.append(f"calls {ast.unparse(node)}")
    return found


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


@pytest.mark.parametrize("path", app_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_app_code_uses_public_apis_only(path):
    assert violations(path.read_text()) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from django.core.handlers.asgi import _x", "imports _x from django.core.handlers.asgi"),
        ("from mcp.shared._httpx_utils import f", "imports from private mcp.shared._httpx_utils"),
        ("import signal\nsignal.Signals._value2member_map_", "reads signal.Signals._value2m"),
        ("from openai import _client", "imports _client from openai"),
        ("import os\nos._exit(1)\nos.__name__", None),
        ("from django.utils._os import safe_join", "imports from private django.utils._os"),
        ("from django.db.models.sql import InsertQuery", "imports from django.db.models.sql"),
        ("import daphne.http_protocol", "imports daphne.http_protocol"),
        ("from twisted.web import http", "imports from twisted.web"),
        ("from daphne import http_protocol\nhttp_protocol.WebRequest = 1", "assigns"),
        ("import gc\ngc.callbacks = []", "assigns gc.callbacks"),
        ("from channels.layers import X\nX.send = f", "assigns X.send"),
        ("from channels.layers import X\nsetattr(X, 'send', f)", "calls setattr"),
        ("import django.conf\ndjango.conf.settings.X += 1", "assigns django.conf.settings.X"),
    ],
)
def test_the_check_finds_each_kind(source, found):
    if found is None:
        assert violations(source) == []
    else:
        assert any(v.startswith(found) for v in violations(source)), violations(source)


def test_the_check_leaves_studios_own_code_alone():
    source = (
        "from approvals.gate import Gate\n"
        "from chat import engine\n"
        "class A:\n"
        "    def f(self):\n"
        "        self._x = 1\n"
        "        return engine._private_helper\n"
        "Gate.limit = 3\n"
        "engine.LIMIT = 4\n"
    )
    assert violations(source) == []
