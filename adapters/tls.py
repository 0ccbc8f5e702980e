"""One TLS client context per process, shared by every httpx client infervisor makes.

httpx builds a new :class:`ssl.SSLContext` for each client and each transport,
reading certifi's whole CA bundle each time: about 20 ms of CPU (45 ms on a
loaded machine), paid by every probe client, every Ollama call, every witness
and control-API client, though nearly all of them speak plain HTTP on loopback
or a Unix socket. An ``SSLContext`` may be shared by clients and threads (the
ssl module's documentation); the one made here is the one httpx would make for
``verify=True``, so certificates are verified exactly as before.
"""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["client_tls"]


@functools.cache
def client_tls(*, trust_env: bool = True) -> ssl.SSLContext:
    """The process's TLS context for clients (made at the first call, then shared).

    Args:
        trust_env: honour ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` as httpx does
            (False for clients made with ``trust_env=False``).

    Returns:
        What ``httpx.create_ssl_context(verify=True, trust_env=trust_env)`` returns,
        once per value of ``trust_env``; pass it as ``verify=``.
    """
    return httpx.create_ssl_context(trust_env=trust_env)
