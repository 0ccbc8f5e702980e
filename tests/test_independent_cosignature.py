"""The witness's cosignatures verify with tests/independent_cosignature.py (written from
c2sp.org/tlog-cosignature and signed-note alone), and altered ones do not."""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from support import cli_here
from witness_support import Log, witness, write_config

from infervisor.chain.cosignature import Cosigner, with_cosignatures
from infervisor.chain.witness_protocol import parse_cosignature_lines

HERE = Path(__file__).parent


def _independent() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "independent_cosignature", HERE / "independent_cosignature.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


IND = _independent()


def _altered(line: str, at: int) -> str:
    name_part, b64 = line.rsplit(" ", 1)
    raw = bytearray(base64.b64decode(b64))
    raw[at] ^= 0x01
    return f"{name_part} {base64.b64encode(bytes(raw)).decode()}"


def test_the_independent_verifier_shares_no_code() -> None:
    text = (HERE / "independent_cosignature.py").read_text()
    assert "infervisor" not in text.replace("Imports no infervisor code", "")


def test_it_accepts_the_witness_cosignatures_and_refuses_altered_ones(tmp_path: Path) -> None:
    logs = [Log("infervisor/gpu-07", node="gpu-07"), Log("example.com/plain")]
    config = write_config(tmp_path, logs)
    made = cli_here("witness", "vkey", config)  # in this process (support.cli_here)
    assert made.returncode == 0, made.stdout + made.stderr
    vkey = made.stdout.strip()
    cosigned: list[tuple[str, str]] = []
    with witness(config) as w:
        for log in logs:
            log.grow(9)
            answer = w.post(log.request(0))
            assert answer.status_code == 200, answer.text
            (line,) = parse_cosignature_lines(answer.content)
            cosigned.append((log.note(), line))
    for note, line in cosigned:
        body = note[: note.index("\n\n") + 1]
        assert IND.verify_cosignature(body, line, vkey) > 0
        assert IND.cosigned_by(with_cosignatures(note, [line]), vkey) > 0
        for at in (0, 5, 11, 12, 40, 75):  # key ID, timestamp, signature
            with pytest.raises(IND.CosignatureInvalid):
                IND.verify_cosignature(body, _altered(line, at), vkey)
        size_line = body.split("\n")[1]
        other = body.replace(f"\n{size_line}\n", f"\n{int(size_line) + 1}\n", 1)
        with pytest.raises(IND.CosignatureInvalid):
            IND.verify_cosignature(other, line, vkey)
        stranger = Cosigner.generate("witness.test/w1").key.key_string()
        with pytest.raises(IND.CosignatureInvalid):
            IND.verify_cosignature(body, line, stranger)
        with pytest.raises(IND.CosignatureInvalid):
            IND.cosigned_by(note, vkey)  # the log's own signature only: not cosigned


def test_it_agrees_with_the_project_cosigner_on_the_spec_example() -> None:
    cosigner = Cosigner.generate("witness.example/w1")
    body = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    line = cosigner.cosign(body, 1679315147).line
    assert IND.verify_cosignature(body, line, cosigner.key.key_string()) == 1679315147
