from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from studio.cancel import CancelToken


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back: the text the model reads, and whether it worked.

    A failure's text starts with ``Error:`` because that is what the model
    should read; code looks at ``ok``, never at the text.
    """

    text: str
    ok: bool = True

    @classmethod
    def error(cls, message: str) -> ToolResult:
        return cls(f"Error: {message}", ok=False)


RunFn = Callable[..., ToolResult]


@dataclass(frozen=True)
class Tool:
    """A tool the agent may call: its schema for the model and how to run it.

    ``run(arguments, *, cancel, timeout, workspace) -> ToolResult``.
    """

    name: str
    description: str
    parameters: dict
    run: RunFn

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
        properties = self.parameters.get("properties", {})
        for name in self.parameters.get("required", []):
            if name not in arguments:
                return f"missing required argument '{name}'"
        for name, value in arguments.items():
            if name not in properties:
                return f"unknown argument '{name}'"
            expected = properties[name].get("type")
            if expected == "string" and not isinstance(value, str):
                return f"argument '{name}' must be a string"
        return None

    def execute(
        self, arguments: dict, *, cancel: CancelToken, timeout: float, workspace: Path
    ) -> ToolResult:
        problem = self.validate(arguments)
        if problem:
            return ToolResult.error(f"{problem}.")
        try:
            return self.run(arguments, cancel=cancel, timeout=timeout, workspace=workspace)
        except Exception as exc:  # a tool bug must not kill the run
            return ToolResult.error(f"the {self.name} tool failed: {type(exc).__name__}: {exc}")
