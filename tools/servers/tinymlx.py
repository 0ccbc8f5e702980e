"""A tiny llama model directory with random weights that ``mlx_lm`` loads offline.

``mlx_lm.server --model DIR`` loads it in about a second on a CPU and
generates text from it, with ``HF_HUB_OFFLINE=1`` and nothing from the hub.
The weights are random, but one residual dimension is held at a constant
positive value so that the output projection can push every token that is not
printable ASCII far down (:mod:`infervisor.tools.servers.tinyweights`): a completion
is printable ASCII, never ends early on an end-of-sequence token and is
always valid UTF-8.

Files written::

    config.json              model_type "llama", tiny dimensions, untied lm_head
    model.safetensors        float32 weights, mlx_lm (Hugging Face) tensor names
    tokenizer.json           byte-level BPE (``tokenizers``), no merges
    tokenizer_config.json    PreTrainedTokenizerFast, ChatML-style chat template

Vocabulary (GPT-2 byte-to-unicode alphabet, one token per byte)::

    0..255   the bytes 0x00..0xFF (token id == byte value)
    256      <|endoftext|>   (eos)
    257      <|im_start|>
    258      <|im_end|>      (also eos: ends a chat turn)

Usage: ``python -m infervisor.tools.servers.tinymlx OUTDIR [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tinyweights import CHAT_TEMPLATE, F32, BlockNames, TensorNames, llama_tensors

__all__ = [
    "SPECIAL_TOKENS",
    "TinyMlxDims",
    "byte_alphabet",
    "generate_tiny_mlx",
    "main",
    "safetensors_bytes",
]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_EOS_IDS = (256, 258)
_PRINTABLE = range(0x20, 0x7F)  # space .. '~': the only tokens the model emits
_MLX_NAMES = TensorNames(
    embed="model.embed_tokens.weight",
    block_prefix="model.layers.{i}.",
    block=BlockNames(
        attn_norm="input_layernorm.weight",
        q="self_attn.q_proj.weight",
        k="self_attn.k_proj.weight",
        v="self_attn.v_proj.weight",
        o="self_attn.o_proj.weight",
        ffn_norm="post_attention_layernorm.weight",
        gate="mlp.gate_proj.weight",
        up="mlp.up_proj.weight",
        down="mlp.down_proj.weight",
    ),
    norm="model.norm.weight",
    head="lm_head.weight",
)


@dataclass(frozen=True)
class TinyMlxDims:
    """Model dimensions (counts, not bytes). The defaults are what tests use."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    ffn: int = 128
    context: int = 512

    @property
    def vocab(self) -> int:
        """256 byte tokens plus the special tokens (259)."""
        return 256 + len(SPECIAL_TOKENS)


def byte_alphabet() -> list[str]:
    """The 256 printable characters standing for bytes 0..255 (GPT-2 ``bytes_to_unicode``).

    Bytes that are printable Latin-1 stand for themselves; the others (control
    characters, space, 0x7F..0xA0, 0xAD) are shifted to U+0100 onwards in order.
    """
    keep = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars: list[str] = []
    shifted = 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(0x100 + shifted))
            shifted += 1
    return chars


def _config(dims: TinyMlxDims) -> dict[str, Any]:
    """``config.json``: what ``mlx_lm.models.llama.ModelArgs`` reads."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dims.hidden,
        "num_hidden_layers": dims.layers,
        "intermediate_size": dims.ffn,
        "num_attention_heads": dims.heads,
        "num_key_value_heads": dims.heads,
        "head_dim": dims.hidden // dims.heads,
        "max_position_embeddings": dims.context,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": dims.vocab,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": list(_EOS_IDS),
    }


def _added_token(token_id: int, content: str) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _tokenizer() -> dict[str, Any]:
    """``tokenizer.json``: a ByteLevel BPE with one token per byte and no merges."""
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    vocab = {char: i for i, char in enumerate(byte_alphabet())}
    vocab.update({tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(256 + i, t) for i, t in enumerate(SPECIAL_TOKENS)],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }


def _tokenizer_config(dims: TinyMlxDims) -> dict[str, Any]:
    """``tokenizer_config.json``: a fast tokenizer, no BOS, ChatML-style template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": SPECIAL_TOKENS[0],
        "pad_token": SPECIAL_TOKENS[0],
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": dims.context,
        "chat_template": CHAT_TEMPLATE,
    }


def _tensors(seed: int, dims: TinyMlxDims) -> dict[str, F32]:
    """All weights, drawn in a fixed order; only printable ASCII may be emitted."""
    return llama_tensors(
        seed,
        _MLX_NAMES,
        hidden=dims.hidden,
        ffn=dims.ffn,
        layers=dims.layers,
        emitted=[i in _PRINTABLE for i in range(dims.vocab)],
    )


def safetensors_bytes(tensors: dict[str, F32], metadata: dict[str, str]) -> bytes:
    """Encode float32 tensors in the safetensors format, deterministically.

    The layout is the one ``safetensors.numpy.save`` writes, byte for byte:
    a little-endian u64 header length, a compact JSON header (``__metadata__``
    first, then tensors sorted by name, each ``dtype``, ``shape``,
    ``data_offsets``) padded with spaces to a multiple of 8 bytes, then the
    little-endian data in the same order with no gaps.
    """
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in sorted(tensors):
        size = tensors[name].nbytes
        header[name] = {
            "dtype": "F32",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    data = b"".join(tensors[name].astype("<f4").tobytes() for name in sorted(tensors))
    return struct.pack("<Q", len(text)) + text + data


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def generate_tiny_mlx(
    dir: Path,
    *,
    seed: int = 0,
    dims: TinyMlxDims | None = None,
) -> Path:
    """Write a tiny llama model directory that ``mlx_lm.load`` reads offline.

    Default dimensions: 259 tokens, hidden 64, 2 layers, 4 heads of 16, feed
    forward 128, context 512; ``model.safetensors`` is 463,720 bytes. The
    output is a pure function of ``seed`` and ``dims``: the same arguments
    give byte-identical files (JSON keys in a fixed order, tensors sorted by
    name, no timestamp). Only numpy is needed to write it; ``mlx_lm`` is
    needed only to load it.

    Args:
        dir: directory to fill; created (with parents) if missing. Files of
            the same names are overwritten, others are left alone.
        seed: seed for ``numpy.random.default_rng``.
        dims: model dimensions; ``TinyMlxDims()`` when omitted.

    Returns:
        ``dir``.

    Raises:
        ValueError: ``hidden`` is not a multiple of ``heads``.
        OSError: the directory or a file cannot be written.
    """
    dims = dims or TinyMlxDims()
    if dims.hidden % dims.heads:
        raise ValueError(f"hidden {dims.hidden} must be a multiple of heads {dims.heads}")
    dir.mkdir(parents=True, exist_ok=True)
    _write_json(dir / "config.json", _config(dims))
    weights = safetensors_bytes(_tensors(seed, dims), {"format": "mlx"})
    (dir / "model.safetensors").write_bytes(weights)
    _write_json(dir / "tokenizer.json", _tokenizer())
    _write_json(dir / "tokenizer_config.json", _tokenizer_config(dims))
    return dir


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m infervisor.tools.servers.tinymlx OUTDIR [--seed N]``."""
    parser = argparse.ArgumentParser(
        prog="python -m infervisor.tools.servers.tinymlx",
        description="Write a tiny random-weight llama model directory for mlx_lm.",
    )
    parser.add_argument("out", type=Path, help="output directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    print(generate_tiny_mlx(args.out, seed=args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
