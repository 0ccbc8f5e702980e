"""`infervisor witness run`: a real witness process on loopback, driven over HTTP.

Covers c2sp.org/tlog-witness add-checkpoint: a first checkpoint (old 0), a
consistent extension, 409 with the witness's size, 422 on a bad proof (state
unchanged), 403 on another key's signature, 404 on an unknown origin, 400 on
garbage; both an infervisor checkpoint and a plain three-line C2SP one; the
state surviving kill -9 right after an answer; concurrent submissions.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
from support import cli_here
from witness_support import INFERVISOR, Log, start_witness, witness, write_config

from infervisor.adapters.witness_http import WitnessClient, WitnessUnreachable
from infervisor.chain.cosignature import cosignatures_of, parse_witness_key, with_cosignatures
from infervisor.chain.merkle import consistency_proof
from infervisor.chain.note import Signer
from infervisor.chain.witness_protocol import (
    SIZE_CONTENT_TYPE,
    encode_add_checkpoint,
    monitoring_path,
    parse_cosignature_lines,
    parse_size_body,
)


def _vkey(config: Path) -> str:
    done = cli_here("witness", "vkey", config)  # in this process (support.cli_here)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def _status(config: Path) -> dict[str, dict[str, object]]:
    done = cli_here("witness", "status", config, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return {row["origin"]: row for row in json.loads(done.stdout)["logs"]}


def _cosigned(answer: httpx.Response, note: str, vkey: str) -> None:
    assert answer.status_code == 200, answer.text
    lines = parse_cosignature_lines(answer.content)
    key = parse_witness_key(vkey)
    found = cosignatures_of(with_cosignatures(note, lines), [key])
    assert [c.witness for c in found] == [key.name]
    assert found[0].timestamp_s > 0


@pytest.mark.parametrize("kind", ["infervisor", "plain"])
def test_cosigns_a_first_checkpoint_then_extensions(tmp_path: Path, kind: str) -> None:
    log = (
        Log("infervisor/gpu-01", node="gpu-01")
        if kind == "infervisor"
        else Log("example.com/log42")
    )
    config = write_config(tmp_path, [log])
    vkey = _vkey(config)
    with witness(config) as w:
        log.grow(5)
        _cosigned(w.post(log.request(0)), log.note(), vkey)
        log.grow(8)
        _cosigned(w.post(log.request(5)), log.note(), vkey)
        # the same size again (old == size, same root, no proof): cosigned again; the
        # project's client (adapters/witness_http.py) reads the answers the same way
        client = WitnessClient(w.url)
        reply = client.add_checkpoint(log.request(13))
        assert (reply.status, reply.content_type) == (200, "text/plain")
        assert parse_cosignature_lines(reply.body)
        reply = client.add_checkpoint(log.request(2))
        assert (reply.status, reply.content_type) == (409, SIZE_CONTENT_TYPE)
        assert parse_size_body(reply.body) == 13
        client.close()
        monitored = httpx.get(w.url + monitoring_path(log.origin), timeout=60)
        assert monitored.status_code == 200
        assert cosignatures_of(monitored.text, [parse_witness_key(vkey)])
        assert w.stop() == 0
    assert _status(config)[log.origin]["size"] == 13


def test_refusals_name_the_status_of_the_spec(tmp_path: Path) -> None:
    log, stranger = Log("example.com/log42"), Log("example.com/other")
    config = write_config(tmp_path, [log])
    with witness(config) as w:
        log.grow(6)
        assert w.post(log.request(0)).status_code == 200
        log.grow(4)
        # a wrong old size: 409 with the witness's size, as text/x.tlog.size
        wrong = w.post(log.request(3))
        assert wrong.status_code == 409
        assert wrong.headers["content-type"] == SIZE_CONTENT_TYPE
        assert parse_size_body(wrong.content) == 6
        # a bad proof: 422, and the state unchanged
        proof = consistency_proof(log.leaves, 6, 10)
        proof[0] = bytes([proof[0][0] ^ 1]) + proof[0][1:]
        assert w.post(encode_add_checkpoint(6, proof, log.note())).status_code == 422
        # a fork: equal size, another root
        fork = Log("example.com/log42")
        fork.signer = log.signer
        fork.grow(6)
        assert w.post(fork.request(6)).status_code == 422
        # signed by another key: 403; an unknown origin: 404; garbage: 400
        assert (
            w.post(log.request(6, signer=Signer.generate("example.com/log42"))).status_code == 403
        )
        stranger.grow(2)
        assert w.post(stranger.request(0)).status_code == 404
        for garbage in (b"", b"hello", b"old 1\n\nnot a note\n", b"\xff\xfe", b"old 01\n\nx\n\n"):
            answer = w.post(garbage)
            assert answer.status_code == 400, garbage
            assert "Traceback" not in answer.text
        assert w.post(log.request(11 + 1, size=10)).status_code == 400  # old above size
        assert httpx.get(f"{w.url}/add-checkpoint", timeout=60).status_code == 405
        assert w.post(b"old 0\n" * 20000).status_code == 413
        # the state is what the one good submission left
        assert parse_size_body(w.post(log.request(0)).content) == 6
        assert w.post(log.request(6)).status_code == 200
    state = _status(config)[log.origin]
    assert state["size"] == 10
    assert state["refused"] == 2  # the bad proof and the fork, kept as evidence


def test_state_survives_kill_9_right_after_an_answer(tmp_path: Path) -> None:
    log = Log("infervisor/n1", node="n1")
    config = write_config(tmp_path, [log])
    w = start_witness(config)
    try:
        log.grow(7)
        assert w.post(log.request(0)).status_code == 200
        w.proc.kill()  # SIGKILL, right after the answer
        assert w.proc.wait(60) == -9
    finally:
        w.stop()
    with witness(config) as again:
        answer = again.post(log.request(0))
        assert answer.status_code == 409
        assert parse_size_body(answer.content) == 7
        log.grow(1)
        assert again.post(log.request(7)).status_code == 200


def test_concurrent_submissions_never_both_win(tmp_path: Path) -> None:
    log = Log("example.com/race")
    config = write_config(tmp_path, [log])
    log.grow(4)
    with witness(config) as w:
        assert w.post(log.request(0)).status_code == 200
        # many pairs from size 4: each to a different size; exactly one may win per round
        for round_ in range(5):
            base = len(log.leaves)
            log.grow(2)
            bodies = [log.request(base, size=base + 1), log.request(base, size=base + 2)]
            answers: list[int] = [0, 0]
            start = threading.Barrier(2)

            def submit(i: int, body: bytes, start: threading.Barrier, answers: list[int]) -> None:
                start.wait(60)
                answers[i] = w.post(body).status_code

            threads = [
                threading.Thread(target=submit, args=(i, b, start, answers))
                for i, b in enumerate(bodies)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert sorted(answers) == [200, 409], (round_, answers)
            won = base + 1 + answers.index(200)
            if won != len(log.leaves):  # the smaller one won: move the witness to the end
                assert w.post(log.request(won)).status_code == 200
        assert parse_size_body(w.post(log.request(0)).content) == len(log.leaves)


def test_bad_config_and_key_name_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[witness]\nname = "w"\ndata_dir = "d"\nbogus = 1\n')
    done = subprocess.run(
        [INFERVISOR, "witness", "run", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "bogus" in done.stderr
    assert "Traceback" not in done.stderr
    log = Log("example.com/l")
    config = write_config(tmp_path, [log])
    _vkey(config)
    renamed = write_config(tmp_path, [log], name="witness.test/other")
    done = cli_here("witness", "vkey", renamed)
    assert done.returncode == 2
    assert "witness.test/w1" in done.stderr
    assert (tmp_path / "wdata" / "witness.key").stat().st_mode & 0o777 == 0o600


def test_a_slow_client_is_cut_off_and_sigint_stops_cleanly(tmp_path: Path) -> None:
    log = Log("example.com/slow")
    config = write_config(tmp_path, [log])  # read_timeout_s = 5
    with witness(config) as w:
        port = int(w.url.rsplit(":", 1)[1])
        heads = [
            b"POST /add-checkpoint HTTP/1.1\r\nHost: w\r\n",  # a head never finished
            b"POST /add-checkpoint HTTP/1.1\r\nHost: w\r\nContent-Length: 100\r\n\r\nold 0\n",
        ]
        for head in heads:
            with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
                sock.sendall(head)
                answer = sock.recv(4096)  # the witness closes it: b"" or a 408
                assert answer == b"" or b" 408 " in answer.split(b"\r\n")[0]
        log.grow(3)
        assert w.post(log.request(0)).status_code == 200  # it still serves the others
        w.proc.send_signal(signal.SIGINT)
        assert w.proc.wait(60) == 0
        with pytest.raises(WitnessUnreachable):
            WitnessClient(w.url).add_checkpoint(log.request(3))


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ('url = "gopher://x"', "logs[0].url 'gopher://x': allowed http://"),
        ('url = "not a url"', "logs[0].url 'not a url': allowed"),
        ('url = "file:///nonexistent/chain.db"', "no such file or directory"),
        ('url = "http://n:1"\ntoken_file = "nope.token"', "logs[0].token_file"),
    ],
)
def test_a_log_source_is_checked_when_the_config_is_read(
    tmp_path: Path, extra: str, named: str
) -> None:
    from infervisor.tools.witness.config import ConfigError, load_config

    config = write_config(tmp_path, [Log("example.com/l")])
    config.write_text(config.read_text() + extra + "\n")
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    assert named in str(refused.value) and "\n" not in str(refused.value)


#: Tokens no Authorization header can carry (a trial, stop 35: the witness's token
#: file was not checked; a bad one failed every audit, in the HTTP client's words).
UNSENDABLE = ["s3\ncret", "s3\rcret", "s3 cret", "s3\x01cret", "s3\u200bcret", "s3écret"]


@pytest.mark.parametrize("secret", UNSENDABLE)
def test_a_token_no_header_can_carry_is_refused_when_the_config_is_read(
    tmp_path: Path, secret: str
) -> None:
    from infervisor.tools.witness.config import ConfigError, load_config

    config = write_config(tmp_path, [Log("example.com/l")])
    (tmp_path / "log.token").write_text(secret + "\n", encoding="utf-8")
    config.write_text(config.read_text() + 'url = "http://n:1"\ntoken_file = "log.token"\n')
    with pytest.raises(ConfigError) as refused:
        load_config(config)
    message = str(refused.value)
    assert message.startswith(
        f"{config}: logs[0].token_file {str(tmp_path / 'log.token')!r}: a token may hold "
        "visible ASCII only (letters, digits, punctuation; no spaces, controls or other "
        f"characters), found {secret[2]!a}"
    ), message
    assert "\n" not in message


def test_a_token_file_changed_since_the_start_is_refused_at_the_fetch(tmp_path: Path) -> None:
    from infervisor.tools.witness.audit import FetchError, fetch_log
    from infervisor.tools.witness.config import WitnessedLog

    token = tmp_path / "log.token"
    token.write_text("s3\ncret\n")
    log = WitnessedLog(
        "example.com/l", (Log("example.com/l").signer.verifier,), "http://n:1", token
    )
    with pytest.raises(FetchError, match=r"the token file .*log\.token: a token may hold visible"):
        fetch_log(log, tmp_path)
