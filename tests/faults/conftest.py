from __future__ import annotations

import pytest

from tests.helpers.services import PrivateRedis


@pytest.fixture
def redis_server():
    server = PrivateRedis()
    server.start()
    yield server
    server.stop()
