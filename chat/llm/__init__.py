"""Model clients behind one small factory."""

from __future__ import annotations

from django.conf import settings

from chat.llm.base import ChatModel, LLMError, TextDelta, ToolCall, TurnEnd
from chat.llm.demo import DemoModel
from chat.llm.openai_compat import OpenAICompatModel

__all__ = ["ChatModel", "LLMError", "TextDelta", "ToolCall", "TurnEnd", "get_model"]


def get_model() -> ChatModel:
    """The configured model: an OpenAI-compatible server, or the offline demo."""
    if settings.LLM_BASE_URL:
        return OpenAICompatModel(
            base_url=settings.LLM_BASE_URL,
            model=settings.LLM_MODEL,
            api_key=settings.LLM_API_KEY,
            timeout=settings.LLM_TIMEOUT,
        )
    return DemoModel()
