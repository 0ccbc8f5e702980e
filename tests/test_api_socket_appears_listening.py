"""The control API's socket file appears only once it accepts connections
(tools/api/serving/server.py ``_bind_unix``): a client that waits for the file and
then connects is never refused by a node that is still starting."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

from infervisor.tools.api.serving.server import STAGING_FILE, _bind_unix


def test_the_file_appears_listening_private_and_under_its_own_name(tmp_path: Path) -> None:
    path = tmp_path / "api.sock"
    (tmp_path / STAGING_FILE).write_text("left by a node killed mid-bind")
    listener = _bind_unix(path)
    try:
        assert stat.S_ISSOCK(path.lstat().st_mode)
        assert stat.S_IMODE(path.lstat().st_mode) == 0o600
        assert not (tmp_path / STAGING_FILE).exists()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # accepted into the backlog: no ECONNREFUSED
    finally:
        listener.close()


def test_the_staging_name_is_no_longer_than_the_socket_name() -> None:
    # A data_dir whose api.sock fits a sun_path fits the staging name too.
    assert len(STAGING_FILE) <= len("api.sock")
