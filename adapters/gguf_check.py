"""A bounded check that a file is a readable GGUF: header, metadata, tensor table.

Source: new in infervisor (the GGUF layout is ggml's ``docs/gguf.md``). A file
with the right magic and random bytes after it must be refused before a
server is launched on it, with what is wrong and where.

What is read, little-endian, and nothing past it (the tensor data is not)::

    magic b"GGUF", version u32 (2 or 3), tensor_count u64, kv_count u64
    kv_count times: key (string), value type u32, value
    tensor_count times: name (string), n_dims u32 (1..4), dims u64 * n_dims,
                        ggml type u32, data offset u64

A string is a u64 length and that many UTF-8 bytes; an array value is an
element type u32, a count u64 and the elements. Every length and count is
checked against the bytes the file still has before anything is allocated,
so a corrupt count cannot make the check read or allocate more than the file.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

__all__ = ["GGUF_MAGIC", "GgufError", "check_gguf"]

GGUF_MAGIC = b"GGUF"
_VERSIONS = (2, 3)
_MAX_KEY = 65535  # the format's own limit on a key's length
_MAX_DIMS = 4
_MAX_GGML_TYPE = 63  # ggml's types are numbered well below this
#: Fixed-size scalar value types: type id -> struct format.
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """The file is not a readable GGUF; the message says what and at which byte."""


class _Reader:
    """Reads fields from a file, refusing any that would run past its end."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self.f = f
        self.size = size
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        left = self.size - self.pos
        if n > left:
            raise GgufError(f"{what} at byte {self.pos} needs {n} bytes; the file has {left} left")
        data = self.f.read(n)
        if len(data) != n:
            raise GgufError(f"{what} at byte {self.pos}: short read")
        self.pos += n
        return data

    def unpack(self, fmt: str, what: str) -> int | float | bool:
        value: int | float | bool = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[
            0
        ]
        return value

    def u32(self, what: str) -> int:
        return int(self.unpack("I", what))

    def u64(self, what: str) -> int:
        return int(self.unpack("Q", what))

    def string(self, what: str, limit: int | None = None) -> str:
        at = self.pos
        n = self.u64(f"{what} length")
        if limit is not None and n > limit:
            raise GgufError(f"{what} at byte {at} is {n} bytes long; at most {limit} allowed")
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError as e:
            raise GgufError(f"{what} at byte {at} is not UTF-8: {e.reason}") from e


def _value(r: _Reader, vtype: int, key: str, depth: int = 0) -> None:
    if vtype in _SCALARS:
        r.take(struct.calcsize(_SCALARS[vtype]), f"value of {key!r}")
    elif vtype == _STRING:
        r.string(f"value of {key!r}")
    elif vtype == _ARRAY and depth == 0:
        etype = r.u32(f"element type of {key!r}")
        count = r.u64(f"element count of {key!r}")
        least = struct.calcsize(_SCALARS[etype]) if etype in _SCALARS else 8
        if etype not in _SCALARS and etype not in (_STRING, _ARRAY):
            raise GgufError(f"array {key!r} has unknown element type {etype}")
        if count * least > r.size - r.pos:
            raise GgufError(
                f"array {key!r} claims {count} elements; the file has {r.size - r.pos} bytes left"
            )
        if etype in _SCALARS:
            r.take(count * least, f"elements of {key!r}")
            return
        for _ in range(count):
            _value(r, etype, key, depth + 1)
    else:
        raise GgufError(f"metadata {key!r} has unknown value type {vtype}")


def _header(r: _Reader) -> tuple[int, int, int]:
    magic = r.take(4, "magic")
    if magic != GGUF_MAGIC:
        raise GgufError(f"magic is {magic!r}, not {GGUF_MAGIC!r}")
    version = r.u32("version")
    if version not in _VERSIONS:
        raise GgufError(f"version {version} is not a GGUF version this node reads (2 or 3)")
    tensors, kvs = r.u64("tensor count"), r.u64("metadata count")
    # Each entry takes at least 8 bytes (a string length): more cannot fit in the file.
    for count, what in ((tensors, "tensor count"), (kvs, "metadata count")):
        if count * 8 > r.size - r.pos:
            raise GgufError(f"{what} {count} cannot fit in a {r.size}-byte file")
    return version, tensors, kvs


def _tensor(r: _Reader, index: int) -> None:
    name = r.string(f"name of tensor {index}", _MAX_KEY)
    n_dims = r.u32(f"dimension count of tensor {name!r}")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise GgufError(f"tensor {name!r} has {n_dims} dimensions; 1 to {_MAX_DIMS} allowed")
    for _ in range(n_dims):
        r.u64(f"a dimension of tensor {name!r}")
    ggml_type = r.u32(f"type of tensor {name!r}")
    if ggml_type > _MAX_GGML_TYPE:
        raise GgufError(f"tensor {name!r} has unknown ggml type {ggml_type}")
    offset = r.u64(f"data offset of tensor {name!r}")
    if offset >= r.size:
        raise GgufError(f"tensor {name!r} data offset {offset} is past the end ({r.size} bytes)")


def check_gguf(path: Path) -> None:
    """Refuse a file whose GGUF header, metadata or tensor table cannot be read.

    Blocking: reads the header and tables only (kilobytes to a few MiB of
    tokenizer metadata), never the tensor data.

    Raises:
        GgufError: naming the file and what is wrong (with the byte offset).
        OSError: the file cannot be read.
    """
    with path.open("rb") as f:
        r = _Reader(f, path.stat().st_size)
        try:
            _, tensors, kvs = _header(r)
            for i in range(kvs):
                key = r.string(f"key of metadata entry {i}", _MAX_KEY)
                _value(r, r.u32(f"value type of {key!r}"), key)
            for i in range(tensors):
                _tensor(r, i)
        except GgufError as e:
            raise GgufError(f"{path} is not a GGUF file this node can read: {e}") from None
