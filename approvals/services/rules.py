"""Rules: what they say about a call, and the member's own Allow rules.

Precedence: any matching Deny, then Review, then Ask, then Allow, then the
conversation's Confirm switch. Deny, Review and Ask look at every piece of
the call Studio could read (``Reading.seen``); an Allow with a pattern
vouches only for a subject read in full (``Reading.plain``), each part of
it matching. Where a subject could not be read in full, a Deny, Review or
Ask rule of the tool may be hiding in it, so no Allow of any kind, nor the
Confirm switch, lets it run without a person.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from approvals.models import ToolApproval, ToolRule
from approvals.notify import RuleUsed, tell
from approvals.patterns import glob_escape, glob_match
from studio.db import one_or_none
from studio.metrics import RULE_HITS
from studio.shell import Reading, read_arguments

Action = ToolRule.Action
Reason = ToolApproval.Reason
Scope = ToolRule.Scope

# How rules read a call of a given tool: (tool name, arguments, its schema)
# -> (subject, reading). The chat app, which knows its tools, installs it when
# it starts; without it a call is read argument by argument.
CallReader = Callable[[str, dict, dict | None], tuple[str, Reading]]


def _read_as_arguments(tool_name: str, arguments: dict, schema: dict | None):
    return read_arguments(arguments, schema)


_reader: list[CallReader] = [_read_as_arguments]


def call_reader_install(reader: CallReader) -> None:
    """Say how calls are read (``chat.apps``): decisions read edited calls this way."""
    _reader[0] = reader


# The names of the tools rules may name (the built-ins, the MCP servers'
# tools as last listed): installed by the chat app like the reader above.
_tool_names: list[Callable[[], list[str]]] = [list]


def tool_names_install(names: Callable[[], list[str]]) -> None:
    """Say which tools there are (``chat.apps``): a rule naming another is a typo."""
    _tool_names[0] = names


def tool_names() -> list[str]:
    """The chat's tools, and the ones agents asked for through the API."""
    asked = (
        ToolApproval.objects.filter(source=ToolApproval.Source.API)
        .order_by()
        .values_list("tool_name", flat=True)
        .distinct()
    )
    return [*_tool_names[0](), *asked]


# The parameter schema of a tool the chat knows, by name (None: not one of
# them): installed by the chat app, so an API call of ``terminal`` is read
# and checked as the chat's terminal calls are.
_schemas: list[Callable[[str], dict | None]] = [lambda name: None]


def tool_schema_install(schema_of: Callable[[str], dict | None]) -> None:
    _schemas[0] = schema_of


def tool_schema(name: str) -> dict | None:
    return _schemas[0](name)


def call_read(*, tool_name: str, arguments: dict, schema: dict | None) -> tuple[str, Reading]:
    """The subject rules match for this call, and how they read it."""
    return _reader[0](tool_name, arguments, schema)


@dataclass(frozen=True)
class Verdict:
    """What the rules say about one call: allow, ask, review or deny, and why."""

    action: str
    reason: str = ""  # for calls that do not ask: RULE, POLICY or CONFIRM_OFF
    rule: ToolRule | None = None


def policy_rules() -> list[ToolRule]:
    """STUDIO_AUTO_ALLOW_TOOLS as the admin Allow rules it stands for (never saved)."""
    return [
        ToolRule(
            tool=name,
            action=Action.ALLOW,
            scope=Scope.EVERYONE,
            note="STUDIO_AUTO_ALLOW_TOOLS",
        )
        for name in settings.STUDIO_AUTO_ALLOW_TOOLS
    ]


def rules_for(conversation) -> list[ToolRule]:
    """Every rule that applies in ``conversation``, the most specific first."""
    order = {Scope.CONVERSATION: 0, Scope.MEMBER: 1, Scope.EVERYONE: 2}
    # Sorted here, newest first within a scope: no ORDER BY to compile for every call.
    rules = list(ToolRule.objects.applying_in(conversation.owner_id, conversation.pk).order_by())
    rules.sort(key=lambda r: (order[r.scope], -r.created_at.timestamp(), -r.pk))
    return rules + policy_rules()


