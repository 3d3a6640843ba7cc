"""The OpenAPI 3.1 document of /api/v1/ (served at /api/v1/schema)."""

from __future__ import annotations

_ERROR = {
    "description": "What is wrong, in words",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"error": {"type": "string"}}}
        }
    },
}
_APPROVAL_REF = {"$ref": "#/components/schemas/Approval"}


def _answer(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _APPROVAL_REF}}}


SCHEMA: dict = {
    "openapi": "3.1.0",
    "info": {
        "title": "Studio approvals API",
        "version": "1",
        "description": (
            "Ask the team's Studio for a decision on a tool call of an agent outside "
            "the chat. The same rules apply as to chat calls; pending calls wait in "
            "the member's inbox (and the reviewers', when a Review rule matched)."
        ),
    },
    "servers": [{"url": "/api/v1"}],
    "security": [{"token": []}],
    "paths": {
        "/approvals": {
            "post": {
                "summary": "Ask for a decision on one call",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Ask"}}
                    },
                },
                "responses": {
                    "201": _answer("Asked: pending, or allowed at once by a rule"),
                    "200": _answer("The idempotency key's earlier row (Idempotent-Replayed)"),
                    "403": _answer("Blocked by a Deny rule (the row names the rule)"),
                    "400": _ERROR,
                    "401": _ERROR,
                    "409": _ERROR,
                    "413": _ERROR,
                },
            }
        },
        "/approvals/{id}": {
            "get": {
                "summary": "Where the call stands; with wait, its decision when it comes",
                "parameters": [
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "wait",
                        "in": "query",
                        "description": "Seconds to wait for a decision (0 to 60)",
                        "schema": {"type": "number", "minimum": 0, "maximum": 60},
                    },
                ],
                "responses": {
                    "200": _answer("The call now (still pending when wait ran out)"),
                    "400": _ERROR,
                    "401": _ERROR,
                    "404": _ERROR,
                },
            }
        },
        "/approvals/{id}/result": {
            "post": {
                "summary": "Keep what an allowed call did on its audit row (once)",
                "parameters": [
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Result"}}
                    },
                },
                "responses": {
                    "200": _answer("Recorded"),
                    "400": _ERROR,
                    "401": _ERROR,
                    "404": _ERROR,
                    "409": _ERROR,
                },
            }
        },
    },
    "components": {
        "securitySchemes": {
            "token": {
                "type": "http",
                "scheme": "bearer",
                "description": "A member's API token (Studio › API tokens), studio_…",
            }
        },
        "schemas": {
            "Ask": {
                "type": "object",
                "required": ["tool"],
                "additionalProperties": False,
                "properties": {
                    "tool": {
                        "type": "string",
                        "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$",
                        "description": "The tool's name; terminal, python and web_fetch "
                        "are read as the chat reads them (a command line as bash does)",
                    },
                    "arguments": {"type": "object", "description": "At most 64 KiB as JSON"},
                    "title": {"type": "string", "maxLength": 200},
                    "context_url": {"type": "string", "format": "uri", "maxLength": 2000},
                    "idempotency_key": {"type": "string", "maxLength": 100},
                    "callback_url": {
                        "type": "string",
                        "format": "uri",
                        "maxLength": 2000,
                        "description": "POSTed the decision when it comes, signed "
                        "(Studio-Signature: t=<unix>,v1=HMAC-SHA256 of '<t>.<body>' keyed "
                        "with the hex SHA-256 of the token's secret); public addresses only",
                    },
                    "timeout": {
                        "type": "number",
                        "minimum": 1,
                        "maximum": 604800,
                        "description": "Seconds until an undecided call ends as timed out",
                    },
                    "schema": {
                        "type": "object",
                        "description": "The arguments' JSON Schema: edits are checked "
                        "against it (ignored for the chat's own tools)",
                    },
                },
            },
            "Result": {
                "type": "object",
                "required": ["exit_status"],
                "additionalProperties": False,
                "properties": {
                    "exit_status": {"type": "integer", "description": "0: it succeeded"},
                    "output": {"type": "string", "maxLength": 1048576},
                    "seconds": {"type": "number", "minimum": 0},
                },
            },
            "Approval": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "tool": {"type": "string"},
                    "title": {"type": "string"},
                    "status": {"enum": ["pending", "allowed", "denied"]},
                    "reason": {"type": "string"},
                    "reason_label": {"type": "string"},
                    "needs_review": {"type": "boolean"},
                    "requested_at": {"type": "string", "format": "date-time"},
                    "expires_at": {"type": ["string", "null"], "format": "date-time"},
                    "decided_at": {"type": ["string", "null"], "format": "date-time"},
                    "decided_by": {"type": ["string", "null"]},
                    "note": {"type": "string"},
                    "arguments": {"type": "object"},
                    "arguments_sha256": {"type": "string"},
                    "approved_arguments": {
                        "type": ["object", "null"],
                        "description": "What may run (edited by a person, or as asked)",
                    },
                    "approved_sha256": {"type": ["string", "null"]},
                    "edited": {"type": "boolean"},
                    "rule": {"type": ["object", "null"]},
                    "result_recorded": {"type": "boolean"},
                },
            },
        },
    },
}
