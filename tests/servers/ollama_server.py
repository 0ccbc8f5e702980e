"""A protocol-faithful Ollama test server (stdlib only), built from Ollama's published API.

Ollama cannot run here, so the adapters are tested against this program. It
answers what ``ollama serve`` answers for the parts infervisor uses, with the
shapes of the documentation and the behaviour of the server source:

- docs/api.md (ollama/ollama): "Load a model" (``POST /api/generate`` with no
  prompt), "Unload a model" (no prompt and ``keep_alive`` 0; ``done_reason``
  "unload"), "List Local Models" (``GET /api/tags``), "List Running Models"
  (``GET /api/ps``: ``expires_at``, ``size_vram``), chat load/unload with an
  empty ``messages`` array (``done_reason`` "load"/"unload"), streaming as
  newline-delimited JSON unless ``"stream": false``; model names are
  ``model:tag`` with the tag defaulting to ``latest``.
- docs.ollama.com/api-reference/get-version: ``GET /api/version`` answers
  ``{"version": "..."}``; ``GET /`` answers "Ollama is running".
- api/types.go ``Duration.UnmarshalJSON``: ``keep_alive`` is a number of
  seconds (negative: forever) or a Go duration string parsed by
  ``time.ParseDuration`` (negative: forever); any other JSON type, or a string
  Go cannot parse (``"-1"`` has no unit), is a 400 with Go's error text.
  Absent or null means the default, 5 minutes.
- server/routes.go ``GenerateHandler``: an unknown model is a 404 before
  anything else (an unload of it too); an unload of a pulled model that is not
  loaded still answers ``done_reason`` "unload"; a failed load is a 500 with
  the runner's error.
- server/sched.go ``load``: the runner is registered (so ``/api/ps`` lists it,
  with ``expires_at`` = now + keep_alive) *before* it finishes loading; a
  failed load is expired again; a client that goes away cancels the load
  (``WaitUntilRunning(req.ctx)``); ``expireRunner`` (an unload) waits for an
  in-flight load to finish, then drops the model.

- docs/api.md "Show Model Information" (``POST /api/show``: ``modelfile``,
  ``parameters``, ``template``, ``details``, ``model_info``, ``capabilities``),
  "Generate Embeddings" (``POST /api/embed``: ``embeddings``, one vector per
  input), "Pull a Model" (``POST /api/pull``: a stream of ``status`` objects
  ending in ``success``; ``"stream": false`` answers only the last).
- docs/openai.md (OpenAI compatibility): ``GET /v1/models`` (``object`` "list",
  ``data[*].id``), ``POST /v1/completions`` (``choices[*].text``) and
  ``POST /v1/chat/completions`` (``choices[*].message``), with ``usage``; an
  error is ``{"error": {"message", "type", "param", "code"}}`` (the
  middleware's ``openai.ErrorResponse``); a model not pulled is a 404.

Simplifications: one load per model at a time, shared by every request that
asks for it; the load is cancelled when *every* request waiting for it has
gone (Ollama ties it to the first request's context). Loaded models expire
lazily, when the next request looks at them.

Command line::

    ollama_server.py --host 127.0.0.1 --port N --models tinyllama,qwen:0.5b
        [--load-seconds 0.5] [--fail-load NAME]... [--resident NAME]...
        [--model-size BYTES] [--loaded-size BYTES] [--version 0.6.8]
        [--fail-completions] [--ps-hides-loading]

``--fail-load`` and ``--resident`` models count as pulled. A ``--resident``
model is loaded at start with no expiry, as if another client had loaded it
with ``keep_alive: -1``. ``--loaded-size`` is the ``size``/``size_vram``
``/api/ps`` reports for a model in memory (real Ollama reports more than the
file: the KV cache and buffers); default ``--model-size``. Fault modes:
``--fail-completions`` answers every generation with input (a prompt, messages,
``/v1/completions``, ``/v1/chat/completions``, ``/api/embed``) with a 500 while
loads, unloads, ``/``, ``/api/version``, ``/api/tags`` and ``/api/ps`` stay fine;
``--ps-hides-loading`` leaves a model out of ``/api/ps`` until its load is
done (a load Ollama does not report). Prints ``PORT <n>`` on stdout once listening.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import select
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_KEEP_ALIVE_NS = 5 * 60 * 10**9  # Ollama's default session: 5 minutes
FOREVER_NS = 2**63 - 1  # Go: time.Duration(math.MaxInt64)
LOAD_ERROR = "llama runner process has terminated: exit status 2"
COMPLETION_ERROR = "llama runner process no longer running: -1 "
CANCELED = "request canceled"
POLL_S = 0.02  # how often a waiting request checks whether its client is still there


# --- keep_alive, as Go's api.Duration reads it ---------------------------------------

_UNITS_NS = {
    "ns": 1,
    "us": 10**3,
    "\u00b5s": 10**3,  # micro sign
    "\u03bcs": 10**3,  # Greek mu
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?([^0-9.]*)")


def _go_quote(text):
    return json.dumps(text, ensure_ascii=False)


def go_parse_duration(text):
    """Nanoseconds of a Go duration string (``time.ParseDuration``), or ValueError
    with Go's own message."""
    orig, rest = text, text
    negative = rest[:1] == "-"
    if rest[:1] in ("-", "+"):
        rest = rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise ValueError(f"time: invalid duration {_go_quote(orig)}")
    total = Fraction(0)
    while rest:
        if not (rest[0] == "." or "0" <= rest[0] <= "9"):
            raise ValueError(f"time: invalid duration {_go_quote(orig)}")
        m = _PART.match(rest)
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            raise ValueError(f"time: invalid duration {_go_quote(orig)}")
        if not unit:
            raise ValueError(f"time: missing unit in duration {_go_quote(orig)}")
        if unit not in _UNITS_NS:
            raise ValueError(f"time: unknown unit {_go_quote(unit)} in duration {_go_quote(orig)}")
        value = Fraction(int(whole or "0")) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)
        total += value * _UNITS_NS[unit]
        rest = rest[m.end() :]
    ns = int(total)
    if ns > FOREVER_NS + (1 if negative else 0):
        raise ValueError(f"time: invalid duration {_go_quote(orig)}")
    return -ns if negative else ns


