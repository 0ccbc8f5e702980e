"""Random llama weights that keep a tiny model's output printable, for both tiny generators.

:mod:`infervisor.tools.servers.tinymodel` (GGUF, llama.cpp) and
:mod:`infervisor.tools.servers.tinymlx` (safetensors, mlx_lm) write the same network
under different tensor names. The weights are random, but one residual
dimension (``BIAS_DIM``) is held at ``BIAS_VALUE`` in every token embedding,
and the blocks never write to it, so the output projection can push every
token the model must not emit ``SUPPRESS`` logits down: a completion never
ends early on an end-of-sequence token and is always valid UTF-8.

Only numpy is needed. The draws are a pure function of the seed: the token
embedding first, then each block's matrices in order, then the output
projection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "BIAS_DIM",
    "BIAS_VALUE",
    "CHAT_TEMPLATE",
    "F32",
    "SUPPRESS",
    "BlockNames",
    "TensorNames",
    "llama_tensors",
]

BIAS_DIM = 0
BIAS_VALUE = 1.0
SUPPRESS = -64.0
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class BlockNames:
    """A file format's names for one decoder block's tensors, under its block prefix."""

    attn_norm: str
    q: str
    k: str
    v: str
    o: str
    ffn_norm: str
    gate: str
    up: str
    down: str


@dataclass(frozen=True)
class TensorNames:
    """A file format's names for every tensor; ``block_prefix`` is formatted with ``i``."""

    embed: str
    block_prefix: str
    block: BlockNames
    norm: str
    head: str


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> F32:
    """Small random weights (standard deviation 0.02), as float32."""
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def _block(rng: np.random.Generator, names: BlockNames, hidden: int, ffn: int) -> dict[str, F32]:
    """One decoder block (numpy shape is (out, in)), keyed by ``names``.

    The rows of the attention output and the feed-forward down projection that
    write ``BIAS_DIM`` are zero, so the residual stream keeps that dimension
    constant.
    """
    e, f = hidden, ffn
    t = {
        names.attn_norm: np.ones(e, dtype=np.float32),
        names.q: _normal(rng, (e, e)),
        names.k: _normal(rng, (e, e)),
        names.v: _normal(rng, (e, e)),
        names.o: _normal(rng, (e, e)),
        names.ffn_norm: np.ones(e, dtype=np.float32),
        names.gate: _normal(rng, (f, e)),
        names.up: _normal(rng, (f, e)),
        names.down: _normal(rng, (e, f)),
    }
    t[names.o][BIAS_DIM, :] = 0.0
    t[names.down][BIAS_DIM, :] = 0.0
    return t


def llama_tensors(
    seed: int,
    names: TensorNames,
    *,
    hidden: int,
    ffn: int,
    layers: int,
    emitted: Sequence[bool],
) -> dict[str, F32]:
    """All weights of a tiny llama, in file order, drawn from ``default_rng(seed)``.

    Args:
        seed: seed for ``numpy.random.default_rng``.
        names: the file format's tensor names.
        hidden: embedding width (count).
        ffn: feed-forward width (count).
        layers: number of decoder blocks.
        emitted: one flag per vocabulary token: ``True`` for a token the model
            may emit; every other token's logit is pushed ``SUPPRESS`` down.

    Returns:
        Tensor name to float32 array: embedding, blocks, final norm, output.
    """
    rng = np.random.default_rng(seed)
    vocab = len(emitted)
    embed = _normal(rng, (vocab, hidden))
    embed[:, BIAS_DIM] = BIAS_VALUE
    tensors = {names.embed: embed}
    for i in range(layers):
        prefix = names.block_prefix.format(i=i)
        for name, value in _block(rng, names.block, hidden, ffn).items():
            tensors[prefix + name] = value
    tensors[names.norm] = np.ones(hidden, dtype=np.float32)
    head = _normal(rng, (vocab, hidden))
    head[:, BIAS_DIM] = [0.0 if ok else SUPPRESS for ok in emitted]
    tensors[names.head] = head
    return tensors
