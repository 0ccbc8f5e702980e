"""adapters/tls.py: one TLS client context per process, as httpx would make it."""

from __future__ import annotations

import ssl

from infervisor.adapters.tls import client_tls
from infervisor.tools.api.client import ApiClient


def test_one_context_per_trust_env_verifying_as_httpx_does() -> None:
    shared = client_tls()
    assert client_tls() is shared
    assert client_tls(trust_env=False) is client_tls(trust_env=False)
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname


def test_an_api_client_over_tcp_uses_the_shared_context() -> None:
    with ApiClient(url="http://127.0.0.1:9", token=None, timeout_s=1.0) as client:
        pool = client._http._transport._pool  # type: ignore[attr-defined]
        assert pool._ssl_context is client_tls()
