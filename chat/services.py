"""Chat services: conversations, their messages and settings, and a run's start
(its rows' later transitions are ``chat.runs.state``)."""

from __future__ import annotations

import logging
import re
import shutil
import threading
from datetime import datetime
from pathlib import Path

from django.contrib.postgres.search import SearchQuery, SearchVector
from django.core.files.storage import default_storage
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from approvals.models import ToolApproval, ToolRule, can_review
from approvals.notify import SessionsCheck, tell
from approvals.services.rules import rule_revoke
from chat.models import Conversation, LanguageModel, Message, Run
from chat.tools import builtin_tools
from chat.tools.images import storage_name
from chat.tools.sessions import SESSIONS
from studio import process
from studio.cancel import CancelToken
from studio.db import one_or_none
from studio.sessions import session_digest

logger = logging.getLogger(__name__)

TITLE_LENGTH = 48
TITLE_MAX = 200
# Sidebar search: at most this many words, each matched as a word's start.
SEARCH_WORDS = 8
SIDEBAR_LENGTH = 100


class RunBusy(Exception):
    """The conversation already has a run going."""


def member_sessions_recheck(*, user_id: int, ended_session: str | None = None) -> None:
    """After commit, make every open socket of the member re-check its session."""
    tell(SessionsCheck(user_id, session_digest(ended_session)))


def conversation_start(*, owner, title: str = "New chat") -> Conversation:
    """A chat to start in: the member's blank one if there is one, else a new one.

    A chat nobody has written in yet is reused, so "New chat" clicked again
    and again does not pile up empty conversations in the list.
    """
    blank = (
        Conversation.objects.owned_by(owner)
        .filter(messages__isnull=True, runs__isnull=True)
        .order_by("-pk")
        .first()
    )
    if blank is None:
        return Conversation.objects.create(owner=owner, title=title[:TITLE_MAX] or "New chat")
    blank.title = title[:TITLE_MAX] or "New chat"
    blank.archived_at = None
    blank.save(update_fields=["title", "archived_at", "updated_at"])  # to the top of the list
    return blank


class ConversationRefused(Exception):
    """A conversation action that cannot be done; its message says why."""


def conversation_list(*, owner, query: str = "", archived: bool = False):
    """The member's conversations, newest activity first: the sidebar and the index.

    ``query`` keeps those whose title or whose messages (the member's and the
    agent's words, not tool output) hold every word of it, as the start of a
    word: PostgreSQL's full-text search there, a plain substring match on SQLite.
    """
    conversations = Conversation.objects.owned_by(owner).filter(archived_at__isnull=not archived)
    words = search_words(query)
    if words:
        conversations = _matching(conversations, words)
    waiting = ToolApproval.objects.pending().filter(conversation=OuterRef("pk"))
    return conversations.annotate(waiting=Exists(waiting)).order_by("-updated_at", "-pk")[
        :SIDEBAR_LENGTH
    ]


def search_words(query: str) -> list[str]:
    return re.findall(r"\w+", query.lower())[:SEARCH_WORDS]


def _matching(conversations, words: list[str]):
    said = Message.objects.filter(
        conversation=OuterRef("pk"), role__in=[Message.Role.USER, Message.Role.ASSISTANT]
    )
    if connection.vendor == "postgresql":
        # Words only (\w+), so the raw query cannot be malformed; ":*" matches
        # a word's start, so "pyth" finds "python" while typing.
        query = SearchQuery(
            " & ".join(f"{word}:*" for word in words), search_type="raw", config="simple"
        )
        in_messages = said.annotate(found=SearchVector("content", config="simple"))
        return conversations.annotate(
            found=SearchVector("title", config="simple"),
        ).filter(Q(found=query) | Q(Exists(in_messages.filter(found=query))))
    in_title = Q()
    in_messages = said
    for word in words:
        in_title &= Q(title__icontains=word)
        in_messages = in_messages.filter(content__icontains=word)
    return conversations.filter(in_title | Q(Exists(in_messages)))


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    title = " ".join(title.split())
    if not title:
        raise ConversationRefused("Give the chat a name.")
    if len(title) > TITLE_MAX:
        raise ConversationRefused(f"Names are limited to {TITLE_MAX} characters.")
    conversation.title = title
    # Not updated_at: a new name is not new activity, so the list keeps its order.
    Conversation.objects.filter(pk=conversation.pk).update(title=title)
    return conversation


def conversation_archive(*, conversation: Conversation, archived: bool) -> Conversation:
    conversation.archived_at = timezone.now() if archived else None
    Conversation.objects.filter(pk=conversation.pk).update(archived_at=conversation.archived_at)
    return conversation


