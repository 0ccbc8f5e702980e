"""The front's socket-to-socket pipe for chunked streams (tools/front/pipe.py):
the chunked framing followed over pieces split anywhere, and tokens counted by
bytes. The pipe through a front is in tests/test_front.py (the Ollama test
server's chunked streams) and tests/test_front_real.py (llama-server's)."""

from __future__ import annotations

import itertools

import pytest

from infervisor.tools.front.pipe import Dechunk, FramingError, PipeCounter

EVENTS = [b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i for i in range(5)]


def framed(pieces: list[bytes], end: bytes = b"0\r\n\r\n") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + end


def passed(splits: list[bytes]) -> tuple[bytes, Dechunk]:
    d = Dechunk()
    out = b"".join(d.feed(s) for s in splits if not d.ended)
    return out, d


@pytest.mark.parametrize(
    "end", [b"0\r\n\r\n", b"0;ext=1\r\nTrailer: x\r\n\r\n", b"000\r\n\r\n"], ids=str
)
def test_every_split_of_a_chunked_body_passes_all_of_it_but_the_last_chunk(end: bytes) -> None:
    """Split in two and in three at every place (size lines, CRLFs and the last
    chunk included): what is passed is the body up to its last chunk, whole."""
    body = framed([*EVENTS, b"x" * 300], end)
    want = body[: len(body) - len(end)]
    cuts = range(1, len(body))
    seen = 0
    for i in cuts:
        out, d = passed([body[:i], body[i:]])
        assert out == want and d.ended and d.tail.startswith(end[:1]), i
        seen += 1
    for i, j in itertools.combinations(range(1, len(body), 7), 2):
        out, d = passed([body[:i], body[i:j], body[j:]])
        assert out == want and d.ended, (i, j)
        seen += 1
    assert seen > len(body)  # every two-way split, and three-way ones


def test_a_body_cut_before_its_last_chunk_has_not_ended() -> None:
    body = framed(EVENTS)
    out, d = passed([body[:-5]])
    assert out == body[:-5] and not d.ended


@pytest.mark.parametrize(
    "bad", [b"zz\r\nxx\r\n", b"-5\r\nxx\r\n", b"1" * 5000], ids=["not hex", "negative", "endless"]
)
def test_a_broken_framing_is_refused(bad: bytes) -> None:
    with pytest.raises(FramingError):
        Dechunk().feed(bad)


def test_tokens_are_counted_by_bytes_and_a_reported_usage_wins() -> None:
    counter = PipeCounter()
    counter.feed(framed(EVENTS[:3], b""))
    counter.feed(b'data: {"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}\n\n')
    assert counter.close().completion == 3  # the empty content is no token
    counter.feed(b'\r\n5e\r\ndata: {"usage":{"prompt_tokens":4,"completion_tokens":9}}\n\n\r\n')
    usage = counter.close()
    assert (usage.prompt, usage.completion) == (4, 9)


def test_ollama_native_pieces_are_counted_and_its_eval_count_wins() -> None:
    counter = PipeCounter()
    counter.feed(b'{"response":"He","done":false}\n{"response":"llo","done":false}\n')
    assert counter.close().completion == 2
    counter.feed(b'{"response":"","done":true,"prompt_eval_count":3,"eval_count":2}\n')
    assert (counter.close().prompt, counter.close().completion) == (3, 2)
