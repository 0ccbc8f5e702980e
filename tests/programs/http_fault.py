"""A fault-injecting model server: answers /health (and a few more paths) per --mode.

Prints "PORT <n>" on stdout once listening on 127.0.0.1 (port 0: the kernel picks).

Modes:
  ok                 /health 200 {"status":"ok"}; /v1/models {"data":[{"id":"tiny"}]}
  ok-legacy-models   as ok, but /v1/models answers llama.cpp's {"models":[{"name":...}]}
  models-garbage     as ok, but /v1/models answers garbage
  loading-nested     /health 503 {"error":{"code":503,"message":"Loading model",...}}
  loading-flat       /health 503 {"status":"loading model"}
  500                /health 500 with a short text body
  garbage            /health 200 with bytes that are not JSON
  huge               /health 200 with a 32 MiB body; GET /stats tells how much was sent
  hang               accepts the request and never answers
  ollama             /api/version, /api/tags, /api/ps like Ollama
"""

import argparse
import json

from fault_common import NEVER, JsonHandler, listen

HUGE = 32 * 1024 * 1024
STATS = {"sent": 0, "done": False}


class Handler(JsonHandler):
    mode = "ok"

    def huge(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(HUGE))
        self.end_headers()
        chunk = b"x" * 65536
        try:
            while STATS["sent"] < HUGE:
                self.wfile.write(chunk)
                STATS["sent"] += len(chunk)
        except OSError:
            pass
        STATS["done"] = True

    def do_GET(self):  # noqa: N802 - the name http.server calls
        mode, path = self.mode, self.path
        if path == "/stats":
            return self.reply(200, STATS)
        if mode == "hang":
            NEVER.wait()
        if mode == "ollama":
            return self.ollama(path)
        if path == "/health":
            return self.health(mode)
        if path == "/v1/models":
            if mode == "ok-legacy-models":
                return self.reply(200, {"models": [{"name": "tiny.gguf", "model": "tiny.gguf"}]})
            if mode == "models-garbage":
                return self.reply(200, b"\x00\xffnot json", "text/plain")
            return self.reply(200, {"object": "list", "data": [{"id": "tiny"}, {"id": "other"}]})
        return self.reply(404, {"error": "not found"})

    def health(self, mode):
        if mode == "loading-nested":
            err = {"code": 503, "message": "Loading model", "type": "unavailable_error"}
            return self.reply(503, {"error": err})
        if mode == "loading-flat":
            return self.reply(503, {"status": "loading model"})
        if mode == "500":
            return self.reply(500, b"internal trouble: the GPU caught fire", "text/plain")
        if mode == "garbage":
            return self.reply(200, b"\xff\xfe<html>garbage", "text/html")
        if mode == "huge":
            return self.huge()
        return self.reply(200, {"status": "ok"})

    def ollama(self, path):
        if path == "/api/version":
            return self.reply(200, {"version": "0.5.7"})
        if path == "/api/tags":
            return self.reply(
                200, {"models": [{"name": "llama3:latest", "model": "llama3:latest"}]}
            )
        if path == "/api/ps":
            return self.reply(
                200, {"models": [{"name": "llama3:latest", "model": "llama3:latest"}]}
            )
        return self.reply(404, {"error": "not found"})

    def do_POST(self):  # noqa: N802 - the name http.server calls
        if self.mode == "hang":
            NEVER.wait()
        if self.path != "/v1/completions":
            return self.reply(404, {"error": "not found"})
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.mode == "garbage":
            return self.reply(200, {"choices": []})
        text = "!" * int(req.get("max_tokens", 1))
        return self.reply(200, {"choices": [{"text": text, "index": 0}], "model": req.get("model")})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="ok")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    Handler.mode = args.mode
    server = listen("127.0.0.1", args.port, Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
