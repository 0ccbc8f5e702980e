"""A tiny, valid llama-architecture GGUF model with random weights, for tests.

llama.cpp loads it in well under a second and generates text from it. The
text is random printable ASCII: the weights are random, but one residual
dimension (``_BIAS_DIM``) is held at a constant positive value so that the
output projection can push every token that is not printable ASCII or a
space (control tokens, ``<unk>``, raw bytes) far down. A completion therefore
never ends early on ``</s>`` and is always valid UTF-8.

Vocabulary (SentencePiece-style, ``tokenizer.ggml.model = "llama"``)::

    0 <unk>   1 <s>   2 </s>            (UNKNOWN, CONTROL, CONTROL)
    3..258    <0x00> .. <0xFF>          (BYTE: byte fallback for any input)
    259       U+2581 (the SentencePiece space)
    260..353  '!' .. '~'                (NORMAL, printable ASCII)

Usage: ``python -m infervisor.tools.tinymodel OUT.gguf [--seed N]``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

__all__ = ["TinyDims", "generate_tiny_gguf", "main"]

_SPACE = "\u2581"
_PRINTABLE = [chr(c) for c in range(0x21, 0x7F)]
_BIAS_DIM = 0
_BIAS_VALUE = 1.0
_SUPPRESS = -64.0
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

F32 = npt.NDArray[np.float32]


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
    w.add_chat_template(_CHAT_TEMPLATE)


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> F32:
    """Small random weights (standard deviation 0.02), as float32."""
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def _embeddings(rng: np.random.Generator, n_vocab: int, dims: TinyDims) -> F32:
    """Token embeddings (n_vocab, n_embd) with ``_BIAS_DIM`` held constant."""
    emb = _normal(rng, (n_vocab, dims.n_embd))
    emb[:, _BIAS_DIM] = _BIAS_VALUE
    return emb


def _output(rng: np.random.Generator, types: list[int], dims: TinyDims) -> F32:
    """Output projection (n_vocab, n_embd); non-NORMAL tokens are suppressed."""
    out = _normal(rng, (len(types), dims.n_embd))
    out[:, _BIAS_DIM] = 0.0
    for i, kind in enumerate(types):
        if kind != gguf.TokenType.NORMAL:
            out[i, _BIAS_DIM] = _SUPPRESS
    return out


def _layer(rng: np.random.Generator, dims: TinyDims) -> dict[str, F32]:
    """One block's tensors (numpy shape is (out, in)), keyed by GGUF suffix.

    The rows of ``attn_output`` and ``ffn_down`` that write ``_BIAS_DIM`` are
    zero, so the residual stream keeps that dimension constant.
    """
    e, f = dims.n_embd, dims.n_ff
    t = {
        "attn_norm": np.ones(e, dtype=np.float32),
        "attn_q": _normal(rng, (e, e)),
        "attn_k": _normal(rng, (e, e)),
        "attn_v": _normal(rng, (e, e)),
        "attn_output": _normal(rng, (e, e)),
        "ffn_norm": np.ones(e, dtype=np.float32),
        "ffn_gate": _normal(rng, (f, e)),
        "ffn_up": _normal(rng, (f, e)),
        "ffn_down": _normal(rng, (e, f)),
    }
    t["attn_output"][_BIAS_DIM, :] = 0.0
    t["ffn_down"][_BIAS_DIM, :] = 0.0
    return t


def _tensors(seed: int, types: list[int], dims: TinyDims) -> dict[str, F32]:
    """All tensors in GGUF naming order, drawn from ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    tensors = {"token_embd.weight": _embeddings(rng, len(types), dims)}
    for i in range(dims.n_layer):
        for suffix, value in _layer(rng, dims).items():
            tensors[f"blk.{i}.{suffix}.weight"] = value
    tensors["output_norm.weight"] = np.ones(dims.n_embd, dtype=np.float32)
    tensors["output.weight"] = _output(rng, types, dims)
    return tensors


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
    """Command line: ``python -m infervisor.tools.tinymodel OUT.gguf [--seed N]``."""
    parser = argparse.ArgumentParser(
        prog="python -m infervisor.tools.tinymodel",
        description="Write a tiny random-weight llama GGUF model for tests.",
    )
    parser.add_argument("out", type=Path, help="output .gguf file")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    print(generate_tiny_gguf(args.out, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
