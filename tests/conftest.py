"""Fixtures every test folder shares: a real embedded redis-server (unix socket in a temp folder, never
anyone else's data), and a fresh run id. Each folder's conftest adds its own
(tests/exchange: exchange servers, tests/scheduler: schedulers, tests/tokenizer_align: vocabularies);
`servers.py` holds the server fixtures, imported by the folders that need them."""
import uuid

import pytest

from mrl_serving.embedded_redis import EmbeddedRedis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture
def run_id():
    return f"run-{uuid.uuid4().hex[:12]}"
