"""A tiny, valid llama-architecture GGUF model with random weights, for tests.

llama.cpp loads it in well under a second and generates text from it. The
text is random printable ASCII: the weights are random, but one residual
dimension is held at a constant positive value so that the output projection
can push every token that is not printable ASCII or a space (control tokens,
``<unk>``, raw bytes) far down (:mod:`infervisor.tools.servers.tinyweights`). A
completion therefore never ends early on ``</s>`` and is always valid UTF-8.

Vocabulary (SentencePiece-style, ``tokenizer.ggml.model = "llama"``)::

    0 <unk>   1 <s>   2 </s>            (UNKNOWN, CONTROL, CONTROL)
    3..258    <0x00> .. <0xFF>          (BYTE: byte fallback for any input)
    259       U+2581 (the SentencePiece space)
    260..353  '!' .. '~'                (NORMAL, printable ASCII)

Usage: ``python -m infervisor.tools.servers.tinymodel OUT.gguf [--seed N]``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf

from .tinyweights import CHAT_TEMPLATE, F32, BlockNames, TensorNames, llama_tensors

__all__ = ["TinyDims", "generate_tiny_gguf", "main"]

_SPACE = "\u2581"
_PRINTABLE = [chr(c) for c in range(0x21, 0x7F)]
_GGUF_NAMES = TensorNames(
    embed="token_embd.weight",
    block_prefix="blk.{i}.",
    block=BlockNames(
        attn_norm="attn_norm.weight",
        q="attn_q.weight",
        k="attn_k.weight",
        v="attn_v.weight",
        o="attn_output.weight",
        ffn_norm="ffn_norm.weight",
        gate="ffn_gate.weight",
        up="ffn_up.weight",
        down="ffn_down.weight",
    ),
    norm="output_norm.weight",
    head="output.weight",
)


@dataclass(frozen=True)
class TinyDims:
    """Model dimensions (counts, not bytes). The defaults are what tests use."""

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_ff: int = 128
    n_ctx_train: int = 512

    @property
    def head_dim(self) -> int:
        """Per-head dimension: ``n_embd // n_head`` (16 by default)."""
        return self.n_embd // self.n_head


def _vocab() -> tuple[list[str], list[int]]:
    """Return (tokens, token types) of the byte-level vocabulary."""
    t = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>"]
    types = [t.UNKNOWN, t.CONTROL, t.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [t.BYTE] * 256
    tokens += [_SPACE, *_PRINTABLE]
    types += [t.NORMAL] * (1 + len(_PRINTABLE))
    return tokens, [int(x) for x in types]


def _add_metadata(w: gguf.GGUFWriter, dims: TinyDims, seed: int) -> None:
    """Write the llama hyper-parameters every llama.cpp build requires."""
    w.add_name(f"infervisor-tiny-seed{seed}")
    w.add_context_length(dims.n_ctx_train)
    w.add_embedding_length(dims.n_embd)
    w.add_block_count(dims.n_layer)
    w.add_feed_forward_length(dims.n_ff)
    w.add_head_count(dims.n_head)
    w.add_head_count_kv(dims.n_head)
    w.add_rope_dimension_count(dims.head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def _add_tokenizer(w: gguf.GGUFWriter, tokens: list[str], types: list[int]) -> None:
    """Write the SentencePiece-style tokenizer; single-character tokens score 0."""
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_vocab_size(len(tokens))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def _tensors(seed: int, types: list[int], dims: TinyDims) -> dict[str, F32]:
    """All tensors in GGUF naming order; only NORMAL tokens may be emitted."""
    return llama_tensors(
        seed,
        _GGUF_NAMES,
        hidden=dims.n_embd,
        ffn=dims.n_ff,
        layers=dims.n_layer,
        emitted=[kind == gguf.TokenType.NORMAL for kind in types],
    )


def generate_tiny_gguf(path: Path, *, seed: int = 0, dims: TinyDims | None = None) -> Path:
    """Write a tiny llama GGUF model with random float32 weights.

    Default dimensions: 354 tokens, n_embd 64, 2 layers, 4 heads of 16, feed
    forward 128, training context 512 tokens; the file is 519,904 bytes.
    The output is a pure function of ``seed`` and ``dims``: the same
    arguments give byte-identical files (the writer embeds no timestamp).

    Args:
        path: file to create or overwrite; its directory must exist.
        seed: seed for ``numpy.random.default_rng``.
        dims: model dimensions; ``TinyDims()`` when omitted.

    Returns:
        ``path``.

    Raises:
        ValueError: ``n_embd`` is not a multiple of ``n_head``.
        OSError: the file cannot be written.
    """
    dims = dims or TinyDims()
    if dims.n_embd % dims.n_head:
        raise ValueError(f"n_embd {dims.n_embd} must be a multiple of n_head {dims.n_head}")
    tokens, types = _vocab()
    writer = gguf.GGUFWriter(path, "llama")
    try:
        _add_metadata(writer, dims, seed)
        _add_tokenizer(writer, tokens, types)
        for name, value in _tensors(seed, types, dims).items():
            writer.add_tensor(name, value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m infervisor.tools.servers.tinymodel OUT.gguf [--seed N]``."""
    parser = argparse.ArgumentParser(
        prog="python -m infervisor.tools.servers.tinymodel",
        description="Write a tiny random-weight llama GGUF model for tests.",
    )
    parser.add_argument("out", type=Path, help="output .gguf file")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    print(generate_tiny_gguf(args.out, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