def keep_alive_ns(value):
    """Nanoseconds a request's ``keep_alive`` asks for (None: the default), or ValueError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"Unsupported type: '{_go_type(value)}'")
    if isinstance(value, str):
        ns = go_parse_duration(value)
    elif value < 0:
        ns = -1
    else:
        ns = min(int(value * 10**9), FOREVER_NS)
    return FOREVER_NS if ns < 0 else ns


def _go_type(value):
    names = {bool: "bool", list: "[]interface {}", dict: "map[string]interface {}"}
    return names.get(type(value), type(value).__name__)


# --- names, times, shapes -------------------------------------------------------------


def canonical(name):
    """``model`` -> ``model:latest``; a name with a tag is kept as it is."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def rfc3339(moment):
    text = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return text + "Z"


def now_utc():
    return datetime.now(UTC)


def details():
    return {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "1.1B",
        "quantization_level": "Q4_0",
    }


class Runner:
    """A model in memory, or being loaded into it."""

    def __init__(self, name, keep_ns):
        self.name = name
        self.loading = True
        self.error = None
        self.cancelled = False
        self.waiters = 0
        self.set_expiry(keep_ns)

    def set_expiry(self, keep_ns):
        self.keep_ns = DEFAULT_KEEP_ALIVE_NS if keep_ns is None else keep_ns
        self.deadline = (
            None if self.keep_ns >= FOREVER_NS else time.monotonic() + self.keep_ns / 1e9
        )

    def expires_at(self):
        """Wall-clock expiry, as /api/ps shows it (now + keep_alive while loading)."""
        if self.loading or self.deadline is None:
            return now_utc() + timedelta(microseconds=self.keep_ns // 1000)
        return now_utc() + timedelta(seconds=max(0.0, self.deadline - time.monotonic()))


# --- the server's state -----------------------------------------------------------------


class Ollama:
    """Pulled models, models in memory, and loads in progress (one lock, one condition)."""

    def __init__(
        self,
        models,
        *,
        load_seconds,
        fail_load,
        resident,
        size,
        version,
        loaded_size=None,
        fail_completions=False,
        ps_hides_loading=False,
    ):
        self.cond = threading.Condition()
        self.load_seconds, self.size, self.version = load_seconds, size, version
        self.loaded_size = size if loaded_size is None else loaded_size
        self.fail_completions, self.ps_hides_loading = fail_completions, ps_hides_loading
        self.fail_load = {canonical(n) for n in fail_load}
        names = [canonical(n) for n in [*models, *fail_load, *resident]]
        self.pulled = {n: self._pulled_entry(n) for n in names}
        self.runners = {}
        for name in resident:
            runner = Runner(canonical(name), FOREVER_NS)
            runner.loading = False
            self.runners[runner.name] = runner

    def _pulled_entry(self, name):
        return {
            "name": name,
            "model": name,
            "modified_at": rfc3339(datetime(2024, 6, 4, 21, 38, 31, 837530, tzinfo=UTC)),
            "size": self.size,
            "digest": hashlib.sha256(name.encode()).hexdigest(),
            "details": details(),
        }

    def _prune(self):
        """Drop loaded models whose keep_alive ran out (caller holds the lock)."""
        now = time.monotonic()
        for name, r in list(self.runners.items()):
            if not r.loading and r.deadline is not None and now >= r.deadline:
                del self.runners[name]

    def tags(self):
        with self.cond:
            return {"models": list(self.pulled.values())}

    def ps(self):
        with self.cond:
            self._prune()
            runners = [
                r for r in self.runners.values() if not (r.loading and self.ps_hides_loading)
            ]
            entries = [(r.expires_at(), r) for r in runners]
        entries.sort(key=lambda e: e[0], reverse=True)  # as Ollama: latest expiry first
        return {"models": [self._ps_entry(r, at) for at, r in entries]}

    def _ps_entry(self, runner, expires_at):
        pulled = self.pulled[runner.name]
        return {
            "name": runner.name,
            "model": runner.name,
            "size": self.loaded_size,
            "digest": pulled["digest"],
            "details": details(),
            "expires_at": rfc3339(expires_at),
            "size_vram": self.loaded_size,
            "context_length": 2048,
        }

    def pull(self, name):
        """``ollama pull``: the model is on disk from now on (nothing is downloaded)."""
        with self.cond:
            name = canonical(name)
            self.pulled.setdefault(name, self._pulled_entry(name))

    def show(self, name):
        """``/api/show`` of a pulled model (None when it is not pulled)."""
        with self.cond:
            pulled = self.pulled.get(canonical(name))
        if pulled is None:
            return None
        return {
            "modelfile": f'# Modelfile generated by "ollama show"\nFROM {pulled["name"]}\n',
            "parameters": 'stop "</s>"',
            "template": "{{ .Prompt }}",
            "details": details(),
            "model_info": {
                "general.architecture": "llama",
                "general.parameter_count": 1_100_048_384,
                "llama.context_length": 2048,
            },
            "capabilities": ["completion"],
            "modified_at": pulled["modified_at"],
        }

    def is_pulled(self, name):
        with self.cond:
            return canonical(name) in self.pulled

    def acquire(self, name, keep_ns, client_alive):
        """Make sure ``name`` is in memory; blocks while it loads.

        Returns None when it is loaded, else why not (the load failed, or the
        client went away and took the load with it).
        """
        name = canonical(name)
        with self.cond:
            self._prune()
            runner = self.runners.get(name)
            if runner is None or runner.cancelled:
                runner = Runner(name, keep_ns)
                self.runners[name] = runner
                threading.Thread(target=self._load, args=(runner,), daemon=True).start()
            elif runner.loading and keep_ns is not None:
                runner.set_expiry(keep_ns)
            runner.waiters += 1
            try:
                while runner.loading:
                    self.cond.wait(POLL_S)
                    if runner.loading and not client_alive():
                        return self._leave(runner)
            finally:
                runner.waiters -= 1
            return runner.error

    def _leave(self, runner):
        """The client went away while waiting; the last one to leave cancels the load."""
        if runner.waiters == 1:
            runner.cancelled = True
            self.cond.notify_all()
        return CANCELED

    def _load(self, runner):
        with self.cond:
            self.cond.wait_for(lambda: runner.cancelled, timeout=self.load_seconds)
            if runner.cancelled:
                runner.error = CANCELED
            elif runner.name in self.fail_load:
                runner.error = LOAD_ERROR
            runner.loading = False
            if runner.error is not None and self.runners.get(runner.name) is runner:
                del self.runners[runner.name]  # a failed or cancelled load is expired
            self.cond.notify_all()

    def finish(self, name, keep_ns):
        """After a request: keep_alive 0 drops the model, anything else resets its expiry."""
        with self.cond:
            runner = self.runners.get(canonical(name))
            if runner is None or runner.loading:
                return
            if keep_ns == 0:
                del self.runners[runner.name]
            else:
                runner.set_expiry(keep_ns)

    def unload(self, name, client_alive):
        """Drop ``name`` from memory; waits for a load in progress to end first."""
        with self.cond:
            runner = self.runners.get(canonical(name))
            while runner is not None and runner.loading:
                self.cond.wait(POLL_S)
                if not client_alive():
                    return
            if runner is not None and self.runners.get(runner.name) is runner:
                del self.runners[runner.name]


# --- HTTP -------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: Ollama

    def log_message(self, *args):
        pass

    # answers

    def reply(self, status, body, ctype="application/json; charset=utf-8"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:  # the client is gone (a cancelled load): nobody to tell
            self.close_connection = True

    def error(self, status, message):
        self.reply(status, {"error": message})

    def stream(self, objects):
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for obj in objects:
            line = json.dumps(obj).encode() + b"\n"
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def client_alive(self):
        """False once the client closed its end (a cancelled request, as Go's ctx sees it)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return not readable or self.connection.recv(1, socket.MSG_PEEK) != b""
        except OSError:
            return False

    # routes

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        routes = {
            "/": lambda: self.reply(200, "Ollama is running", "text/plain; charset=utf-8"),
            "/api/version": lambda: self.reply(200, {"version": self.state.version}),
            "/api/tags": lambda: self.reply(200, self.state.tags()),
            "/api/ps": lambda: self.reply(200, self.state.ps()),
            "/v1/models": lambda: self.reply(200, self.openai_models()),
        }
        routes.get(self.path, self.not_found)()

    def do_POST(self):
        routes = {
            "/api/generate": self.generate,
            "/api/chat": self.chat,
            "/api/show": self.show,
            "/api/embed": self.embed,
            "/api/pull": self.pull,
            "/v1/completions": self.openai_completion,
            "/v1/chat/completions": self.openai_chat,
        }
        handler = routes.get(self.path)
        if handler is None:
            self.drain()
            return self.not_found()
        req = self.read_json()
        if req is not None:
            handler(req)

    def not_found(self):
        self.reply(404, "404 page not found", "text/plain")

    def drain(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def read_json(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not raw:
            self.error(400, "missing request body")
            return None
        try:
            req = json.loads(raw)
        except ValueError as e:
            self.error(400, str(e))
            return None
        if not isinstance(req, dict):
            self.error(400, "json: cannot unmarshal into Go value of type api.GenerateRequest")
            return None
        return req

    def generate(self, req):
        self.run(req, has_input=bool(req.get("prompt")), chat=False)

    def chat(self, req):
        self.run(req, has_input=bool(req.get("messages")), chat=True)

    def run(self, req, *, has_input, chat):
        """Load, unload or answer, as GenerateHandler and ChatHandler do."""
        model = req.get("model")
        if not isinstance(model, str) or not model:
            return self.error(400, "model is required")
        try:
            keep_ns = keep_alive_ns(req.get("keep_alive"))
        except ValueError as e:
            return self.error(400, str(e))
        if not self.state.is_pulled(model):
            return self.error(404, f"model '{model}' not found, try pulling it first")
        if not has_input and keep_ns == 0:
            self.state.unload(model, self.client_alive)
            return self.reply(200, self.message(model, chat, "", done=True, reason="unload"))
        failure = self.state.acquire(model, keep_ns, self.client_alive)
        if failure == CANCELED:
            return self.error(499, failure)  # as Ollama's handleScheduleError
        if failure is not None:
            return self.error(500, failure)
        if not has_input:
            self.state.finish(model, keep_ns)
            return self.reply(200, self.message(model, chat, "", done=True, reason="load"))
        if self.state.fail_completions:
            return self.error(500, COMPLETION_ERROR)
        self.answer(req, model, chat)
        self.state.finish(model, keep_ns)

    def show(self, req):
        """``/api/show``: what Ollama knows of a pulled model (404 when it is not pulled)."""
        model = req.get("model") or req.get("name")
        if not isinstance(model, str) or not model:
            return self.error(400, "model is required")
        shown = self.state.show(model)
        if shown is None:
            return self.error(404, f"model '{model}' not found")
        return self.reply(200, shown)

    def embed(self, req):
        """``/api/embed``: one (tiny, deterministic) vector per input; loads the model."""
        model = req.get("model")
        if not isinstance(model, str) or not model:
            return self.error(400, "model is required")
        inputs = req.get("input")
        texts = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return self.error(400, "invalid input type")
        try:
            keep_ns = keep_alive_ns(req.get("keep_alive"))
        except ValueError as e:
            return self.error(400, str(e))
        if not self.state.is_pulled(model):
            return self.error(404, f"model '{model}' not found, try pulling it first")
        failure = self.state.acquire(model, keep_ns, self.client_alive)
        if failure is None and self.state.fail_completions:
            failure = COMPLETION_ERROR
        if failure is not None:
            return self.error(499 if failure == CANCELED else 500, failure)
        self.state.finish(model, keep_ns)
        vectors = [_vector(t) for t in texts]
        return self.reply(
            200,
            {
                "model": model,
                "embeddings": vectors,
                "total_duration": 1_000_000,
                "load_duration": 0,
                "prompt_eval_count": sum(len(t.split()) for t in texts),
            },
        )

    def pull(self, req):
        """``/api/pull``: the model counts as pulled (nothing is downloaded)."""
        model = req.get("model") or req.get("name")
        if not isinstance(model, str) or not model:
            return self.error(400, "model is required")
        self.state.pull(model)
        steps = [{"status": "pulling manifest"}, {"status": "writing manifest"}]
        if req.get("stream") is False:
            return self.reply(200, {"status": "success"})
        self.stream([*steps, {"status": "success"}])

    # OpenAI compatibility (docs/openai.md), as Ollama's openai middleware answers

    def openai_error(self, status, message, kind="api_error"):
        self.reply(
            status, {"error": {"message": message, "type": kind, "param": None, "code": None}}
        )

    def openai_models(self):
        with self.state.cond:
            names = list(self.state.pulled)
        created = int(datetime(2024, 6, 4, 21, 38, 31, tzinfo=UTC).timestamp())
        data = [
            {"id": n, "object": "model", "created": created, "owned_by": "library"} for n in names
        ]
        return {"object": "list", "data": data}

    def openai_completion(self, req):
        self.openai(req, chat=False)

    def openai_chat(self, req):
        self.openai(req, chat=True)

    def openai(self, req, *, chat):
        model = req.get("model")
        if not isinstance(model, str) or not model:
            return self.openai_error(400, "model is required", "invalid_request_error")
        if chat and not isinstance(req.get("messages"), list):
            return self.openai_error(400, "[] is too short - 'messages'", "invalid_request_error")
        if not self.state.is_pulled(model):
            return self.openai_error(404, f'model "{model}" not found, try pulling it first')
        failure = self.state.acquire(model, None, self.client_alive)
        if failure is None and self.state.fail_completions:
            failure = COMPLETION_ERROR
        if failure is not None:
            return self.openai_error(500, failure)
        self.state.finish(model, None)
        pieces = ["Hello", " from", " ollama_server."]
        limit = req.get("max_tokens")
        if isinstance(limit, int) and limit > 0:
            pieces = pieces[:limit]
        finish = "length" if len(pieces) < 3 else "stop"
        text = "".join(pieces)
        created = int(time.time())
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{created % 1000}"
        kind = "chat.completion" if chat else "text_completion"
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"text": text, "index": 0}
        choice["finish_reason"] = finish
        usage = {
            "prompt_tokens": 1,
            "completion_tokens": len(pieces),
            "total_tokens": 1 + len(pieces),
        }
        body = {
            "id": ident,
            "object": kind,
            "created": created,
            "model": model,
            "system_fingerprint": "fp_ollama",
            "choices": [choice],
            "usage": usage,
        }
        if req.get("stream") is not True:
            return self.reply(200, body)
        chunk = dict(body, object="chat.completion.chunk" if chat else "text_completion")
        del chunk["usage"]
        if chat:
            chunk["choices"] = [{"index": 0, "delta": choice["message"], "finish_reason": finish}]
        self.sse([chunk])

    def sse(self, objects):
        """Server-sent events, ending in ``data: [DONE]`` (OpenAI's streaming form)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for data in [*(json.dumps(o) for o in objects), "[DONE]"]:
            line = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def answer(self, req, model, chat):
        """A tiny completion: three pieces, streamed unless ``"stream": false``."""
        pieces = ["Hello", " from", " ollama_server."]
        if req.get("stream") is False:
            return self.reply(200, self.final(model, chat, "".join(pieces), len(pieces)))
        # absent or null streams (Go's *bool nil); the last object's text is empty
        objects = [self.message(model, chat, p, done=False) for p in pieces]
        self.stream([*objects, self.final(model, chat, "", len(pieces))])

    def message(self, model, chat, text, *, done, reason=None):
        out = {"model": model, "created_at": rfc3339(now_utc())}
        if chat:
            out["message"] = {"role": "assistant", "content": text}
        else:
            out["response"] = text
        out["done"] = done
        if reason is not None:
            out["done_reason"] = reason
        return out

    def final(self, model, chat, text, count):
        out = self.message(model, chat, text, done=True, reason="stop")
        out.update(
            total_duration=1_000_000,
            load_duration=0,
            prompt_eval_count=1,
            prompt_eval_duration=100_000,
            eval_count=count,
            eval_duration=900_000,
        )
        if not chat:
            out["context"] = [1, 2, 3]
        return out


def _vector(text, dims=8):
    """A deterministic unit-length vector for ``text``."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [b - 127.5 for b in digest[:dims]]
    norm = sum(x * x for x in raw) ** 0.5 or 1.0
    return [x / norm for x in raw]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: the kernel picks one")
    ap.add_argument("--models", default="", help="pulled models, comma separated")
    ap.add_argument("--load-seconds", type=float, default=0.5)
    ap.add_argument("--fail-load", action="append", default=[], metavar="NAME")
    ap.add_argument("--resident", action="append", default=[], metavar="NAME")
    ap.add_argument("--model-size", type=int, default=637_700_138, metavar="BYTES")
    ap.add_argument("--loaded-size", type=int, default=None, metavar="BYTES")
    ap.add_argument("--fail-completions", action="store_true")
    ap.add_argument("--ps-hides-loading", action="store_true")
    ap.add_argument("--version", default="0.6.8")
    args = ap.parse_args()
    Handler.state = Ollama(
        [m for m in args.models.split(",") if m],
        load_seconds=args.load_seconds,
        fail_load=args.fail_load,
        resident=args.resident,
        size=args.model_size,
        version=args.version,
        loaded_size=args.loaded_size,
        fail_completions=args.fail_completions,
        ps_hides_loading=args.ps_hides_loading,
    )
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
