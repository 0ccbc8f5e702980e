"""Ed25519 (RFC 8032) through the ``cryptography`` library, imported on first use.

The signed-note, checkpoint and cosignature modules reach Ed25519 only
through these functions, so a reader that never checks a signature (a chain
with no node key and no checkpoints, ``infervisor --help``, ``status``) does not
load ``cryptography``'s native bindings: about a quarter of a command's
start-up (issue 22, "CLI start-up").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["generate", "private_from_seed", "public_of", "seed_of", "verify"]


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether `signature` (64 bytes) is the Ed25519 signature of `message` by the
    32-byte `public` key; False for a malformed key or signature too."""
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415 - on first use
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def generate() -> Ed25519PrivateKey:
    """A new random private key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    return Ed25519PrivateKey.generate()


def private_from_seed(seed: bytes) -> Ed25519PrivateKey:
    """The private key of a 32-byte seed.

    Raises:
        ValueError: not 32 bytes.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    return Ed25519PrivateKey.from_private_bytes(seed)


def public_of(private: Ed25519PrivateKey) -> bytes:
    """The 32-byte public key (RFC 8032 encoding) of `private`."""
    return private.public_key().public_bytes_raw()


def seed_of(private: Ed25519PrivateKey) -> bytes:
    """The 32-byte seed of `private` (keep it secret)."""
    return private.private_bytes_raw()
