"""Models to pick: admins list them (with a secret key and Fetch models), members
pick one per conversation; the replies say which model wrote them."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from chat.llm import OpenAICompatModel, get_model
from chat.llm.demo import DemoModel
from chat.models import Conversation, LanguageModel
from tests.factories import make_conversation, make_user
from tests.helpers.fake_openai import FakeOpenAI

pytestmark = pytest.mark.django_db


@pytest.fixture
def fake():
    with FakeOpenAI(models=("beta-1", "beta-2")) as server:
        yield server


@pytest.fixture
def beta(fake) -> LanguageModel:
    return LanguageModel.objects.create(
        name="Beta", base_url=fake.base_url, model_id="beta-1", api_key="sk-beta-secret"
    )


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(make_user("root", staff=True, superuser=True))
    return client


def test_a_pick_is_asked_while_enabled_else_the_default(beta, settings):
    settings.LLM_BASE_URL = ""
    model = get_model(beta)
    assert isinstance(model, OpenAICompatModel)
    assert (model.model, model.label, model.base_url) == ("beta-1", "Beta", beta.base_url)
    beta.enabled = False
    assert isinstance(get_model(beta), DemoModel)
    assert get_model(None).label == "Demo model"


def test_a_member_picks_an_enabled_model_and_nothing_else(alice, beta):
    conversation = make_conversation(alice)
    client = Client()
    client.force_login(alice)
    url = reverse("chat:settings", args=[conversation.pk])
    base = {"confirm_tool_calls": "on", "enabled_tools": ["python"]}
    page = client.get(conversation.get_absolute_url()).text
    assert "Default · Demo model" in page and ">Beta</option>" in page
    assert "sk-beta-secret" not in page and beta.base_url not in page

    assert client.post(url, {**base, "model": str(beta.pk)}).status_code == 302
    assert Conversation.objects.get(pk=conversation.pk).model_id == beta.pk
    for bad in ("999999", "x", str(LanguageModel.objects.create(
        name="Off", base_url="http://127.0.0.1:9/v1", model_id="m", enabled=False
    ).pk)):  # fmt: skip
        response = client.post(url, {**base, "model": bad}, HTTP_HX_REQUEST="true")
        assert response.status_code == 400 and "not offered" in response.text
    assert Conversation.objects.get(pk=conversation.pk).model_id == beta.pk
    assert client.post(url, {**base, "model": ""}).status_code == 302
    assert Conversation.objects.get(pk=conversation.pk).model_id is None


def test_the_api_key_is_never_shown_back_and_blank_keeps_it(admin_client, beta):
    url = reverse("admin:chat_languagemodel_change", args=[beta.pk])
    page = admin_client.get(url).text
    assert "sk-beta-secret" not in page and "Set now." in page
    form = {"name": "Beta", "base_url": beta.base_url, "model_id": "beta-2", "enabled": "on"}
    assert admin_client.post(url, {**form, "api_key": ""}).status_code == 302
    beta.refresh_from_db()
    assert (beta.api_key, beta.model_id) == ("sk-beta-secret", "beta-2")
    assert admin_client.post(url, {**form, "api_key": "-"}).status_code == 302
    beta.refresh_from_db()
    assert beta.api_key == ""
    changelist = admin_client.get(reverse("admin:chat_languagemodel_changelist")).text
    assert "sk-beta-secret" not in changelist


def test_fetch_models_reads_the_servers_list_with_its_key(admin_client, beta, fake):
    url = reverse("admin:chat_languagemodel_changelist")
    response = admin_client.post(
        url, {"action": "fetch_models", "_selected_action": [beta.pk]}, follow=True
    )
    assert "Beta: the server offers beta-1, beta-2." in response.text
    beta.refresh_from_db()
    assert beta.available == ["beta-1", "beta-2"] and beta.fetched_at is not None
    assert fake.requests[-1] == {"_get": "/v1/models", "_auth": "Bearer sk-beta-secret"}


def test_fetch_models_from_a_server_that_is_down_says_so(admin_client):
    down = LanguageModel.objects.create(
        name="Down", base_url="http://127.0.0.1:9/v1", model_id="m", api_key="k"
    )
    url = reverse("admin:chat_languagemodel_changelist")
    response = admin_client.post(
        url, {"action": "fetch_models", "_selected_action": [down.pk]}, follow=True
    )
    assert response.status_code == 200 and "Down: Could not reach the model server" in response.text
    # Issue 55: the admin reads the address asked and the library's own words.
    assert "Asked http://127.0.0.1:9/v1/models: Connection error" in response.text
    down.refresh_from_db()
    assert down.last_error.startswith("Could not reach") and down.available == []
    assert "http://127.0.0.1:9/v1/models" in down.last_error