def approval_verdict(
    *,
    conversation,
    tool_name: str,
    subject: str,
    reading: Reading | None = None,
    count: bool = True,
) -> Verdict:
    """Any matching Deny, then Review, then Ask, then Allow, then the Confirm switch.

    So an admin's Ask or Deny holds even where a member switched confirmation
    off. Every automatic outcome names its rule; ``count``: the rule's hit
    count goes up (a decision's second look at its call does not count).
    """
    reading = reading or Reading.whole(subject)
    rules = [r for r in rules_for(conversation) if r.tool in ("*", tool_name)]
    verdict = _verdict(rules, conversation, tool_name, subject, reading)
    if count:
        rule_hit(verdict.rule)
    return verdict


def rule_hit(rule: ToolRule | None) -> None:
    """Count a rule's use (policy rules are not rows: nothing to count)."""
    if rule is not None:
        RULE_HITS.labels(rule.action).inc()
    if rule is not None and rule.pk is not None:
        ToolRule.objects.filter(pk=rule.pk).update(hits=F("hits") + 1, last_hit_at=timezone.now())
        if rule.scope in (Scope.MEMBER, Scope.CONVERSATION):
            _hits_told(rule)


def _hits_told(rule: ToolRule) -> None:
    """A member's own rule: its "used N×" changes in each of their tabs that shows it."""
    hit = one_or_none(
        ToolRule.objects.filter(pk=rule.pk).values(
            "hits", "member_id", "conversation_id", "conversation__owner_id"
        )
    )
    owner = hit and (hit["member_id"] or hit["conversation__owner_id"])
    if owner:
        tell(RuleUsed(rule.pk, hit["hits"], owner, hit["conversation_id"]))


def _verdict(
    rules: list[ToolRule], conversation, tool_name: str, subject: str, reading: Reading
) -> Verdict:
    pieces = (subject, *reading.seen)
    for action in (Action.DENY, Action.REVIEW, Action.ASK):
        for rule in rules:
            if rule.action == action and any(rule.matches(tool_name, p) for p in pieces):
                return _by(rule)
    if reading.plain is None:
        # What the rules could not read may hide what a Deny, Review or Ask
        # of this tool is about: a person decides, a reviewer if one must.
        guards = [r for r in rules if r.action != Action.ALLOW]
        review = next((r for r in guards if r.action == Action.REVIEW), None)
        if review is not None:
            return Verdict(Action.REVIEW, rule=review)
        if guards:
            return Verdict(Action.ASK)
    allows = [r for r in rules if r.action == Action.ALLOW]
    rule = next((r for r in allows if _allows_outright(r, subject)), None)
    if rule is None and reading.plain:
        # Each command of the line must be allowed, each by some rule.
        covering = [
            next((r for r in allows if r.matches(tool_name, p)), None) for p in reading.plain
        ]
        rule = covering[0] if all(covering) else None
    if rule is not None:
        return _by(rule)
    if conversation.confirm_tool_calls:
        return Verdict(Action.ASK)
    return Verdict(Action.ALLOW, Reason.CONFIRM_OFF)


def speaks_for(rule: ToolRule, tool_name: str, subject: str, reading: Reading) -> bool:
    """True when an Allow ``rule`` would take part in allowing this call: no
    pattern, this exact subject, or a part of a subject read in full."""
    if rule.tool not in ("*", tool_name):
        return False
    if _allows_outright(rule, subject):
        return True
    return any(glob_match(p, rule.pattern) for p in reading.plain or ())


def _allows_outright(rule: ToolRule, subject: str) -> bool:
    """No pattern (the whole tool), or the exact subject: read or not, it is allowed."""
    return not rule.pattern or rule.pattern == glob_escape(subject)


def _by(rule: ToolRule) -> Verdict:
    return Verdict(rule.action, Reason.RULE if rule.pk else Reason.POLICY, rule)


def rule_create(
    *, conversation, user, tool: str, pattern: str = "", scope: str = Scope.CONVERSATION
) -> ToolRule:
    """A member's Allow rule, for this conversation or for all their chats."""
    return ToolRule.objects.create(
        tool=tool,
        pattern=pattern,
        action=Action.ALLOW,
        scope=scope,
        member=user if scope == Scope.MEMBER else None,
        conversation=conversation if scope == Scope.CONVERSATION else None,
        created_by=user,
    )


def rule_revoke(*, rule: ToolRule, user) -> bool:
    updated = ToolRule.objects.filter(pk=rule.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=user
    )
    return bool(updated)
