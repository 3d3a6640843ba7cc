"""Model clients behind one small factory."""

from __future__ import annotations

from django.conf import settings

from chat.llm.base import ChatModel, LLMError, TextDelta, ToolCall, TurnEnd
from chat.llm.demo import DemoModel
from chat.llm.openai_compat import OpenAICompatModel

__all__ = ["ChatModel", "LLMError", "TextDelta", "ToolCall", "TurnEnd", "get_model"]


def get_model(choice=None) -> ChatModel:
    """A conversation's model: the member's ``choice`` (a ``LanguageModel``) while
    an admin keeps it enabled, else the deployment's default: the server at
    ``LLM_BASE_URL``, or the offline demo."""
    if choice is not None and choice.enabled:
        return OpenAICompatModel(
            base_url=choice.base_url,
            model=choice.model_id,
            api_key=choice.api_key,
            timeout=settings.LLM_TIMEOUT,
            label=choice.name,
        )
    if settings.LLM_BASE_URL:
        return OpenAICompatModel(
            base_url=settings.LLM_BASE_URL,
            model=settings.LLM_MODEL,
            api_key=settings.LLM_API_KEY,
            timeout=settings.LLM_TIMEOUT,
        )
    return DemoModel()


def default_model_label() -> str:
    """What the picker's default entry and its replies are called."""
    return settings.LLM_MODEL if settings.LLM_BASE_URL else DemoModel.label


def server_models(*, base_url: str, api_key: str) -> list[str]:
    """The ids the server's ``/models`` lists, sorted; raises ``LLMError`` saying why not."""
    return OpenAICompatModel.listed(base_url=base_url, api_key=api_key, timeout=10.0)