def conversation_share(*, conversation: Conversation, shared: bool) -> Conversation:
    """Share the chat read-only with the team, or stop (its member's choice)."""
    if shared and conversation.shared_at is None:
        conversation.shared_at = timezone.now()
    elif not shared:
        conversation.shared_at = None
    Conversation.objects.filter(pk=conversation.pk).update(shared_at=conversation.shared_at)
    return conversation


def conversation_shared_with(*, conversation_id: int, user) -> Conversation | None:
    """Another member's chat they share with the team, for ``user`` to read."""
    return one_or_none(
        Conversation.objects.shared()
        .exclude(owner=user)
        .select_related("owner")
        .filter(pk=conversation_id)
    )


def conversations_shared_by_others(*, user, limit: int = 30) -> list[Conversation]:
    """What teammates share, newest first (the index lists it)."""
    return list(
        Conversation.objects.shared()
        .exclude(owner=user)
        .select_related("owner")
        .order_by("-shared_at")[:limit]
    )


def conversation_delete(*, conversation: Conversation, user) -> None:
    """Delete the chat for its member: messages, runs and files; not its audit.

    Its approval rows stay, and so does the conversation row they point to,
    marked deleted (no member page shows it again). Its rules for this chat are
    revoked. A chat whose run goes on is refused: Stop it first. The row is
    marked before the check, and a run's start updates the same row, so a
    message sent meanwhile either lands before (and the delete is refused) or
    finds the chat deleted.
    """
    deleted_at = timezone.now()
    with transaction.atomic():
        marked = Conversation.objects.filter(
            pk=conversation.pk, owner=user, deleted_at__isnull=True
        ).update(deleted_at=deleted_at)
        if not marked:
            raise ConversationRefused("That chat is already deleted.")
        if Run.objects.running().filter(conversation=conversation).exists():
            transaction.set_rollback(True)
            raise ConversationRefused("This chat's run is still going. Stop it, then delete.")
        Message.objects.filter(conversation=conversation).delete()
        Run.objects.filter(conversation=conversation).delete()
        ToolRule.objects.active().filter(
            scope=ToolRule.Scope.CONVERSATION, conversation=conversation
        ).update(revoked_at=timezone.now(), revoked_by=user)
    conversation.deleted_at = deleted_at
    transaction.on_commit(lambda: _files_remove(conversation))


def conversations_purge_deleted(*, dry_run: bool = False) -> int:
    """Remove the deleted chats no approval row points to any more; how many."""
    emptied = Conversation.objects.filter(deleted_at__isnull=False).exclude(
        Exists(ToolApproval.objects.filter(conversation=OuterRef("pk")))
    )
    if dry_run:
        return emptied.count()
    return emptied.delete()[1].get(Conversation._meta.label, 0)


def _files_remove(conversation: Conversation) -> None:
    """Its workspace and Studio's copies of its images (best effort: logged)."""
    # rmtree never follows a symlink a tool left in the workspace.
    shutil.rmtree(conversation.workspace, ignore_errors=True)
    folder = storage_name(conversation.workspace.name, "")
    try:
        _storage_remove(default_storage, folder.rstrip("/"))
    except OSError:
        logger.warning("could not remove the images of conversation %s", conversation.pk)


def _storage_remove(storage, folder: str) -> None:
    if not storage.exists(folder):
        return
    folders, files = storage.listdir(folder)
    for name in files:
        storage.delete(f"{folder}/{name}")
    for name in folders:
        _storage_remove(storage, f"{folder}/{name}")
    storage.delete(folder)


def conversation_settings_update(
    *,
    conversation: Conversation,
    confirm_tool_calls: bool,
    enabled_tools: list[str],
    model: str = "",
) -> Conversation:
    """Save the panel: built-ins are switched on, MCP tools (on by default) off,
    and the model (an enabled one's id, or "" for the default). An unknown or
    disabled model is refused with ``ConversationRefused`` and nothing is saved."""
    from chat.mcp import known_tool_names

    choice = None
    if model:
        choice = LanguageModel.objects.filter(pk=int(model) if model.isdigit() else 0).first()
        if choice is None or not choice.enabled:
            raise ConversationRefused("That model is not offered (any more). Pick another.")
    conversation.model = choice
    chosen = set(enabled_tools)
    conversation.confirm_tool_calls = confirm_tool_calls
    conversation.enabled_tools = [name for name in builtin_tools() if name in chosen]
    conversation.disabled_tools = [name for name in known_tool_names() if name not in chosen]
    conversation.save(
        update_fields=[
            "confirm_tool_calls",
            "enabled_tools",
            "disabled_tools",
            "model",
            "updated_at",
        ]
    )
    return conversation


