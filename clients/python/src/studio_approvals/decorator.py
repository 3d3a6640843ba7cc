"""``@require_approval``: a function that runs only with arguments Studio approved."""

from __future__ import annotations

import functools
import inspect
import time
import traceback

from studio_approvals.client import AsyncClient, Client


def _arguments(signature: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _call_with(signature: inspect.Signature, approved: dict) -> inspect.BoundArguments:
    # Only the parameters the function has: an edit cannot add one.
    unknown = sorted(set(approved) - set(signature.parameters))
    if unknown:
        raise TypeError(f"the approved arguments name unknown parameters: {unknown}")
    return signature.bind(**approved)


def require_approval(tool: str | None = None, *, client: Client | AsyncClient | None = None,
                     timeout: float = 600, title: str | None = None,
                     report: bool = True):  # fmt: skip
    """Ask Studio before each call of the function, and run it with what was approved.

    ``tool``: the name rules and cards use (default: the function's name).
    Its arguments (bound to its parameters, JSON-serialisable) are what is
    asked for; a person may edit them, and the function then runs with the
    edited ones. A deny raises ``Denied``, no decision within ``timeout``
    raises ``Undecided``; nothing runs then. With ``report``, what the call
    returned (or raised) is kept on the approval's audit row.
    """

    def wrap(fn):
        signature = inspect.signature(fn)
        name = tool or fn.__name__

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def asking(*args, **kwargs):
                arguments = _arguments(signature, args, kwargs)
                own = client is None
                studio = client or AsyncClient()
                try:
                    decision = await studio.approve(
                        name, arguments, timeout=timeout, title=title or name
                    )
                    bound = _call_with(signature, decision.arguments or {})
                    started = time.monotonic()
                    try:
                        result = await fn(*bound.args, **bound.kwargs)
                    except BaseException as exc:
                        if report:
                            await studio.report(decision.id, exit_status=1, output=_failure(exc),
                                                seconds=time.monotonic() - started)  # fmt: skip
                        raise
                    if report:
                        await studio.report(decision.id, exit_status=0, output=repr(result),
                                            seconds=time.monotonic() - started)  # fmt: skip
                    return result
                finally:
                    if own:
                        await studio.close()

            return asking

        @functools.wraps(fn)
        def asking(*args, **kwargs):
            arguments = _arguments(signature, args, kwargs)
            own = client is None
            studio = client or Client()
            try:
                decision = studio.approve(name, arguments, timeout=timeout, title=title or name)
                bound = _call_with(signature, decision.arguments or {})
                started = time.monotonic()
                try:
                    result = fn(*bound.args, **bound.kwargs)
                except BaseException as exc:
                    if report:
                        studio.report(decision.id, exit_status=1, output=_failure(exc),
                                      seconds=time.monotonic() - started)  # fmt: skip
                    raise
                if report:
                    studio.report(decision.id, exit_status=0, output=repr(result),
                                  seconds=time.monotonic() - started)  # fmt: skip
                return result
            finally:
                if own:
                    studio.close()

        return asking

    return wrap


def _failure(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
