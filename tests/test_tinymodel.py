"""The tiny GGUF model generator: a valid, deterministic llama file."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from support import run_tool

from infervisor.tools.servers.tinymodel import TinyDims, generate_tiny_gguf

N_VOCAB = 3 + 256 + 1 + 94  # control, bytes, SentencePiece space, printable ASCII


def test_file_is_a_llama_gguf(tmp_path: Path) -> None:
    path = generate_tiny_gguf(tmp_path / "tiny.gguf")
    reader = gguf.GGUFReader(path)
    assert reader.fields["general.architecture"].contents() == "llama"
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == N_VOCAB
    assert tokens[:3] == ["<unk>", "<s>", "</s>"]
    assert tokens[3] == "<0x00>"
    assert tokens[258] == "<0xFF>"
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    assert types[3:259] == [gguf.TokenType.BYTE] * 256
    assert reader.fields["llama.embedding_length"].contents() == 64
    assert reader.fields["llama.block_count"].contents() == 2
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    assert list(embd.shape) == [64, N_VOCAB]
    assert len(reader.tensors) == 3 + 9 * 2


def test_same_seed_gives_identical_bytes(tmp_path: Path) -> None:
    a = generate_tiny_gguf(tmp_path / "a.gguf", seed=7)
    b = generate_tiny_gguf(tmp_path / "b.gguf", seed=7)
    assert a.read_bytes() == b.read_bytes()


def test_other_seed_gives_other_weights(tmp_path: Path) -> None:
    a = generate_tiny_gguf(tmp_path / "a.gguf", seed=0)
    b = generate_tiny_gguf(tmp_path / "b.gguf", seed=1)
    assert a.stat().st_size == b.stat().st_size
    assert a.read_bytes() != b.read_bytes()


def test_heads_must_divide_embedding(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="multiple of n_head"):
        generate_tiny_gguf(tmp_path / "bad.gguf", dims=TinyDims(n_embd=60, n_head=8))


def test_command_line_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "cli.gguf"
    assert run_tool("servers.tinymodel", str(out), "--seed", "3") == str(out)
    assert out.read_bytes() == generate_tiny_gguf(tmp_path / "api.gguf", seed=3).read_bytes()
