"""Fixtures of the tests that put the front before real llama.cpp servers
(tests/test_front_real.py, tests/test_residency_real.py): ``front``, a front on
a free loopback port before the test module's own ``node`` fixture, and
``sdk``, the official ``openai`` client of that front. A module takes them with
``pytest_plugins = ("real_front",)``; the bearer token is :data:`SECRET`.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from infervisor.actors.node import Node
from infervisor.adapters.ports import free_port
from infervisor.tools.api.auth import TcpAddress, Tokens
from infervisor.tools.api.scopes import Scope
from infervisor.tools.front import FrontConfig, FrontServer

#: The bearer token (named ``ci``, scope operate: inference) the front takes and ``sdk`` sends.
SECRET = "real-front-secret"


@pytest.fixture
def front(node: Node) -> Iterator[FrontServer]:
    port = free_port()
    config = FrontConfig(listen=f"127.0.0.1:{port}")
    with FrontServer.listen(
        config, TcpAddress("127.0.0.1", port), Tokens({"ci": SECRET}, {"ci": Scope.OPERATE}), "n1"
    ) as server:
        server.serve(node)
        yield server


@pytest.fixture
def sdk(front: FrontServer) -> Iterator[openai.OpenAI]:
    http = openai.DefaultHttpxClient(trust_env=False)
    with openai.OpenAI(
        base_url=f"{front.url}/v1", api_key=SECRET, max_retries=0, http_client=http
    ) as client:
        yield client
