"""Issue 38: a member picks the model per conversation, in Chromium, against two
local OpenAI-compatible servers; the gate is the same whichever answers."""

from __future__ import annotations

import os
import re

import pytest

from chat.models import LanguageModel, Message
from tests.browser.ui import TIMEOUT, ask, login, new_chat, pending_card, run_finished
from tests.helpers.fake_openai import FakeOpenAI, Reply, content_chunks, tool_call_chunks
from tests.helpers.live import LiveServer

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # ORM checks beside Playwright's loop


@pytest.mark.parametrize("width", [390, 1280])
def test_pick_a_model_per_conversation_and_see_it_on_each_reply(
    browser, member, workspace_root, artifacts, width
):
    with FakeOpenAI(models=("alpha-1",)) as alpha, FakeOpenAI(models=("beta-1",)) as beta:
        alpha.replies.append(Reply(chunks=content_chunks("Alpha ", "here.")))
        beta.replies += [
            Reply(chunks=content_chunks("Beta ", "here.")),
            Reply(
                chunks=tool_call_chunks(0, "call_1", "python", '{"code": ', '"print(3 * 3)"}'),
                finish_reason="tool_calls",
            ),
            Reply(chunks=content_chunks("Nine.")),
        ]
        LanguageModel.objects.create(
            name="Beta", base_url=beta.base_url, model_id="beta-1", api_key="sk-beta"
        )
        server = LiveServer(
            log_path=artifacts / f"daphne-models-{width}.log",
            STUDIO_WORKSPACE_ROOT=str(workspace_root),
            LLM_BASE_URL=alpha.base_url,
            LLM_MODEL="alpha-1",
        ).start()
        context = browser.new_context(viewport={"width": width, "height": 800})
        context.set_default_timeout(TIMEOUT)
        try:
            page = context.new_page()
            login(page, server)
            new_chat(page)
            picker = page.locator("#model-choice")
            assert picker.locator("option").all_inner_texts() == ["Default · alpha-1", "Beta"]

            ask(page, "hello")
            reply = page.locator(".msg-assistant", has_text="Alpha here.")
            reply.wait_for()
            assert reply.locator(".model-name").inner_text() == "alpha-1"
            run_finished(page)

            with page.expect_response(lambda r: "/settings/" in r.url) as saved:
                picker.select_option(label="Beta")
            assert saved.value.status == 200
            ask(page, "hello again")
            reply = page.locator(".msg-assistant", has_text="Beta here.")
            reply.wait_for()
            assert reply.locator(".model-name").inner_text() == "Beta"
            run_finished(page)

            # Beta's call waits for a decision like any other.
            ask(page, "compute")
            card = pending_card(page)
            card.wait_for()
            assert "print(3 * 3)" in card.inner_text()
            card.locator("button[value=allow]").click()
            page.locator(".tool-result pre", has_text=re.compile(r"^\s*9\s*$")).wait_for()
            page.locator(".msg-assistant", has_text="Nine.").wait_for()
            run_finished(page)
            # The choice survives a reload.
            page.reload()
            assert page.locator("#model-choice option:checked").inner_text() == "Beta"
        finally:
            context.close()
            server.stop()
        # (After the chat's first reply its model was asked for a title, once.)
        titled = [r for r in alpha.requests if "messages" in r and _asks_title(r)]
        asked_alpha = [r for r in alpha.requests if "messages" in r and not _asks_title(r)]
        asked_beta = [r for r in beta.requests if "messages" in r and not _asks_title(r)]
        assert len(titled) == 1
        assert [r["model"] for r in asked_alpha] == ["alpha-1"]
        assert [r["model"] for r in asked_beta] == ["beta-1"] * 3
        assert {r["_auth"] for r in asked_beta} == {"Bearer sk-beta"}
        # Beta read the whole conversation, Alpha's reply included.
        assert any(m.get("content") == "Alpha here." for m in asked_beta[0]["messages"])
        names = list(
            Message.objects.filter(role="assistant")
            .order_by("pk")
            .values_list("model_name", flat=True)
        )
        assert names == ["alpha-1", "Beta", "Beta", "Beta"]


def _asks_title(request: dict) -> bool:
    from chat.services import TITLE_PROMPT

    return request["messages"][0].get("content") == TITLE_PROMPT