def conversation_image(*, conversation: Conversation, key: str):
    """(open file, MIME type) of Studio's copy of an image a tool of this
    conversation made, or None. Only image types, only by the key the copy
    was saved under; the workspace itself is never read here."""
    from pathlib import PurePosixPath

    from django.core.exceptions import SuspiciousFileOperation
    from django.core.files.storage import default_storage

    from chat.tools.images import IMAGE_TYPES, storage_name

    path = PurePosixPath(key)
    mime = IMAGE_TYPES.get(path.suffix.lower())
    if mime is None or "\x00" in key or len(path.parts) != 2 or ".." in path.parts:
        return None
    try:
        return default_storage.open(storage_name(conversation.workspace.name, key), "rb"), mime
    except (OSError, SuspiciousFileOperation, ValueError):
        return None


def conversation_under_review(*, conversation_id: int, user) -> Conversation | None:
    """Another member's conversation a reviewer may read while one of its calls
    waits for a reviewer (read-only: no sending, no settings)."""
    if not can_review(user):
        return None
    waiting = ToolApproval.objects.pending().filter(
        conversation_id=conversation_id, needs_review=True
    )
    if not waiting.exists():
        return None
    return one_or_none(Conversation.objects.select_related("owner").filter(pk=conversation_id))


def conversation_rule_revoke(*, conversation: Conversation, rule_id: int, user) -> bool:
    """Revoke one of the member's own rules shown in this conversation's panel."""
    rule = one_or_none(
        ToolRule.objects.active()
        .filter(pk=rule_id)
        .filter(
            Q(scope=ToolRule.Scope.CONVERSATION, conversation=conversation)
            | Q(scope=ToolRule.Scope.MEMBER, member=user)
        )
    )
    if rule is None or conversation.owner_id != user.pk:
        return False
    return rule_revoke(rule=rule, user=user)


class ForkRefused(Exception):
    """The message to edit or regenerate from is not (or no longer) on the chat's branch."""


def run_create(
    *,
    run_id: str,
    conversation_id: int,
    user,
    text: str | None,
    owner: str,
    fork_from: int | None = None,
) -> tuple:
    """Claim the conversation for a new run, owned by ``owner``, and save the
    user's message (None: a retry, from the conversation as it is); returns
    (run, message or None).

    The database's partial unique index makes the claim atomic across
    processes: a conversation whose run goes on (working or waiting, in any
    process) refuses a second one with ``RunBusy``.
    """
    conversation = (
        Conversation.objects.owned_by(user).select_related("owner").get(pk=conversation_id)
    )
    try:
        with transaction.atomic():
            # The owner as read here, not ``user``: a view's ``request.user``
            # is a lazy object that holds its whole request.
            run = Run.objects.create(
                id=run_id,
                conversation=conversation,
                started_by=conversation.owner,
                owner=owner,
                owner_process=process.identity() if owner else "",
                stepped_by=owner,
                # No owner: a process that steps no runs hands it to one that does.
                handed_over=not owner,
            )
            if fork_from is not None:
                _supersede_from(conversation, fork_from)
            message = None
            if text is not None:
                message = Message.objects.create(
                    conversation=conversation, run=run, role=Message.Role.USER, content=text
                )
            if conversation.title == "New chat" and text:
                conversation.title = _title_from(text)
            # A conditional update: a delete that marked the row first wins,
            # and this run is rolled back (see conversation_delete). Writing in
            # an archived chat brings it back to the list.
            started = Conversation.objects.filter(pk=conversation.pk, deleted_at__isnull=True)
            if not started.update(
                title=conversation.title, archived_at=None, updated_at=timezone.now()
            ):
                raise Conversation.DoesNotExist(conversation_id)
    except IntegrityError:
        raise RunBusy(conversation_id) from None
    return run, message


def _supersede_from(conversation: Conversation, message_id: int) -> None:
    """Fold away the branch from this message on; an edit or a regenerate starts
    a new one. Under the new run's claim, so no run writes to the branch meanwhile."""
    branch = Message.objects.filter(conversation=conversation, superseded_at__isnull=True)
    at = branch.filter(pk=message_id).values_list("created_at", flat=True).first()
    if at is None:
        raise ForkRefused(message_id)
    later = Q(created_at__gt=at) | Q(created_at=at, pk__gte=message_id)
    branch.filter(later).update(superseded_at=timezone.now())


