"""The control API's Unix-socket transport closes the sockets of failed connects."""

from __future__ import annotations

import gc
import socket
from pathlib import Path

import pytest

from infervisor.tools.api.client import ApiClient
from infervisor.tools.api.errors import NotRunning


def test_a_stale_socket_leaves_no_unclosed_socket_behind(tmp_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "api.sock"))  # bound, never listening: connect is refused
    stale.close()
    client = ApiClient(data_dir=tmp_path, timeout_s=5)
    for _ in range(3):
        with pytest.raises(NotRunning):
            client.node()
    client.close()
    # httpcore's own backend leaves each failed socket to the collector, whose
    # ResourceWarning the suite turns into an error (filterwarnings = error).
    gc.collect()
