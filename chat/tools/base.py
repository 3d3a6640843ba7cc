from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from studio.cancel import CancelToken
from studio.shell import Reading, read_arguments
from studio.text import canonical_json


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back: the text the model reads, and whether it worked.

    A failure's text starts with ``Error:`` because that is what the model
    should read; code looks at ``ok``, never at the text. ``images`` are
    files the call produced that the chat shows under the output (name,
    size, MIME type, and whether it is small enough to show inline).
    """

    text: str
    ok: bool = True
    images: tuple[dict, ...] = ()
    # The kept interpreter the call ran in (a chat's python session), for the audit.
    session: str = ""
    # Cut short by Stop (its text says so to the model; the chat says who).
    stopped: bool = False

    @classmethod
    def error(cls, message: str) -> ToolResult:
        return cls(f"Error: {message}", ok=False)


RunFn = Callable[..., ToolResult]
# A running call's latest output (its last screenful), for its card; called
# from the thread the call runs on, at most every LIVE_SECONDS.
Progress = Callable[[str], None]
LIVE_SECONDS = 0.25
# The last lines of it a card shows.
LIVE_LINES = 30


@dataclass(frozen=True)
class Tool:
    """A tool the agent may call: its schema for the model and how to run it.

    ``run(arguments, *, cancel, timeout, workspace) -> ToolResult``, and
    ``progress=`` too where ``live`` (its output shows while it runs). ``server``
    and ``hints`` describe tools of MCP servers (shown on the card; never
    trusted to skip the gate).
    """

    name: str
    description: str
    parameters: dict
    run: RunFn
    server: str = ""
    hints: tuple[str, ...] = field(default=())
    # The argument rules match against (a command line, a URL, code); without
    # one, rules match the arguments as canonical JSON.
    subject_argument: str = ""
    # How rules read the subject (a command line as bash reads it); without
    # one, the subject is one part.
    read_subject: Callable[[str], Reading] = Reading.whole
    # A tool that keeps state between calls: how a call runs in a fresh
    # interpreter instead, when its decision says so.
    run_fresh: RunFn | None = None
    # Its run (and run_fresh) take ``progress``: its output shows while it runs.
    live: bool = False

    def subject(self, arguments: dict) -> str:
        value = arguments.get(self.subject_argument) if self.subject_argument else None
        return value if isinstance(value, str) else canonical_json(arguments)

    def reading(self, arguments: dict) -> tuple[str, Reading]:
        """The subject rules match and how they read it: a built-in's one argument
        its own way, any other call argument by argument (``read_arguments``)."""
        if not self.subject_argument:
            return read_arguments(arguments, self.parameters)
        subject = self.subject(arguments)
        return subject, self.read_subject(subject)

    @property
    def label(self) -> str:
        """How the card names it: ``server › tool`` for MCP tools."""
        if self.server:
            return f"{self.server} › {self.name.split('__', 1)[1]}"
        return self.name

    def schema(self) -> dict:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def validate(self, arguments: object) -> str | None:
        """A message saying what is wrong with ``arguments``, or None."""
        if not isinstance(arguments, dict):
            return "arguments must be a JSON object"
        try:
            error = next(iter(sorted(self._validator.iter_errors(arguments), key=str)), None)
        except SchemaError as exc:
            return f"the tool's own schema is invalid: {exc.message}"
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{error.message}" + (f" (at '{where}')" if where else "")

    @cached_property
    def _validator(self) -> Draft202012Validator:
        # Built once per tool: a call is checked when it is planned and again
        # when it runs (the arguments may have been edited in between).
        return Draft202012Validator(self.parameters)

    def execute(
        self,
        arguments: dict,
        *,
        cancel: CancelToken,
        timeout: float,
        workspace: Path,
        fresh: bool = False,
        progress: Progress | None = None,
    ) -> ToolResult:
        problem = self.validate(arguments)
        if problem:
            return ToolResult.error(f"{problem}.")
        run = self.run_fresh if fresh and self.run_fresh is not None else self.run
        live = {"progress": progress} if self.live and progress is not None else {}
        try:
            return run(arguments, cancel=cancel, timeout=timeout, workspace=workspace, **live)
        except Exception as exc:  # a tool bug must not kill the run
            return ToolResult.error(f"the {self.name} tool failed: {type(exc).__name__}: {exc}")
