"""Token counts from a server's answer, read as it passes through.

OpenAI's shape (llama.cpp, mlx-lm, Ollama's ``/v1``) carries ``usage``
(``prompt_tokens``, ``completion_tokens``) in a whole answer and, in a stream,
in its last event when the server sends one; Ollama's native answers carry
``prompt_eval_count`` and ``eval_count`` in the last object. A stream without
usage counts one completion token per event (llama-server sends one per token).
"""

from __future__ import annotations

import msgspec

__all__ = ["StreamCounter", "Usage", "usage_of"]


class _OpenAIUsage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Answer(msgspec.Struct):
    usage: _OpenAIUsage | None = None
    prompt_eval_count: int | None = None
    eval_count: int | None = None


_decode = msgspec.json.Decoder(_Answer).decode


class Usage(msgspec.Struct, frozen=True):
    """Tokens of one answer."""

    prompt: int = 0
    completion: int = 0


def usage_of(body: bytes | memoryview) -> Usage | None:
    """The usage a JSON answer reports, or None (not JSON, or none reported)."""
    try:
        answer = _decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if answer.usage is not None:
        return Usage(answer.usage.prompt_tokens, answer.usage.completion_tokens)
    if answer.eval_count is not None or answer.prompt_eval_count is not None:
        return Usage(answer.prompt_eval_count or 0, answer.eval_count or 0)
    return None


class StreamCounter:
    """Counts a stream's events and finds its usage (SSE ``data:`` lines or NDJSON)."""

    def __init__(self) -> None:
        self.events = 0
        self.usage: Usage | None = None
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        """Take the next piece of the stream (split anywhere)."""
        data = self._tail + chunk if self._tail else chunk
        lines = data.split(b"\n")
        self._tail = lines.pop()
        for line in lines:
            self._line(line)

    def close(self) -> Usage:
        """The stream's usage: reported, else one completion token per piece of text."""
        if self._tail:
            self._line(self._tail)
            self._tail = b""
        return self.usage or Usage(0, self.events)

    def _line(self, line: bytes) -> None:
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
            if line == b"[DONE]":
                return
        elif not line.startswith(b"{"):
            return  # SSE comments, event names, blank separators
        if b'"usage"' in line or b'"eval_count"' in line:
            found = usage_of(line)
            if found is not None:
                self.usage = found
                return
        if _has_text(line):
            self.events += 1


#: Where a stream's piece carries its text: OpenAI's chat delta and completion, Ollama's
#: ``/api/generate`` (``response``) and ``/api/chat`` (``message.content``).
_TEXT_KEYS = (b'"content":"', b'"text":"', b'"response":"')


def _has_text(line: bytes) -> bool:
    for key in _TEXT_KEYS:
        at = line.find(key)
        if at >= 0 and line[at + len(key) : at + len(key) + 1] != b'"':
            return True
    return False
