"""``infervisor chain pull``: a mirror of a node's log over its API (loopback TCP,
a read token), verified as it goes; incremental; a fork or a rollback refused;
a pull killed with SIGKILL leaves the mirror as it was and the next run resumes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from support import cli_here, wait_until
from tiles_support import grow_chain

from infervisor.adapters.ports import free_port
from infervisor.chain import verify_chain
from infervisor.chain.cosignature import Cosigner, cosignatures_of
from infervisor.chain.cosignature_store import cosigned_note, store
from infervisor.chain.note import split_note
from infervisor.tools.api.auth import TcpAddress, load_or_create_tokens
from infervisor.tools.api.scopes import ApiToken, Scope
from infervisor.tools.api.serving.server import ApiServer
from infervisor.tools.audit.chain_pull import PullError, pull


@contextmanager
def serving(data: Path) -> Iterator[tuple[str, str]]:
    """The API of the data dir on loopback TCP: (url, read token)."""
    port = free_port()
    tokens = load_or_create_tokens(data, [ApiToken(name="auditor", scope=Scope.READ)])
    server = ApiServer.listen(
        data, data / "chain.db", "n1", tcp=TcpAddress("127.0.0.1", port), tokens=tokens
    )
    try:
        secret = json.loads((data / "api-tokens.json").read_text())["auditor"]
        yield f"http://127.0.0.1:{port}", secret
    finally:
        server.close()


def _size(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        conn.close()


def test_pull_then_pull_again_fetches_only_what_is_new(tmp_path: Path) -> None:
    data, mirror = tmp_path / "node", tmp_path / "mirror"
    grow_chain(data, "n1", 300)
    with serving(data) as (url, token):
        first = pull(url, mirror, token=token)
        assert (first.old_size, first.new_size, first.added) == (0, 301, 301)
        assert "trusted on first use" in first.trust
        assert (mirror / "node.pub").read_text() == (data / "node.pub").read_text()
        assert verify_chain(mirror / "chain.db").problem is None
        grow_chain(data, "n1", 400)
        second = pull(url, mirror, token=token)
        assert (second.old_size, second.added) == (301, 400)
        assert second.trust == "the key pinned by the first pull"
        again = pull(url, mirror, token=token)
        assert again.added == 0
    assert _size(mirror / "chain.db") == 701
    assert sorted(p.name for p in (mirror / "checkpoints").iterdir()) == ["301.txt", "701.txt"]
    assert not (mirror / "pull.partial.db").exists()


def _staged(mirror: Path) -> int:
    if not (mirror / "pull.partial.db").exists():
        return 0
    conn = sqlite3.connect(f"file:{mirror / 'pull.partial.db'}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM entries").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def test_a_rollback_and_a_fork_are_refused_naming_both_sizes(tmp_path: Path) -> None:
    data, older, mirror = tmp_path / "node", tmp_path / "older", tmp_path / "mirror"
    grow_chain(data, "n1", 300)
    shutil.copytree(data, older)
    grow_chain(data, "n1", 300)
    with serving(data) as (url, token):
        assert pull(url, mirror, token=token).new_size == 601
    with serving(older) as (url, token), pytest.raises(PullError) as rollback:
        pull(url, mirror, token=token)
    assert "rollback" in str(rollback.value) and "301" in str(rollback.value)
    assert "601" in str(rollback.value)
    fork = tmp_path / "fork"
    fork.mkdir()
    shutil.copy(data / "node.key", fork / "node.key")  # the same key, another history
    shutil.copy(data / "node.pub", fork / "node.pub")
    grow_chain(fork, "n1", 900)
    with serving(fork) as (url, token), pytest.raises(PullError) as forked:
        pull(url, mirror, token=token)
    assert "fork" in str(forked.value) and "901" in str(forked.value)
    assert "601" in str(forked.value)
    assert _size(mirror / "chain.db") == 601


def test_a_wrong_key_is_refused(tmp_path: Path) -> None:
    data, other = tmp_path / "node", tmp_path / "other"
    grow_chain(data, "n1", 10)
    grow_chain(other, "n1", 10)
    with serving(data) as (url, token), pytest.raises(PullError) as refused:
        pull(url, tmp_path / "mirror", token=token, key=str(other / "node.pub"))
    assert refused.value.code == "checkpoint_invalid"
    with serving(data) as (url, _), pytest.raises(PullError) as no_token:
        pull(url, tmp_path / "mirror")
    assert no_token.value.code == "unauthorized"
    assert "a token of scope read (or more) is needed" in str(no_token.value)


def test_a_token_the_node_refuses_is_named_as_refused(tmp_path: Path) -> None:
    """`--token bad` said "a read token is needed (--token)" though one was given."""
    from click.testing import CliRunner

    from infervisor.tools.cli import cli

    data = tmp_path / "node"
    grow_chain(data, "n1", 3)
    with serving(data) as (url, _):
        args = ["chain", "pull", url, str(tmp_path / "mirror"), "--token", "bad", "--json"]
        done = CliRunner().invoke(cli, args)
    assert done.exit_code == 2, done.output
    error = json.loads(done.stdout)["error"]
    assert (error["code"], error["field"]) == ("unauthorized", "--token"), error
    assert "401" in error["message"] and "refused the token given" in error["message"]
    assert "any of its [api] tokens reads" in error["message"] and "needed" not in error["message"]


def test_a_killed_pull_leaves_the_mirror_as_it_was_and_resumes(tmp_path: Path) -> None:
    data, mirror = tmp_path / "node", tmp_path / "mirror"
    grow_chain(data, "n1", 100)
    with serving(data) as (url, token):
        pull(url, mirror, token=token)
        grow_chain(data, "n1", 30_000)
        command = [
            str(Path(sys.executable).parent / "infervisor"),
            "chain",
            "pull",
            url,
            str(mirror),
        ]
        proc = subprocess.Popen(
            command, env={**os.environ, "INFERVISOR_TOKEN": token},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_until(
                lambda: _staged(mirror) >= 512 or proc.poll() is not None, 120, "a partial pull"
            )
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(60)
        assert proc.returncode == -signal.SIGKILL, "the pull ended before it could be killed"
        assert _size(mirror / "chain.db") == 101
        assert verify_chain(mirror / "chain.db").problem is None
        report = pull(url, mirror, token=token)
    assert report.resumed >= 512
    assert (report.old_size, report.new_size) == (101, 30_101)
    assert verify_chain(mirror / "chain.db").problem is None


def test_the_command_mirrors_for_every_reader_and_refuses_in_one_line(tmp_path: Path) -> None:
    data, mirror = tmp_path / "node", tmp_path / "mirror"
    grow_chain(data, "n1", 20)
    cli = str(Path(sys.executable).parent / "infervisor")
    with serving(data) as (url, token):
        env = {**os.environ, "INFERVISOR_TOKEN": token}
        done = subprocess.run(
            [cli, "chain", "pull", url, str(mirror), "--json"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["added"] == 21
        assert "trusted on first use" in done.stderr
        # The refusal and the readers run in this process (support.cli_here).
        refused = cli_here("chain", "pull", url, data, env={"INFERVISOR_TOKEN": token})
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: ") and refused.stderr.count("\n") == 1
    for reader in (["chain", "verify"], ["audit"]):
        run = cli_here(*reader, mirror)
        assert run.returncode == 0, (reader, run.stderr)


def test_cosignatures_are_served_and_mirrored(tmp_path: Path) -> None:
    data, mirror = tmp_path / "node", tmp_path / "mirror"
    size = grow_chain(data, "n1", 30)
    conn = sqlite3.connect(f"file:{data / 'chain.db'}?mode=ro", uri=True)
    body = split_note(cosigned_note(conn, size) or "")[0]
    conn.close()
    witness = Cosigner.generate("witness.example/w1")
    cosig = witness.cosign(body, 1_700_000_000)
    with serving(data) as (url, token):
        pull(url, mirror, token=token)  # before the witness cosigned
        assert store(data / "chain.db", size, [cosig]) == 1
        served = httpx.get(
            f"{url}/v1/log/checkpoint", headers={"authorization": f"Bearer {token}"}
        ).text
        assert served.endswith(cosig.line + "\n")
        assert cosignatures_of(served, [witness.key])[0].timestamp_s == 1_700_000_000
        assert pull(url, mirror, token=token).added == 0
    conn = sqlite3.connect(f"file:{mirror / 'chain.db'}?mode=ro", uri=True)
    try:
        assert cosigned_note(conn, size) == served
    finally:
        conn.close()
    assert (mirror / "checkpoints" / f"{size}.txt").read_text() == served


def test_a_tokens_file_gives_one_named_token_and_never_leaks_the_others(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from infervisor.tools.cli import cli

    tokens = tmp_path / "api-tokens.json"
    tokens.write_text('{"operator": "op-secret", "controller": "ctl-secret"}')
    url = "http://127.0.0.1:9"  # never reached: the token is refused first
    args = ["chain", "pull", url, str(tmp_path / "mirror"), "--token-file", str(tokens)]
    done = CliRunner().invoke(cli, [*args, "--token-name", "auditor"])
    assert done.exit_code == 2, done.output
    assert "--token-name 'auditor' is not in" in done.output
    assert "allowed: controller, operator" in done.output
    assert "secret" not in done.output
    # By default the least scope the file has: a node's own file has operator.
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 3, done.output  # nothing answers at port 9
    assert "secret" not in done.output


def test_a_url_that_is_not_a_nodes_api_is_a_usage_error(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from infervisor.tools.cli import cli

    for url in ("notaurl", "ftp://x/", "http://"):
        done = CliRunner().invoke(cli, ["chain", "pull", url, str(tmp_path / "m"), "--token", "t"])
        assert done.exit_code == 2, (url, done.output)
        assert f"URL {url!r}:" in done.output
        assert "allowed: http:// or https://" in done.output