def regenerate_point(conversation_id: int) -> tuple[bool, int | None]:
    """Where a regenerate forks: (whether there is a turn to run again, the
    first message after the member's last one, or None when nothing answered it)."""
    branch = Message.objects.filter(conversation_id=conversation_id, superseded_at__isnull=True)
    last_asked = branch.filter(role=Message.Role.USER).order_by("-created_at", "-id").first()
    if last_asked is None:
        return False, None
    after = branch.filter(
        Q(created_at__gt=last_asked.created_at)
        | Q(created_at=last_asked.created_at, pk__gt=last_asked.pk)
    )
    return True, after.order_by("created_at", "id").values_list("pk", flat=True).first()


def editable_message(*, conversation_id: int, message_id: int) -> bool:
    """A member's message on the chat's branch (an edit forks from it)."""
    return Message.objects.filter(
        pk=message_id,
        conversation_id=conversation_id,
        role=Message.Role.USER,
        superseded_at__isnull=True,
    ).exists()


def python_session_current(workspace: Path, started_at: datetime) -> bool:
    """Whether a python session of this workspace started then may go on: no
    Stop or Restart of its conversation since (``chat.tools.sessions`` asks)."""
    match = re.fullmatch(r"conversation-(\d+)", workspace.name)
    if match is None:
        return True  # not a conversation's workspace (a bare one in tests)
    reset = one_or_none(
        Conversation.objects.filter(pk=int(match.group(1))).values_list(
            "python_reset_at", flat=True
        )
    )
    return reset is None or reset < started_at


def python_sessions_reset(*, conversation_id: int) -> None:
    """End the conversation's python session, in this process at once and in any
    other at its next heartbeat (or its next call there)."""
    Conversation.objects.filter(pk=conversation_id).update(python_reset_at=timezone.now())
    SESSIONS.end(Conversation(pk=conversation_id).workspace)


def conversation_retryable(conversation_id: int) -> bool:
    """Its last word is an error (the model was down, say): a retry may ask again."""
    last = (
        Message.objects.filter(conversation_id=conversation_id, superseded_at__isnull=True)
        .order_by("-created_at", "-id")
        .values_list("role", flat=True)
        .first()
    )
    return last == Message.Role.ERROR


def _title_from(text: str) -> str:
    """A short, readable name from a first message: its first line of words
    (not a code fence's marker, nor markdown's marks), cut at a word."""
    lines = (line.strip() for line in text.splitlines())
    words = next((line for line in lines if line and not line.startswith("```")), "")
    line = " ".join(words.replace("`", "").lstrip("#>*- ").split())
    if len(line) <= TITLE_LENGTH:
        return line or "New chat"
    cut = line[: TITLE_LENGTH - 1].rsplit(" ", 1)[0]
    return (cut if len(cut) > TITLE_LENGTH // 2 else line[: TITLE_LENGTH - 1]) + "…"


TITLE_SECONDS = 10.0
TITLE_PROMPT = (
    "Name this conversation in 3 to 6 plain words, as a title for a list of chats. "
    "Reply with the title only: no quotes, no final full stop."
)


def conversation_title_from_model(*, conversation: Conversation, model) -> str | None:
    """After a chat's first reply, a short title from its model; None when the
    model writes none (the demo), fails, or the chat was renamed meanwhile
    (the member's name always wins: the update is conditional on the title
    its first message gave)."""
    from chat.llm import LLMError, TextDelta

    if not getattr(model, "writes_titles", False):
        return None
    if Run.objects.filter(conversation=conversation).count() != 1:
        return None  # only a chat's first run names it
    messages = list(
        Message.objects.filter(conversation=conversation, superseded_at__isnull=True)
        .exclude(role=Message.Role.TOOL)
        .order_by("created_at", "id")
        .values_list("role", "content")[:4]
    )
    first = next((content for role, content in messages if role == Message.Role.USER), None)
    if first is None or conversation.title != _title_from(first):
        return None
    ask = [{"role": "system", "content": TITLE_PROMPT}]
    ask += [
        {"role": role, "content": content[:2000]}
        for role, content in messages
        if role in (Message.Role.USER, Message.Role.ASSISTANT) and content
    ]
    ask.append({"role": "user", "content": "Now the title of this conversation."})
    # A slow model does not hold the worker long: the first message's name stays.
    cancel = CancelToken()
    timer = threading.Timer(TITLE_SECONDS, cancel.cancel)
    timer.start()
    try:
        text = "".join(
            chunk.text
            for chunk in model.stream(ask, [], cancel=cancel)
            if isinstance(chunk, TextDelta)
        )
    except LLMError:
        return None
    finally:
        timer.cancel()
    if cancel.is_set():
        return None
    title = _title_from(text.strip().strip("\"'“”").rstrip("."))
    if title == "New chat":
        return None
    named = Conversation.objects.filter(pk=conversation.pk, title=conversation.title)
    return title if named.update(title=title) else None
